"""The generated Workspace and Update CRDs (PKO's auto.pulumi.com/v1alpha1) on the real API
server: accepted as structural, and PKO-shaped manifests keep every field (nothing pruned),
with PKO's defaults, status subresource and printer columns."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkobatch.api.crd import generate_update_crd, generate_workspace_crd
from pkobatch.kube.client import CRDS, UPDATES, WORKSPACES, Invalid, Kube, Resource

MANIFESTS = Path(__file__).resolve().parents[1] / "fixtures" / "pko" / "workspace-and-update.yaml"
JSON = dict[str, Any]


@pytest.fixture(scope="module")
def auto_crds(cluster: Any) -> None:
    """The cluster has pkobatch's crds/, these two among them: the generated ones, established."""
    for crd in (generate_workspace_crd(), generate_update_crd()):
        installed = cluster.kube.get(CRDS, crd["metadata"]["name"])
        assert installed["spec"]["versions"] == crd["spec"]["versions"]
        conditions = (installed.get("status") or {}).get("conditions") or []
        assert any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def manifests() -> dict[str, JSON]:
    return {o["kind"]: o for o in yaml.safe_load_all(MANIFESTS.read_text())}


def test_pko_shaped_manifests_keep_every_field_with_pkos_defaults(
    kube: Kube, namespace: str, auto_crds: None
) -> None:
    sent = manifests()
    workspace = kube.create(WORKSPACES, copy.deepcopy(sent["Workspace"]), namespace)
    update = kube.create(UPDATES, copy.deepcopy(sent["Update"]), namespace)

    defaulted = {"serviceAccountName": "default", "securityProfile": "restricted"}
    assert workspace["spec"] == {**sent["Workspace"]["spec"], **defaulted}
    assert update["spec"] == sent["Update"]["spec"]


def test_a_field_outside_pkos_schema_is_pruned_and_a_wrong_type_refused(
    kube: Kube, namespace: str, auto_crds: None
) -> None:
    update = manifests()["Update"]
    update["spec"]["notAField"] = True
    created = kube.create(UPDATES, update, namespace)
    assert "notAField" not in created["spec"]

    workspace = manifests()["Workspace"]
    workspace["spec"]["stacks"][0]["create"] = "yes"
    with pytest.raises(Invalid) as raised:
        kube.create(WORKSPACES, workspace, namespace)
    assert "spec.stacks[0].create" in raised.value.message


def test_status_is_a_subresource_and_the_printer_columns_read_it(
    cluster: Any, kube: Kube, namespace: str, auto_crds: None
) -> None:
    update = kube.create(UPDATES, manifests()["Update"], namespace)
    name = update["metadata"]["name"]
    status = {
        "observedGeneration": 1,
        "startTime": "2026-01-02T03:04:05Z",
        "endTime": "2026-01-02T03:05:05Z",
        "message": "update succeeded",
        "outputs": f"{name}-stack-outputs",
        "permalink": "https://app.pulumi.com/o/p/dev/updates/1",
        "projectInfo": {"name": "random-yaml", "runtime": "yaml"},
        "conditions": [
            {
                "type": condition,
                "status": value,
                "reason": reason,
                "message": "",
                "lastTransitionTime": "2026-01-02T03:05:05Z",
            }
            for condition, value, reason in (
                ("Progressing", "False", "Complete"),
                ("Failed", "False", "UpdateSucceeded"),
                ("Complete", "True", "Updated"),
            )
        ],
    }
    kube.merge_patch(UPDATES, name, {"status": status}, namespace, subresource="status")
    # The main resource ignores status; the subresource ignores spec.
    kube.merge_patch(UPDATES, name, {"status": {"message": "ignored"}}, namespace)
    assert kube.get(UPDATES, name, namespace)["status"] == status

    kubectl = [
        str(Path(sys.executable).parent / "kubectl"),
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    shown = subprocess.run(
        [*kubectl, "-n", namespace, "get", "updates", name, "-o", "wide"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    header, row = (re.split(r"\s{2,}", line.strip()) for line in shown)
    assert header == [
        "NAME",
        "WORKSPACE",
        "TYPE",
        "START TIME",
        "END TIME",
        "PROGRESSING",
        "FAILED",
        "COMPLETE",
        "URL",
    ]
    assert row[:3] + row[5:] == [
        name,
        "random-yaml",
        "up",
        "False",
        "False",
        "True",
        status["permalink"],
    ]


def test_the_controller_asks_the_server_whether_it_serves_a_kind(kube: Kube) -> None:
    """What ``build_manager`` asks before watching Workspaces and Updates, whose CRDs an
    upgrade may lack: a kind of a served group, of a group not served, of the core group."""
    assert kube.serves(WORKSPACES) and kube.serves(UPDATES)
    assert kube.serves(Resource("batch", "v1", "jobs", "Job"))
    assert kube.serves(Resource("", "v1", "configmaps", "ConfigMap"))
    assert not kube.serves(Resource("auto.pulumi.com", "v1alpha1", "widgets", "Widget"))
    assert not kube.serves(Resource("absent.example.com", "v1", "widgets", "Widget"))
