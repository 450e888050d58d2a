"""spec.approval end to end: the real controller (under its own ServiceAccount and RBAC),
real Jobs, the real Pulumi CLI saving and applying update plans, and `pkobatch plan /
approve / reject / get` against it. A Secret changed between the preview and the approval
makes Pulumi refuse the plan with an error that prints the plan's secret inputs: the
update is a PlanMismatch, and no secret value reaches a message, Event or notification.

The program (tests/fixtures/programs/k8s-yaml) manages a ConfigMap and a Deployment in the
test's namespace with the Kubernetes provider: the tests look at those objects to prove
nothing changed before an approval. (Not the Python test program: its dynamic provider is
stored pickled with the path of its checkout, which differs from run to run, so its plans
never match — see docs/api.md.)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from click.testing import Result
from fixture_plugins.receivers import Receiver, hook_secret, receivers
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    create_secret,
    last_update,
    ready,
    stack_jobs,
    wait_stack,
)
from helpers.sentinels import find, plant
from test_controller_runs import assert_not_leaked
from test_program_runtimes import APP, PROGRAM_RULES, grant_program_rules, kubernetes_spec

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, DEPLOYMENTS, EVENTS, JOBS, SECRETS, STACKS, Kube
from pkobatch.runner.plans import plan_from_secret

JSON = dict[str, Any]


def approval(stack: JSON) -> JSON:
    return dict((stack.get("status") or {}).get("approval") or {})


def plan_pending(plan_id: str = "") -> Callable[[JSON], bool]:
    """A plan (other than ``plan_id``) awaits approval."""

    def check(stack: JSON) -> bool:
        record = approval(stack)
        return record.get("state") == "Pending" and record.get("planID") != plan_id

    return check


def managed(kube: Kube, namespace: str) -> tuple[str | None, bool]:
    """The program's objects: its ConfigMap's message (None: none) and whether its
    Deployment exists."""
    settings = kube.get_or_none(CONFIGMAPS, f"{APP}-settings", namespace)
    message = None if settings is None else settings["data"]["message"]
    return message, kube.get_or_none(DEPLOYMENTS, APP, namespace) is not None


def test_a_change_waits_for_approval_and_runs_exactly_the_reviewed_plan(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    cli: Callable[..., Result],
    kubernetes_provider: Path,
) -> None:
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    spec = kubernetes_spec(git_repo("k8s-yaml"), pulumi_env, namespace)
    spec["approval"] = {"required": True}
    # A secret config value (a sentinel): its ciphertext is in the plan, its value nowhere.
    spec["secretsRef"] = {"token": {"type": "Secret", "secret": {"name": "pulumi", "key": "token"}}}
    apply_stack(kube, namespace, "app", spec)

    # The first update: a preview saves a plan, and nothing changes.
    stack = wait_stack(kube, namespace, "app", plan_pending(), what="the first plan")
    record = approval(stack)
    assert record["summary"] == "3 to create"
    assert record["planID"].startswith("plan-")
    assert {r["op"] for r in record["resources"]} == {"create"}
    assert managed(kube, namespace) == (None, False)
    assert "lastUpdate" not in stack["status"]
    assert condition(stack, "Ready")["status"] == "False"
    assert condition(stack, "ApprovalPending")["status"] == "True"
    assert record["planID"] in condition(stack, "ApprovalPending")["message"]
    # The plan is in a Secret owned by the preview Job (which has no TTL).
    plan_secret = kube.get(SECRETS, record["planSecret"], namespace)
    preview = kube.get(JOBS, record["previewJob"], namespace)
    assert plan_secret["metadata"]["ownerReferences"][0]["uid"] == preview["metadata"]["uid"]
    assert "ttlSecondsAfterFinished" not in preview["spec"]
    # It holds the secret config value encrypted by the stack's secrets provider, never plain.
    saved = json.loads(plan_from_secret(plan_secret, record["planSecret"]))
    assert "secure" in saved["config"]["pkobatch-test-k8s-yaml:token"]
    assert secrets["pulumi"]["token"] not in json.dumps(saved)

    listed = cli("get")
    assert listed.exit_code == 0, listed.output
    assert "ApprovalPending" in listed.stdout and record["planID"] in listed.stdout
    shown = cli("plan", "app")
    assert shown.exit_code == 0, shown.output
    assert f"plan {record['planID']} for stack app: 3 to create" in shown.stdout
    assert (
        "create: urn:pulumi:dev::pkobatch-test-k8s-yaml::kubernetes:core/v1:ConfigMap::settings"
        in shown.stdout
    )

    approved = cli("approve", "app", "--yes", "--wait")
    assert approved.exit_code == 0, approved.output
    assert approved.stdout.startswith(f"approve succeeded: {namespace}/app")
    stack = wait_stack(kube, namespace, "app", ready)
    record = approval(stack)
    assert record["state"] == "Applied"
    assert record["approvedBy"].startswith("pkobatch-cli:")
    assert record["approvedVia"] == "pkobatch.io/approve"
    assert last_update(stack)["name"] == record["updateJob"]
    assert stack["status"]["outputs"]["message"] == "hello"
    assert managed(kube, namespace) == ("hello", True)
    # The plan was used: its preview Job goes, and the garbage collector takes the Secret.
    wait_until(
        lambda: kube.get_or_none(SECRETS, record["planSecret"], namespace) is None,
        timeout=120,
        what="the used plan's Secret to be deleted",
    )

    # An edit: a new plan; approving a wrong id by spec is ignored, the right one applies.
    first_plan = record["planID"]
    spec["config"]["message"] = "changed"
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", plan_pending(first_plan), what="the new plan")
    plan_id = approval(stack)["planID"]
    assert approval(stack)["summary"] == "2 to replace"  # the provider replaces ConfigMaps
    assert managed(kube, namespace) == ("hello", True)
    spec["approval"] = {"required": True, "approvedPlan": "plan-00000000000000000000"}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            "spec.approval.approvedPlan names plan-00000000000000000000, which is not the "
            "pending plan: ignored" in condition(s, "ApprovalPending").get("message", "")
        ),
        what="the wrong plan id to be reported",
    )
    assert approval(stack)["planID"] == plan_id and approval(stack)["state"] == "Pending"
    assert managed(kube, namespace) == ("hello", True)
    spec["approval"] = {"required": True, "approvedPlan": plan_id}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube, namespace, "app", lambda s: ready(s) and approval(s).get("state") == "Applied"
    )
    assert approval(stack)["approvedVia"] == "spec.approval.approvedPlan"
    assert approval(stack)["approvedBy"] == "pkobatch-cli"  # apply_stack's field manager
    assert stack["status"]["outputs"]["message"] == "changed"
    assert managed(kube, namespace) == ("changed", True)

    # No secret value in a plan summary, status, Event, Job, ConfigMap or log.
    sentinels = [
        secrets["pulumi"]["token"],
        secrets["pulumi"]["passphrase"],
        secrets["git"]["password"],
    ]
    for job in stack_jobs(kube, namespace, "app"):
        assert_not_leaked(cluster, kube, controller, namespace, job["metadata"]["name"], sentinels)


def test_a_stale_plan_is_never_applied_and_a_new_one_is_made(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    cli: Callable[..., Result],
    kubernetes_provider: Path,
) -> None:
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    repo = git_repo("k8s-yaml")
    content = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "content"}}
    kube.create(CONFIGMAPS, {**content, "data": {"message": "reviewed"}}, namespace)
    spec = kubernetes_spec(repo, pulumi_env, namespace, approval={"required": True})
    spec["configRef"] = {"message": {"name": "content", "key": "message"}}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", plan_pending(), what="the first plan")
    reviewed = approval(stack)["planID"]

    # The program's input changes behind the controller's back (a ConfigMap it does not
    # watch): the approved update refuses the stale plan and applies nothing.
    kube.replace(
        CONFIGMAPS,
        {**kube.get(CONFIGMAPS, "content", namespace), "data": {"message": "unreviewed"}},
        namespace,
    )
    approved = cli("approve", "app", "--plan", reviewed, "--yes", "--wait")
    assert approved.exit_code == 1, approved.output
    stack = kube.get(STACKS, "app", namespace)
    assert last_update(stack)["reason"] == "PlanMismatch"
    assert "violates plan" in last_update(stack)["message"]
    assert managed(kube, namespace) == (None, False)
    # ... and a new plan, for what the program would do now, awaits review.
    stack = wait_stack(kube, namespace, "app", plan_pending(reviewed), what="a new plan")
    fresh = approval(stack)["planID"]
    assert managed(kube, namespace) == (None, False)

    # A new commit supersedes the pending plan; approving the superseded id is refused.
    repo.update({"README.md": "a new commit\n"}, "docs")
    stack = wait_stack(kube, namespace, "app", plan_pending(fresh), what="a plan of the commit")
    stale = cli("approve", "app", "--plan", fresh, "--yes")
    assert stale.exit_code == 1 and "not the plan awaiting approval" in stale.output
    assert kube.get_or_none(JOBS, approval(stack)["previewJob"], namespace) is not None

    # Reject discards the plan: nothing runs, its Secret goes.
    current = approval(stack)
    rejected = cli("reject", "app")
    assert rejected.exit_code == 0, rejected.output
    stack = wait_stack(kube, namespace, "app", lambda s: approval(s).get("state") == "Rejected")
    wait_until(
        lambda: kube.get_or_none(SECRETS, current["planSecret"], namespace) is None,
        timeout=120,
        what="the rejected plan's Secret to be deleted",
    )
    assert managed(kube, namespace) == (None, False)
    assert json.dumps(stack["status"]).count(secrets["pulumi"]["passphrase"]) == 0


def with_secret_annotations(repo: Any) -> None:
    """The program's ConfigMap gets three annotations from secret config values."""
    project = yaml.safe_load((repo.worktree / "Pulumi.yaml").read_text())
    for key in ("tag", "inline", "literal"):
        project["config"][key] = {"type": "string"}
    project["resources"]["settings"]["properties"]["metadata"]["annotations"] = {
        "bars.example/tag": "${tag}",
        "bars.example/inline": "${inline}",
        "bars.example/literal": "${literal}",
    }
    repo.update({"Pulumi.yaml": yaml.safe_dump(project, sort_keys=False)}, "secret annotations")


