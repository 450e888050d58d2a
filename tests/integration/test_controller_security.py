"""No privilege escalation through a Stack, on the real control plane.

The controller runs under its own ServiceAccount with the RBAC of deploy/kustomize/base
(tests/helpers/controller_harness.py). A Stack whose templates would give its run a pod beyond the
Pod Security level, or another ServiceAccount, never gets a Job: the API server refuses the
ServiceAccount forms at admission (CEL), the controller marks the others
``Stalled``/``SpecInvalid`` naming the field and the level. And pkobatch's Pod Security
check agrees with the API server's own Pod Security admission on every probe pod.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    wait_stack,
)
from helpers.pod_security_probes import CASES, OK

from pkobatch.api.constants import STACK_LABEL
from pkobatch.api.pod_security import LEVELS, Level, check_pod
from pkobatch.kube.client import JOBS, NAMESPACES, PODS, Kube, KubeError

JSON = dict[str, Any]

PRIVILEGED_CONTAINER = {"name": "pulumi", "securityContext": {"privileged": True}}
# Stack name -> (spec fields, the pod field the refusal must name).
ESCALATIONS: dict[str, tuple[JSON, str]] = {
    "host-pid": ({"jobTemplate": {"spec": {"hostPID": True}}}, "spec.hostPID"),
    "host-network": ({"jobTemplate": {"spec": {"hostNetwork": True}}}, "spec.hostNetwork"),
    "host-ipc": ({"jobTemplate": {"spec": {"hostIPC": True}}}, "spec.hostIPC"),
    "host-path": (
        {
            "workspaceTemplate": {
                "spec": {
                    "podTemplate": {
                        "spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
                    }
                }
            }
        },
        "spec.volumes[root].hostPath",
    ),
    "privileged": (
        {"jobTemplate": {"spec": {"containers": [PRIVILEGED_CONTAINER]}}},
        "spec.containers[pulumi].securityContext.privileged",
    ),
    "capabilities": (
        {
            "workspaceTemplate": {
                "spec": {
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "securityContext": {
                                        "capabilities": {"add": ["SYS_ADMIN", "NET_RAW"]}
                                    },
                                }
                            ]
                        }
                    }
                }
            }
        },
        "spec.containers[pulumi].securityContext.capabilities.add",
    ),
    "init-container": (
        {
            "jobTemplate": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "escape",
                            "image": "busybox",
                            "securityContext": {"privileged": True},
                        }
                    ]
                }
            }
        },
        "spec.initContainers[escape].securityContext.privileged",
    ),
}


def start_controller(cluster: Any, namespace: str, work_dir: Path, **env: str) -> ControllerProcess:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, work_dir, env=env)
    process.start()
    return process


@pytest.fixture
def controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[ControllerProcess]:
    process = start_controller(cluster, namespace, tmp_path / "controller")
    yield process
    process.stop()


def spec_invalid(stack: JSON) -> bool:
    return condition(stack, "Stalled").get("reason") == "SpecInvalid"


def jobs_of(kube: Kube, namespace: str, name: str) -> list[JSON]:
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}={name}")
    return jobs


def test_escalating_stacks_never_get_a_job(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    for name, (spec, _) in ESCALATIONS.items():
        apply_stack(kube, namespace, name, {"stack": "dev", **spec})
    # A Stack without a source runs at once: the control that the others were refused.
    apply_stack(kube, namespace, "plain", {"stack": "dev"})
    for name, (_, field) in ESCALATIONS.items():
        stack = wait_stack(kube, namespace, name, spec_invalid, timeout=120)
        message = condition(stack, "Stalled")["message"]
        assert f"pod {field}" in message, message
        assert "Pod Security level 'baseline'" in message
        assert "PKOBATCH_JOB__POD_SECURITY_LEVEL" in message
        assert "currentUpdate" not in stack["status"]
    wait_stack(kube, namespace, "plain", lambda s: bool(jobs_of(kube, namespace, "plain")))
    time.sleep(3)  # more reconciles of the refused Stacks (the poll interval is 2 s)
    for name in ESCALATIONS:
        assert jobs_of(kube, namespace, name) == [], name
    pods, _ = kube.list_objects(PODS, namespace)
    assert not [p for p in pods if (p["spec"].get("hostPID") or p["spec"].get("hostNetwork"))]


def test_a_fixed_stack_runs(controller: ControllerProcess, kube: Kube, namespace: str) -> None:
    apply_stack(
        kube, namespace, "fixed", {"stack": "dev", "jobTemplate": {"spec": {"hostPID": True}}}
    )
    wait_stack(kube, namespace, "fixed", spec_invalid, timeout=120)
    compliant = {"spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]}}
    apply_stack(kube, namespace, "fixed", {"stack": "dev", "jobTemplate": compliant})
    wait_stack(kube, namespace, "fixed", lambda s: bool(jobs_of(kube, namespace, "fixed")))
    job = jobs_of(kube, namespace, "fixed")[0]
    assert job["spec"]["template"]["spec"]["volumes"] == [
        {"name": "scratch", "emptyDir": {}},
        {"name": "share", "emptyDir": {}},  # PKO's share volume ($PULUMI_ENV)
    ]


def test_restricted_level_refuses_root(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path, controller_rbac: None
) -> None:
    process = start_controller(
        cluster, namespace, tmp_path / "controller", PKOBATCH_JOB__POD_SECURITY_LEVEL="restricted"
    )
    try:
        root = {"securityContext": {"runAsUser": 0}}
        apply_stack(kube, namespace, "root", {"stack": "dev", "jobTemplate": {"spec": root}})
        apply_stack(kube, namespace, "plain", {"stack": "dev"})
        stack = wait_stack(kube, namespace, "root", spec_invalid, timeout=120)
        message = condition(stack, "Stalled")["message"]
        assert "pod spec.securityContext.runAsUser" in message
        assert "Pod Security level 'restricted'" in message
        # pkobatch's own pod meets restricted: a plain Stack runs.
        wait_stack(kube, namespace, "plain", lambda s: bool(jobs_of(kube, namespace, "plain")))
        assert jobs_of(kube, namespace, "root") == []
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"jobTemplate": {"spec": {"serviceAccountName": "admin"}}}, "jobTemplate.spec"),
        ({"jobTemplate": {"spec": {"serviceAccount": "admin"}}}, "jobTemplate.spec"),
        (
            {
                "serviceAccountName": "mine",
                "workspaceTemplate": {
                    "spec": {"podTemplate": {"spec": {"serviceAccountName": "admin"}}}
                },
            },
            "workspaceTemplate.spec.podTemplate.spec",
        ),
        (
            {"jobTemplate": {"spec": {"automountServiceAccountToken": False}}},
            "jobTemplate.spec",
        ),
    ],
)
def test_templates_cannot_change_the_service_account_at_admission(
    kube: Kube, namespace: str, spec: JSON, field: str
) -> None:
    with pytest.raises(KubeError) as refused:
        apply_stack(kube, namespace, "sa", {"stack": "dev", **spec})
    assert refused.value.status == 422
    assert f"spec.{field}." in str(refused.value)


def test_templates_may_repeat_the_stacks_service_account_at_admission(
    kube: Kube, namespace: str
) -> None:
    spec = {
        "stack": "dev",
        "serviceAccountName": "mine",
        "jobTemplate": {"spec": {"serviceAccountName": "mine", "tolerations": []}},
        "workspaceTemplate": {"spec": {"podTemplate": {"spec": {"serviceAccount": "mine"}}}},
    }
    created = apply_stack(kube, namespace, "sa", spec)
    # Declaring the three fields kept every other template field.
    assert created["spec"]["jobTemplate"]["spec"]["tolerations"] == []


# -- the check agrees with the API server's Pod Security admission ----------------------------

PROBE_IMAGE = "registry.invalid/probe:1"


def probe_pods() -> list[tuple[str, JSON, JSON]]:
    """(id, metadata, pod spec): the probes of the unit tests, as full pods."""
    pods = [("restricted-ok", {}, OK), ("minimal", {}, {"containers": [{"name": "c"}]})]
    pods += [(case, metadata, spec) for case, _, metadata, spec, _ in CASES]
    return pods


def full_pod(name: str, metadata: JSON, spec: JSON) -> JSON:
    spec = copy.deepcopy(spec)
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            container.setdefault("image", PROBE_IMAGE)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": spec,
    }


@pytest.mark.parametrize("level", LEVELS)
def test_the_check_agrees_with_pod_security_admission(kube: Kube, level: Level) -> None:
    name = f"t-pss-{level}-{time.monotonic_ns() % 10**8}"
    labels = {"pod-security.kubernetes.io/enforce": level}
    kube.create(
        NAMESPACES,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
    )
    try:
        disagreements = []
        invalid: list[str] = []
        compared = 0
        for index, (case, metadata, spec) in enumerate(probe_pods()):
            pod = full_pod(f"probe-{index}", metadata, spec)
            ours = check_pod(metadata, spec, level)
            try:
                kube.apply(PODS, pod, field_manager="pkobatch-tests", namespace=name, dry_run=True)
                admitted = True
            except KubeError as exc:
                if "violates PodSecurity" not in str(exc):
                    # Not a valid pod at all (e.g. a Windows-only field on a Linux pod):
                    # validation runs before admission, so there is nothing to compare.
                    invalid.append(case)
                    continue
                admitted = False
            compared += 1
            if admitted != (ours == []):
                disagreements.append((case, admitted, [str(v) for v in ours]))
        assert disagreements == []
        # Pods no API server accepts: hostProcess needs a Windows host-network pod, and
        # procMount Unmasked needs hostUsers: false (which the baseline then allows).
        assert set(invalid) == {"host-process-pod", "host-process-container", "proc-mount"}
        assert compared == len(probe_pods()) - len(invalid)
    finally:
        kube.delete(NAMESPACES, name)
