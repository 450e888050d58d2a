"""Helpers for integration tests that run Jobs through the real Job controller.

``python_job(name, code, **spec)`` -> a Job manifest whose single container runs
``sys.executable -c code`` (``backoffLimit: 0``, ``restartPolicy: Never``; ``env``,
``service_account``, ``grace`` and ``container`` (extra container fields) are keywords,
anything else goes into the Job spec).

``wait_job(namespace, name, timeout=120)`` -> ``(condition_type, reason, job)`` once the Job
is Complete or Failed.

``job_pods(namespace, job_name)`` -> the Job's pods.

``controller_rbac`` (session): the controller's ServiceAccount and RBAC, for tests that run
the real controller (tests/helpers/controller_harness.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from helpers.controller_harness import install_controller_rbac

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import JOBS, PODS, Kube

JSON = dict[str, Any]


def build_python_job(
    name: str,
    code: str,
    *,
    env: list[JSON] | None = None,
    service_account: str | None = None,
    grace: int | None = None,
    container: JSON | None = None,
    **spec: Any,
) -> JSON:
    main: JSON = {
        "name": "main",
        "image": "python:3.11",
        "command": [sys.executable, "-c", code],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **(container or {}),
    }
    if env:
        main["env"] = env
    pod_spec: JSON = {"restartPolicy": "Never", "containers": [main]}
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if grace is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, **spec, "template": {"spec": pod_spec}},
    }


@pytest.fixture
def python_job() -> Callable[..., JSON]:
    return build_python_job


def finished_condition(job: JSON) -> tuple[str, str] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"]), str(condition.get("reason", ""))
    return None


@pytest.fixture
def wait_job(kube: Kube) -> Callable[..., tuple[str, str, JSON]]:
    def wait(namespace: str, name: str, timeout: float = 120.0) -> tuple[str, str, JSON]:
        found: list[JSON] = []

        def finished() -> bool:
            job = kube.get(JOBS, name, namespace)
            found[:] = [job]
            return finished_condition(job) is not None

        wait_until(finished, timeout=timeout, what=f"Job {namespace}/{name} to finish")
        condition = finished_condition(found[0])
        assert condition is not None
        return condition[0], condition[1], found[0]

    return wait


@pytest.fixture
def job_pods(kube: Kube) -> Callable[[str, str], list[JSON]]:
    def pods(namespace: str, job_name: str) -> list[JSON]:
        return kube.list_objects(PODS, namespace, label_selector=f"job-name={job_name}")[0]

    return pods


@pytest.fixture(scope="session")
def controller_rbac(cluster: Any) -> None:
    """The controller's ServiceAccount with the RBAC of deploy/kustomize/base
    (``controller_harness.install_controller_rbac``), for tests running the real controller."""
    install_controller_rbac(cluster.kube)
