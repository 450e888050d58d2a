"""How Argo CD and Flux read a Stack's health, in every state pkobatch produces.

The Stacks are taken from the live control plane while the real controller runs them with
the real Pulumi CLI; their health is computed by Argo CD's own health check for
``pulumi.com/Stack`` (its Lua script, in Lua 5.1) and by kstatus (sigs.k8s.io/cli-utils,
what Flux's ``healthChecks`` use) — see tests/helpers/health_checks.py. docs/gitops.md tells users
the same table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    last_update,
    ready,
    stack_spec,
    wait_stack,
)
from helpers.health_checks import ArgoCDHealth, KStatus, argocd_test_cases
from test_controller_runs import request

from pkobatch.api.constants import FINALIZER
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import Tools
from pkobatch.kube.client import STACKS, Kube

JSON = dict[str, Any]
HOLD = "pkobatch.io/gitops-health-test"

# What each state reads as: (Argo CD health, kstatus status).
EXPECTED: dict[str, tuple[str, str]] = {
    "suspended before any run": ("Degraded", "Failed"),
    "running": ("Progressing", "InProgress"),
    "succeeded": ("Healthy", "Current"),
    "suspended after a success": ("Healthy", "Current"),
    "drifted": ("Healthy", "Current"),
    "destroyed on request": ("Degraded", "Failed"),
    "failing and retrying": ("Progressing", "InProgress"),
    "stalled": ("Degraded", "Failed"),
    "deleting": ("Progressing", "Terminating"),
}


def test_argocd_script_runs_as_argocd_runs_it(health_tools: Tools) -> None:
    # Argo CD's own cases for the script (health_test.yaml): the harness reads them alike.
    argocd = ArgoCDHealth(health_tools)
    cases = argocd_test_cases(health_tools)
    assert len(cases) >= 4
    for path, expected in cases:
        assert argocd(yaml.safe_load(path.read_text())) == expected, path.name


def test_every_state_reads_right_in_argocd_and_kstatus(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    health_tools: Tools,
) -> None:
    taken: dict[str, JSON] = {}
    repo = git_repo()

    # Suspended before it ever ran: nothing happens until the user resumes it.
    apply_stack(kube, namespace, "paused", stack_spec(repo, pulumi_env, suspend=True))
    taken["suspended before any run"] = wait_stack(
        kube, namespace, "paused", lambda s: condition(s, "Stalled").get("reason") == "Suspended"
    )

    # Running (a slow update), then succeeded.
    spec = stack_spec(repo, pulumi_env, driftDetection={"schedule": "* * * * *"})
    spec["config"].update({"content": "slow", "sleepSeconds": "8"})
    apply_stack(kube, namespace, "app", spec)
    taken["running"] = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            bool((s.get("status") or {}).get("currentUpdate"))
            and condition(s, "Reconciling").get("status") == "True"
        ),
    )
    taken["succeeded"] = wait_stack(kube, namespace, "app", ready)

    # Suspended after a success, then resumed.
    apply_stack(kube, namespace, "app", {**spec, "suspend": True})
    taken["suspended after a success"] = wait_stack(
        kube, namespace, "app", lambda s: condition(s, "Ready").get("reason") == "Suspended"
    )
    apply_stack(kube, namespace, "app", spec)
    wait_stack(kube, namespace, "app", lambda s: ready(s) and last_update(s).get("generation") == 3)

    # Drifted (detection only): a managed file changed behind Pulumi's back.
    (pulumi_env.files_dir / "file-0.txt").write_text("changed behind Pulumi's back")
    taken["drifted"] = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Drifted").get("status") == "True" and ready(s),
        timeout=240,
    )

    # Destroyed on request: held until the spec changes or an up is requested.
    taken["destroyed on request"] = request(kube, namespace, "destroy:gitops")
    assert condition(taken["destroyed on request"], "Stalled")["reason"] == "DestroyedOnRequest"

    # A program that fails: retried with backoff, then stalled.
    broken = stack_spec(git_repo("syntax-error"), pulumi_env, destroyOnFinalize=True)
    apply_stack(kube, namespace, "app", broken)
    taken["failing and retrying"] = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            condition(s, "Reconciling").get("reason") == "RetryingAfterFailure"
            and last_update(s).get("generation") == s["metadata"]["generation"]
        ),
        timeout=600,
    )
    taken["stalled"] = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Stalled").get("reason") == "UpdateFailed",
        timeout=600,
    )

    # Deleting: its destroy on deletion runs. A finalizer of the test's own keeps the object
    # readable however soon pkobatch releases it.
    kube.merge_patch(STACKS, "app", {"metadata": {"finalizers": [FINALIZER, HOLD]}}, namespace)
    kube.delete(STACKS, "app", namespace)
    taken["deleting"] = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            bool(s["metadata"].get("deletionTimestamp"))
            and condition(s, "Reconciling").get("status") == "True"
        ),
    )

    argocd = ArgoCDHealth(health_tools)
    kstatus = KStatus(health_tools)
    states = list(EXPECTED)
    read = dict(zip(states, kstatus([taken[s] for s in states]), strict=True))
    found = {s: (argocd(taken[s]).status, read[s].status) for s in states}
    assert found == EXPECTED
    for state in states:
        stack = taken[state]
        raised = next(
            c
            for c in stack["status"]["conditions"]
            if c["status"] == "True" and c["type"] in ("Stalled", "Reconciling", "Ready")
        )
        # Argo CD shows the raised condition's message: pkobatch's words reach the user.
        assert argocd(stack).message == raised["message"], state
    assert "drifted" in argocd(taken["drifted"]).message
    assert "suspended" in argocd(taken["suspended before any run"]).message
    assert "destroyed on request" in argocd(taken["destroyed on request"]).message

    # pkobatch destroys and releases the Stack; then the test lets it go.
    wait_stack(
        kube, namespace, "app", lambda s: FINALIZER not in (s["metadata"].get("finalizers") or ())
    )
    kube.merge_patch(STACKS, "app", {"metadata": {"finalizers": None}}, namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "app", namespace) is None,
        timeout=120,
        what="the Stack to be deleted",
    )
