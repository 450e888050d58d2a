"""The Actor's reading of the real API server's refusals: a Job create is told apart by the
Status's typed error and its ``details.causes`` (reason and field), never by message text."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from pkobatch.controller.act import Actor, JobRejected, NamespaceTerminating
from pkobatch.controller.events import EventRecorder
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, JOBS, NAMESPACES, Invalid, Kube, NotFound

JSON = dict[str, Any]
HOLD = "pkobatch.io/test-hold"


def job(namespace: str, container_name: str = "main") -> JSON:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "app-up-1", "namespace": namespace},
        "spec": {
            "suspend": True,  # never runs: only the create matters here
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": container_name, "image": "none"}],
                }
            },
        },
    }


def test_an_invalid_job_is_rejected_by_its_field_cause(kube: Kube, namespace: str) -> None:
    bad = job(namespace, container_name="Not_A_DNS_Label")
    with pytest.raises(Invalid) as raised:
        kube.create(JOBS, bad, namespace)
    assert raised.value.has_cause("FieldValueInvalid", "spec.template.spec.containers[0].name")
    with pytest.raises(JobRejected, match="Not_A_DNS_Label"):
        Actor(kube, EventRecorder(kube)).create_job(bad)


def test_a_job_in_a_terminating_namespace_is_told_apart_by_its_cause(
    kube: Kube, namespace: str
) -> None:
    # A finalizer on an object inside keeps the deleted namespace Terminating.
    held: JSON = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": [HOLD]},
    }
    kube.create(CONFIGMAPS, held, namespace)
    kube.delete(NAMESPACES, namespace)
    try:
        wait_until(
            lambda: (
                (kube.get(NAMESPACES, namespace).get("status") or {}).get("phase") == "Terminating"
            ),
            timeout=30,
            what=f"namespace {namespace} terminating",
        )
        with pytest.raises(NamespaceTerminating):
            Actor(kube, EventRecorder(kube)).create_job(job(namespace))
    finally:
        with contextlib.suppress(NotFound):
            kube.merge_patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, namespace)
        wait_until(
            lambda: kube.get_or_none(NAMESPACES, namespace) is None,
            timeout=120,
            what=f"namespace {namespace} gone",
        )
