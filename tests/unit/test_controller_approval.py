"""spec.approval: saved plans, their approval and what becomes of them (pure, in memory).

``World`` (tests/unit/decision_world.py) plays the API server and the Job controller; the runner's
part is a result with a plan id, as ``pkobatch.runner.execute`` writes it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from decision_world import GIT_SPEC, SHA1, SHA2, World

from pkobatch.api.constants import (
    APPROVE_ANNOTATION,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REJECT_ANNOTATION,
    RESULT_KEY,
)
from pkobatch.api.run import SNAPSHOT_FLAG, PlannedStep, Run, RunResult, RunSnapshot, plan_id
from pkobatch.controller import approval
from pkobatch.controller.cache_transforms import cache_result
from pkobatch.controller.fold import summary
from pkobatch.controller.notify import occurrences

APPROVAL_SPEC: dict[str, Any] = {**GIT_SPEC, "approval": {"required": True}}
PLAN = "plan-00000000000000000001"
CHANGES = {"create": 2, "same": 1}


def job_run(world: World, name: str) -> Run:
    run = Run.from_job(world.jobs[name])
    assert run is not None
    return run


def snapshot_of(world: World, name: str) -> RunSnapshot:
    args = world.jobs[name]["spec"]["template"]["spec"]["containers"][0]["args"]
    return RunSnapshot.model_validate_json(args[args.index(SNAPSHOT_FLAG) + 1])


def finish_preview(
    world: World, plan: str = PLAN, changes: dict[str, int] | None = None, commit: str = SHA1
) -> str:
    """The current preview ends having saved ``plan`` (as the runner reports it)."""
    return world.finish(
        commit=commit,
        plan_id=plan,
        changes=CHANGES if changes is None else changes,
        planned_resources=[PlannedStep(urn="urn:pulumi:dev::app::x::file-0", op="create")],
        planned_resource_count=2,
    )


def approve_by_annotation(world: World, plan: str, manager: str = "pkobatch-cli:alice") -> None:
    world.annotate(APPROVE_ANNOTATION, plan)
    world.stack["metadata"]["managedFields"] = [
        {
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "time": "2026-01-01T11:00:00Z",
            "fieldsV1": {"f:spec": {"f:stack": {}}},
        },
        {
            "manager": manager,
            "operation": "Update",
            "time": "2026-01-01T12:30:00Z",
            "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{APPROVE_ANNOTATION}": {}}}},
        },
    ]


def pending_world(**kwargs: Any) -> tuple[World, str]:
    """A Stack whose first plan awaits approval; the preview Job's name."""
    world = World(json.loads(json.dumps(APPROVAL_SPEC)), **kwargs)
    world.step()
    preview = finish_preview(world)
    world.settle()
    assert world.status["approval"]["state"] == "Pending"
    return world, preview


def test_a_change_runs_a_preview_that_saves_a_plan_not_an_up() -> None:
    world = World(json.loads(json.dumps(APPROVAL_SPEC)))
    world.step()
    name = world.current_job()
    run = job_run(world, name)
    assert (run.operation, run.kind) == ("preview", "approval")
    snapshot = snapshot_of(world, name)
    assert snapshot.save_plan is not None and snapshot.save_plan.secret == f"{name}-plan"
    assert snapshot.apply_plan is None
    # The plan's Secret is owned by this Job: it must outlive approval, so no TTL.
    assert "ttlSecondsAfterFinished" not in world.jobs[name]["spec"]
    assert world.status["approval"]["state"] == "Previewing"
    assert world.condition("Ready")["status"] == "False"


def test_a_saved_plan_is_shown_and_nothing_runs_until_approved() -> None:
    world, preview = pending_world()
    record = world.status["approval"]
    assert record["planID"] == PLAN
    assert record["summary"] == "2 to create"
    assert record["commit"] == SHA1
    assert record["planSecret"] == f"{preview}-plan"
    assert record["resources"] == [{"urn": "urn:pulumi:dev::app::x::file-0", "op": "create"}]
    assert record["trigger"] == "initial stack update"
    assert world.active_jobs() == []
    pending = world.condition("ApprovalPending")
    assert pending["status"] == "True" and PLAN in pending["message"]
    assert "2 to create" in pending["message"]
    assert world.condition("Ready")["status"] == "False"
    assert world.condition("Reconciling")["reason"] == "ApprovalPending"
    # Time passing changes nothing.
    world.advance(3600)
    assert world.step().create_job is None


