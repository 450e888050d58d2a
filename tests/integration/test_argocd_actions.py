"""Argo CD resource actions for Stacks (deploy/argocd, docs/gitops.md), run as Argo CD runs
them (tests/helpers/health_checks.py) on Stacks read from the real API server.

Each action must send exactly the merge patch the pkobatch command of the same name writes
(``pkobatch.cli.requests``' patch builders, so the two cannot drift) with values the
controller accepts (``api.annotations``' rules), refuse what that command refuses, and the
patch must apply to the real Stack. The argocd-cm snippet is
installed with the command docs/gitops.md gives, with the real kubectl.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lupa.lua51
import pytest
import yaml
from helpers.health_checks import ArgoCDActions

from pkobatch.api.annotations import RULE_OF
from pkobatch.api.constants import (
    APPROVE_ANNOTATION,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REJECT_ANNOTATION,
)
from pkobatch.api.operation_request import request_value, split_request
from pkobatch.cli.requests import annotation_patch, new_token, resume_patch, suspend_patch
from pkobatch.kube.client import CONFIGMAPS, STACKS, Kube

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
SNIPPET = ROOT / "deploy" / "argocd" / "argocd-cm-stack-actions.yaml"
# Argo CD's argocd-cm key for the actions of a kind: <group>_<kind>.
ACTIONS_KEY = f"resource.customizations.actions.{STACKS.group}_{STACKS.kind}"
ALL_ACTIONS = {
    "reconcile",
    "up",
    "preview",
    "refresh",
    "destroy",
    "approve",
    "reject",
    "suspend",
    "resume",
}
PLAN = "plan-3f9a1c0d5e7b2a4c6d8e"
SECOND_TOKEN = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@pytest.fixture(scope="module")
def actions() -> ArgoCDActions:
    configmap = yaml.safe_load(SNIPPET.read_text())
    return ArgoCDActions(configmap["data"][ACTIONS_KEY])


@pytest.fixture
def make_stack(kube: Kube, namespace: str) -> Callable[..., JSON]:
    """A Stack as the API server returns it (managedFields and all)."""

    def make(name: str, status: JSON | None = None, **spec: Any) -> JSON:
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "annotations": {"team": "a"}},
            "spec": {"stack": f"org/p/{name}", **spec},
        }
        kube.create(STACKS, body, namespace)
        if status:
            kube.merge_patch(STACKS, name, {"status": status}, namespace, subresource="status")
        return kube.get(STACKS, name, namespace)

    return make


def checked_token(token: str, before: datetime) -> str:
    """A request token: a whole second in the CLI's format (``new_token``), taken while the
    test ran."""
    assert SECOND_TOKEN.fullmatch(token), token
    moment = datetime.strptime(token, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before.replace(microsecond=0) <= moment <= datetime.now(UTC)
    assert new_token(int(moment.timestamp()) * 1_000_000_000) == token
    return token


def accepted(patch: JSON) -> JSON:
    """``patch``, after checking the controller acts on each annotation it writes."""
    for key, value in ((patch.get("metadata") or {}).get("annotations") or {}).items():
        assert RULE_OF[key].problem(value) is None, (key, value)
    return patch


def test_the_snippet_holds_every_action(actions: ArgoCDActions) -> None:
    assert set(actions.definitions) == ALL_ACTIONS


def test_discovery_offers_what_the_stack_allows(
    actions: ArgoCDActions, make_stack: Callable[..., JSON]
) -> None:
    plain = make_stack("plain")
    suspended = make_stack("paused", suspend=True)
    awaiting = make_stack(
        "gated",
        approval={"required": True},
        status={"approval": {"planID": PLAN, "state": "Pending"}},
    )

    operations = {"up", "preview", "refresh", "destroy"}
    assert {n for n, on in actions.available(plain).items() if on} == {
        *operations,
        "reconcile",
        "suspend",
    }
    assert {n for n, on in actions.available(suspended).items() if on} == {*operations, "resume"}
    assert {n for n, on in actions.available(awaiting).items() if on} == {
        *operations,
        "reconcile",
        "suspend",
        "approve",
        "reject",
    }
    assert set(actions.available(plain)) == ALL_ACTIONS


@pytest.mark.parametrize("operation", ["up", "preview", "refresh", "destroy"])
def test_operations_write_what_the_cli_writes(
    actions: ArgoCDActions,
    make_stack: Callable[..., JSON],
    kube: Kube,
    namespace: str,
    operation: str,
) -> None:
    stack = make_stack("web")
    before = datetime.now(UTC)

    patch = accepted(actions.patch(operation, stack))

    value = patch["metadata"]["annotations"][OPERATION_REQUEST_ANNOTATION]
    token = checked_token(split_request(value)[1], before)
    assert patch == annotation_patch(OPERATION_REQUEST_ANNOTATION, request_value(operation, token))
    applied = kube.merge_patch(STACKS, "web", patch, namespace)
    assert applied["metadata"]["annotations"] == {"team": "a", OPERATION_REQUEST_ANNOTATION: value}


def test_reconcile_suspend_and_resume_write_what_the_cli_writes(
    actions: ArgoCDActions, make_stack: Callable[..., JSON], kube: Kube, namespace: str
) -> None:
    stack = make_stack("web")
    before = datetime.now(UTC)

    reconcile = accepted(actions.patch("reconcile", stack))
    token = checked_token(
        reconcile["metadata"]["annotations"][RECONCILE_REQUEST_ANNOTATION], before
    )
    assert reconcile == annotation_patch(RECONCILE_REQUEST_ANNOTATION, token)

    suspend = actions.patch("suspend", stack)
    assert suspend == suspend_patch(True)
    suspended = kube.merge_patch(STACKS, "web", suspend, namespace)
    assert suspended["spec"]["suspend"] is True

    resume = accepted(actions.patch("resume", suspended))
    token = checked_token(resume["metadata"]["annotations"][RECONCILE_REQUEST_ANNOTATION], before)
    assert resume == resume_patch(token)
    resumed = kube.merge_patch(STACKS, "web", resume, namespace)
    assert resumed["spec"]["suspend"] is False
    assert resumed["metadata"]["annotations"][RECONCILE_REQUEST_ANNOTATION] == token


def test_approve_and_reject_name_the_pending_plan(
    actions: ArgoCDActions, make_stack: Callable[..., JSON]
) -> None:
    stack = make_stack(
        "gated",
        approval={"required": True},
        status={"approval": {"planID": PLAN, "state": "Pending"}},
    )

    assert accepted(actions.patch("approve", stack)) == annotation_patch(APPROVE_ANNOTATION, PLAN)
    assert accepted(actions.patch("reject", stack)) == annotation_patch(REJECT_ANNOTATION, PLAN)


def test_actions_refuse_what_the_cli_refuses(
    actions: ArgoCDActions, make_stack: Callable[..., JSON]
) -> None:
    suspended = make_stack("paused", suspend=True)
    ungated = make_stack("plain")
    applied = make_stack(
        "gated",
        approval={"required": True},
        status={"approval": {"planID": PLAN, "state": "Applied"}},
    )

    with pytest.raises(lupa.lua51.LuaError, match="stack paused is suspended: resume it first"):
        actions.result("reconcile", suspended)
    for action in ("approve", "reject"):
        with pytest.raises(lupa.lua51.LuaError, match="does not require approval"):
            actions.result(action, ungated)
        with pytest.raises(lupa.lua51.LuaError, match="has no plan awaiting approval"):
            actions.result(action, applied)


def test_the_install_command_of_docs_gitops_md_merges_into_argocd_cm(
    cluster: Any, kube: Kube, namespace: str
) -> None:
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argocd-cm"},
            "data": {"url": "https://argocd.example"},
        },
        namespace,
    )
    docs = (ROOT / "docs" / "gitops.md").read_text()
    (command,) = [
        line.strip() for line in docs.splitlines() if line.strip().startswith("kubectl -n argocd")
    ]
    argv = command.split()
    argv[2] = namespace  # the test's namespace stands in for argocd

    kubectl = str(Path(sys.executable).parent / argv[0])

    done = subprocess.run(
        [kubectl, *argv[1:], "--kubeconfig", str(cluster.kubeconfig)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    data = kube.get(CONFIGMAPS, "argocd-cm", namespace)["data"]
    assert data["url"] == "https://argocd.example"
    assert data[ACTIONS_KEY] == yaml.safe_load(SNIPPET.read_text())["data"][ACTIONS_KEY]
