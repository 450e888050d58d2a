"""PKO's Workspace and Update template fields on the real control plane: what maps onto a
Job reaches the Job the API server stores and the pod the Job controller makes of it; what
cannot apply is named in the Stack's SpecNotes Event.

The node agent ignores security contexts (DESIGN §5), so this proves what the pod is given,
not what a kubelet enforces.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import ControllerProcess, apply_stack, bind_runner, wait_events

from pkobatch.api.constants import STACK_LABEL
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import JOBS, PODS, Kube

JSON = dict[str, Any]


@pytest.fixture
def controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[ControllerProcess]:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, tmp_path / "controller")
    process.start()
    yield process
    process.stop()


def test_template_fields_reach_the_job_and_service_template_is_reported(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    spec = {
        "stack": "dev",
        "workspaceTemplate": {
            "metadata": {
                "labels": {"azure.workload.identity/use": "true"},
                "annotations": {"team.example.com/owner": "infra"},
            },
            "spec": {
                "securityProfile": "baseline",
                "serviceTemplate": {"metadata": {"labels": {"exposed": "no"}}},
            },
        },
        "updateTemplate": {
            "metadata": {"labels": {"run-kind": "pulumi"}},
            "spec": {"ttlAfterCompleted": "2h"},
        },
    }
    apply_stack(kube, namespace, "templated", spec)

    def jobs() -> list[JSON]:
        found, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}=templated")
        return found

    wait_until(lambda: bool(jobs()), timeout=90, what="the Stack's Job")
    job = jobs()[0]
    assert job["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert job["metadata"]["labels"]["run-kind"] == "pulumi"
    assert job["metadata"]["annotations"]["team.example.com/owner"] == "infra"
    assert job["spec"]["ttlSecondsAfterFinished"] == 7200
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (runner,) = [c for c in pod_spec["containers"] if c["name"] == "pulumi"]
    assert "securityContext" not in runner

    def pods() -> list[JSON]:
        found, _ = kube.list_objects(
            PODS, namespace, label_selector=f"job-name={job['metadata']['name']}"
        )
        return found

    wait_until(lambda: bool(pods()), timeout=90, what="the Job's pod")
    pod = pods()[0]
    # As in PKO, whose workspace pod does not get workspaceTemplate.metadata.
    assert "azure.workload.identity/use" not in pod["metadata"]["labels"]
    assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}

    (note,) = wait_events(
        kube,
        namespace,
        lambda e: e["reason"] == "SpecNotes" and e["regarding"]["name"] == "templated",
        timeout=60,
        what="the SpecNotes Event",
    )
    assert note["type"] == "Normal"
    assert note["note"].startswith("spec.workspaceTemplate.spec.serviceTemplate is ignored: ")
    for honoured in ("metadata", "securityProfile", "ttlAfterCompleted"):
        assert honoured not in note["note"]