def test_approval_by_annotation_runs_exactly_that_plan_and_records_the_approver() -> None:
    world, preview = pending_world()
    approve_by_annotation(world, PLAN)
    world.step()
    name = world.current_job()
    run = job_run(world, name)
    assert (run.operation, run.plan, run.commit) == ("up", PLAN, SHA1)
    snapshot = snapshot_of(world, name)
    assert snapshot.apply_plan is not None
    assert (snapshot.apply_plan.secret, snapshot.apply_plan.id) == (f"{preview}-plan", PLAN)
    record = world.status["approval"]
    assert record["state"] == "Approved"
    assert record["approvedBy"] == "pkobatch-cli:alice"
    assert record["approvedVia"] == APPROVE_ANNOTATION
    assert record["updateJob"] == name
    world.finish(outputs={"url": "http://x"})
    world.settle()
    assert world.status["approval"]["state"] == "Applied"
    assert world.status["lastUpdate"]["state"] == "succeeded"
    assert world.condition("Ready")["status"] == "True"
    assert world.condition("ApprovalPending")["status"] == "False"
    # The plan is used: its preview Job (owner of the plan's Secret) is deleted.
    assert preview not in world.jobs


def test_approval_by_spec_raises_the_generation_but_does_not_supersede_the_plan() -> None:
    world, _ = pending_world()
    world.edit_spec(approval={"required": True, "approvedPlan": PLAN})
    world.stack["metadata"]["managedFields"] = [
        {
            "manager": "kustomize-controller",
            "operation": "Apply",
            "time": "2026-01-01T12:30:00Z",
            "fieldsV1": {"f:spec": {"f:approval": {"f:approvedPlan": {}}}},
        }
    ]
    world.step()
    run = job_run(world, world.current_job())
    assert (run.operation, run.plan, run.generation) == ("up", PLAN, 2)
    assert world.status["approval"]["approvedBy"] == "kustomize-controller"
    assert world.status["approval"]["approvedVia"] == "spec.approval.approvedPlan"
    world.finish()
    world.settle()
    assert world.status["lastUpdate"]["generation"] == 2
    assert world.condition("Ready")["status"] == "True"


def test_a_wrong_plan_id_in_the_spec_is_ignored_with_a_clear_message() -> None:
    world, preview = pending_world()
    world.edit_spec(approval={"required": True, "approvedPlan": "plan-wrong"})
    assert world.step().create_job is None
    message = world.condition("ApprovalPending")["message"]
    assert "plan-wrong, which is not the pending plan: ignored" in message
    assert world.status["approval"]["state"] == "Pending"
    assert preview in world.jobs


def test_a_new_commit_supersedes_the_unapproved_plan_and_makes_a_new_one() -> None:
    world, preview = pending_world()
    world.source = type(world.source)(commit=SHA2)  # type: ignore[misc]
    world.step()
    assert preview not in world.jobs
    name = world.current_job()
    run = job_run(world, name)
    assert (run.operation, run.kind, run.commit) == ("preview", "approval", SHA2)
    assert world.status["approval"]["commit"] == SHA2
    # Approving the superseded plan now does nothing.
    approve_by_annotation(world, PLAN)
    finish_preview(world, plan="plan-00000000000000000002", commit=SHA2)
    world.settle()
    assert world.status["approval"]["planID"] == "plan-00000000000000000002"
    assert world.status["approval"]["state"] == "Pending"
    assert world.active_jobs() == []


def test_reject_discards_the_plan_until_something_changes() -> None:
    world, preview = pending_world()
    world.annotate(REJECT_ANNOTATION, PLAN)
    assert world.step().create_job is None
    assert world.status["approval"]["state"] == "Rejected"
    assert preview not in world.jobs
    approve_by_annotation(world, PLAN)
    world.advance(86400)
    assert world.step().create_job is None
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "again")
    world.step()
    assert job_run(world, world.current_job()).kind == "approval"


def test_a_plan_that_no_longer_matches_fails_and_a_new_preview_follows() -> None:
    world, _ = pending_world()
    approve_by_annotation(world, PLAN)
    world.step()
    world.finish(state="failed", reason="PlanMismatch", message="violates plan")
    world.step()
    assert world.status["approval"]["state"] == "Failed"
    assert "PlanMismatch" in world.status["approval"]["message"]
    assert world.status["lastUpdate"]["reason"] == "PlanMismatch"
    assert world.active_jobs() == []
    world.advance(timedelta(minutes=5).total_seconds())
    world.step()
    run = job_run(world, world.current_job())
    assert (run.operation, run.kind) == ("preview", "approval")


def test_a_plan_without_changes_needs_no_review() -> None:
    world = World(json.loads(json.dumps(APPROVAL_SPEC)))
    world.step()
    finish_preview(world, changes={"same": 3})
    world.step()
    run = job_run(world, world.current_job())
    assert (run.operation, run.plan) == ("up", PLAN)
    assert world.status["approval"]["approvedBy"] == approval.NO_CHANGES_APPROVER


def test_a_failed_preview_is_retried_with_backoff_under_a_new_job_name() -> None:
    world = World(json.loads(json.dumps(APPROVAL_SPEC)))
    world.step()
    first = world.finish(state="failed", reason="ProgramError", message="boom")
    world.step()
    assert world.status["approval"]["state"] == "PreviewFailed"
    assert world.active_jobs() == []
    world.advance(600)
    world.step()
    second = world.current_job()
    assert second != first
    assert job_run(world, second).kind == "approval"