def test_a_secret_changed_after_the_preview_is_a_plan_mismatch_that_shows_no_secret(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    cli: Callable[..., Result],
    kubernetes_provider: Path,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    inbox, port = receivers_on_loopback()
    hook_secret(kube, namespace, "ops-hook", f"http://127.0.0.1:{port}/hook")
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    repo = git_repo("k8s-yaml")
    with_secret_annotations(repo)
    reviewed, changed = plant("approval-reviewed-tag"), plant("approval-changed-tag")
    inline, literal = plant("approval-inline"), plant("approval-literal")
    create_secret(kube, namespace, "tag", {"value": reviewed})
    create_secret(kube, namespace, "env", {"value": plant("approval-env")})
    spec = kubernetes_spec(repo, pulumi_env, namespace, approval={"required": True})
    spec["secretsRef"] = {
        "tag": {"type": "Secret", "secret": {"name": "tag", "key": "value"}},
        "literal": {"type": "Literal", "literal": {"value": literal}},
    }
    spec["secrets"] = {"inline": inline}
    spec["envRefs"]["EXTRA_SECRET"] = {"type": "Secret", "secret": {"name": "env", "key": "value"}}
    spec["notifications"] = {**receivers("ops"), "events": ["run-failed"]}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", plan_pending(), what="the reviewed plan")
    reviewed_plan = approval(stack)["planID"]

    # The Secret changes after the review: the approved update runs with the new value, and
    # Pulumi refuses it, printing the plan's inputs (with the old value) and the new ones.
    tag = kube.get(SECRETS, "tag", namespace)
    tag["data"] = {"value": base64.b64encode(changed.encode()).decode()}
    kube.replace(SECRETS, tag, namespace)
    approved = cli("approve", "app", "--plan", reviewed_plan, "--yes", "--wait")
    assert approved.exit_code == 1, approved.output
    stack = kube.get(STACKS, "app", namespace)
    update = last_update(stack)
    assert update["reason"] == "PlanMismatch"
    assert "violates plan" in update["message"]
    assert "bars.example/tag:{&{{[secret]}}}" in update["message"]
    assert managed(kube, namespace) == (None, False)

    wait_until(
        lambda: any(m["event"] == "run-failed" for m in inbox.accepted()),
        timeout=120,
        what="the run-failed notification",
    )
    (failed,) = [m for m in inbox.accepted() if m["event"] == "run-failed"]
    assert failed["run"]["name"] == update["name"]
    mismatch = "the stack or the program no longer matches the approved plan"
    assert failed["summary"].startswith(f"up {update['name']} failed: {mismatch}")
    events, _ = kube.list_objects(EVENTS, namespace)
    assert any(mismatch in (event.get("note") or "") for event in events)
    # A new plan, for what the program would do with the new value, awaits review.
    wait_stack(kube, namespace, "app", plan_pending(reviewed_plan), what="a new plan")

    labelled = {
        reviewed: "the reviewed tag",
        changed: "the changed tag",
        inline: "the inline secret",
        literal: "the literal secret",
        secrets["pulumi"]["passphrase"]: "the passphrase",
    }
    for request in inbox.requests():
        assert find(request.body.decode(), "a notification body", labelled) == []
    for job in stack_jobs(kube, namespace, "app"):
        assert_not_leaked(
            cluster, kube, controller, namespace, job["metadata"]["name"], [*labelled]
        )