def test_a_requested_up_is_rejected_in_approval_mode() -> None:
    world, _ = pending_world()
    world.annotate(OPERATION_REQUEST_ANNOTATION, "up:t1")
    assert world.step().create_job is None
    request = world.status["operationRequest"]
    assert request["state"] == "Rejected" and "approve" in request["message"]


def test_turning_approval_off_supersedes_the_pending_plan() -> None:
    world, preview = pending_world()
    world.edit_spec(approval={"required": False})
    world.step()
    assert world.status["approval"]["state"] == "Superseded"
    assert preview not in world.jobs
    assert job_run(world, world.current_job()).operation == "up"
    assert world.condition("ApprovalPending") is None


def test_remediation_is_refused_with_approval() -> None:
    world = World({**APPROVAL_SPEC, "driftDetection": {"schedule": "0 * * * *", "remediate": True}})
    world.step()
    assert world.condition("Stalled")["reason"] == "SpecInvalid"


# -- the pure pieces ----------------------------------------------------------------------


def test_the_target_leaves_approval_out() -> None:
    spec = {"stack": "dev", "approval": {"required": True}}
    approved = {"stack": "dev", "approval": {"required": True, "approvedPlan": PLAN}}
    assert approval.target_key(spec, "", "t") == approval.target_key(approved, "", "t")
    assert approval.target_key(spec, "", "t") != approval.target_key({"stack": "x"}, "", "t")
    assert approval.target_key(spec, "", "t") != approval.target_key(spec, "r", "t")


def test_plan_id_covers_plan_commit_and_spec_but_not_approval() -> None:
    spec = {"stack": "dev", "approval": {"required": True}}
    first = plan_id(b"{}", SHA1, spec)
    assert first.startswith("plan-") and len(first) == 25
    assert first == plan_id(b"{}", SHA1, {**spec, "approval": {"approvedPlan": first}})
    assert first != plan_id(b"{ }", SHA1, spec)
    assert first != plan_id(b"{}", SHA2, spec)
    assert first != plan_id(b"{}", SHA1, {"stack": "prod"})


def test_the_approver_is_the_latest_manager_of_the_approving_field() -> None:
    meta = {
        "managedFields": [
            {"manager": "old", "time": "2026-01-01T10:00:00Z", "fieldsV1": {"f:spec": {}}},
            {
                "manager": "bob",
                "time": "2026-01-01T09:00:00Z",
                "fieldsV1": {"f:spec": {"f:approval": {"f:approvedPlan": {}}}},
            },
            {
                "manager": "carol",
                "time": "2026-01-01T11:00:00Z",
                "fieldsV1": {"f:spec": {"f:approval": {"f:approvedPlan": {}}}},
            },
        ]
    }
    fields = meta["managedFields"]
    assert approval.field_manager(fields, ("f:spec", "f:approval", "f:approvedPlan")) == "carol"
    assert approval.field_manager(fields, ("f:metadata",)) == ""


def test_summary_in_pulumis_words() -> None:
    assert summary({"create": 1, "update": 2, "same": 5}) == "1 to create, 2 to update"
    assert summary({"same": 5}) == "no changes"
    assert not approval.changes_anything({"same": 2, "read": 1})
    assert approval.changes_anything({"delete": 1})


def test_a_preview_that_failed_too_often_stalls() -> None:
    record = {"target": "t", "state": "PreviewFailed", "failures": 3, "message": "boom"}
    decision = approval.next_step(record, "t", [], "", world_now(), timedelta(0), 3)
    assert isinstance(decision, approval.Wait) and decision.stalled


def world_now() -> Any:
    return World().now


def test_the_controllers_cache_keeps_what_a_saved_plan_folds_into() -> None:
    world = World(json.loads(json.dumps(APPROVAL_SPEC)))
    world.step()
    name = finish_preview(world)
    cached = cache_result({"kind": "ConfigMap", **world.results[name]})
    result = RunResult.model_validate_json(cached["data"][RESULT_KEY])
    assert result.plan_id == PLAN
    assert result.changes == CHANGES
    assert result.planned_resource_count == 2 and result.planned_resources


def test_a_pending_plan_is_notified_once() -> None:
    world = World(json.loads(json.dumps(APPROVAL_SPEC)))
    world.step()
    finish_preview(world)
    before = json.loads(json.dumps(world.status))
    world.step()
    found = occurrences(before, world.status, world.now)
    assert [(o.id, o.event) for o in found] == [(f"approval-pending/{PLAN}", "approval-pending")]
    assert "2 to create" in found[0].summary and found[0].operation == "preview"
    assert occurrences(world.status, world.status, world.now) == []
