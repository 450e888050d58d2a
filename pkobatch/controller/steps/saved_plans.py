"""Approval of saved update plans (``spec.approval.required``): instead of an ``up``, save an
update plan with a preview, wait for its approval, then apply exactly it.

The rules (which next step, who approved, the records written) are ``controller.approval``'s;
this module turns them into the decision: the preview or update to start, the
ApprovalPending condition, and the end of a saved plan (superseded, rejected or used up),
whose preview Job is deleted with the plan's Secret it owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pkobatch.api.conditions import set_condition
from pkobatch.api.constants import (
    CONDITION_APPROVAL_PENDING,
    RECONCILING_APPROVAL_PENDING_REASON,
    RECONCILING_PROCESSING_REASON,
    REJECT_ANNOTATION,
    STALLED_UPDATE_FAILED_REASON,
)
from pkobatch.api.run import Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.controller import approval
from pkobatch.controller.job_builder import job_name
from pkobatch.controller.outcome import job_deleting
from pkobatch.controller.retry import cooldown
from pkobatch.controller.steps.draft import Draft, Refold
from pkobatch.controller.steps.runs import start_run

# Event reasons (API: users and tools filter on them, so they keep their names).
EVENT_SAVED_PLAN_APPROVED: Final = "PlanApproved"
EVENT_SAVED_PLAN_ENDED: Final = "PlanDiscarded"


def approve_first(
    draft: Draft, spec: StackSpec, commit: str | None, trigger: str, reason: str
) -> Refold | None:
    """The sync wants an update and spec.approval.required is on: start the preview that
    saves an update plan, wait for its approval, or start the update that applies exactly
    it (``approval.next_step``). Refold when the Job to start has finished already."""
    manifest = spec.to_manifest()
    target = approval.target_key(manifest, draft.request, trigger)
    record = draft.status.get("approval") or {}
    if record.get("target") != target:
        end_saved_plan(draft, "Superseded", f"superseded by a newer change ({reason})")
        record = draft.status.get("approval") or {}
    failures = int(record.get("failures") or 0)
    step = approval.next_step(
        record,
        target,
        approval.approvals(draft.obs.stack, manifest, draft.obs.managed_fields),
        approval.rejected_plan(draft.obs.stack),
        draft.now,
        cooldown(failures - 1, spec, draft.settings),
        draft.settings.retry.max_failures,
    )
    if isinstance(step, approval.StartPreview):
        run = Run(
            operation="preview",
            kind="approval",
            generation=draft.generation,
            reconcile_request=draft.request,
            commit=commit or "",
            trigger=approval.preview_trigger(target, trigger, step.attempt),
        )
        name = job_name(draft.name, draft.uid, run)
        started = start_run(draft, run, f"{reason} (spec.approval: saving a plan to review)")
        if isinstance(started, Refold):
            return started
        if started:
            draft.status["approval"] = approval.previewing(target, run, name, step.attempt, reason)
            draft.reconciling(
                RECONCILING_PROCESSING_REASON,
                f"preview {name} is saving a plan for approval",
            )
        approval_condition(draft, "False", "Previewing", f"preview {name} saves a plan")
    elif isinstance(step, approval.Apply):
        run = approval.apply_run(record, draft.generation, draft.request)
        name = job_name(draft.name, draft.uid, run)
        started = start_run(draft, run, f"plan {run.plan} approved by {step.approver.by}")
        if isinstance(started, Refold):
            return started
        if started:
            if record.get("state") != "Approved":
                draft.event(
                    "Normal",
                    EVENT_SAVED_PLAN_APPROVED,
                    f"plan {run.plan} approved by {step.approver.by} "
                    f"({step.approver.via or 'no review needed'})",
                )
            draft.status["approval"] = approval.approved(record, step.approver, name, draft.now)
        approval_condition(draft, "False", "Approved", f"plan {run.plan} is approved")
    elif isinstance(step, approval.Reject):
        end_saved_plan(draft, "Rejected", f"rejected ({REJECT_ANNOTATION})")
        approval_condition(draft, "False", "Rejected", f"plan {step.plan_id} was rejected")
        draft.reconciling(
            RECONCILING_APPROVAL_PENDING_REASON,
            f"plan {step.plan_id} was rejected; nothing runs until the spec, the source "
            "or the reconcile request changes",
        )
    else:
        if step.stalled:
            draft.stalled(STALLED_UPDATE_FAILED_REASON, step.message)
        else:
            draft.reconciling(RECONCILING_APPROVAL_PENDING_REASON, step.message)
        if step.recheck is not None:
            draft.requeue_in(step.recheck)
        if step.pending:
            approval_condition(draft, "True", "AwaitingApproval", step.message)
    return None


def end_saved_plan(draft: Draft, state: str, message: str) -> None:
    """Supersede or reject the saved plan that holds its Secret (not one approved already);
    its preview Job goes with it."""
    record = draft.status.get("approval") or {}
    if not approval.holds_plan(record) or record.get("state") == "Approved":
        return
    draft.status["approval"] = approval.ended(
        record, state, f"plan {record.get('planID')} {state.lower()}: {message}"
    )
    draft.event("Normal", EVENT_SAVED_PLAN_ENDED, draft.status["approval"]["message"])
    discard_saved_plan(draft, record)


def discard_saved_plan(draft: Draft, record: Mapping[str, Any]) -> None:
    """Delete the preview Job of ``record`` (the approval record), and with it the Secret
    of its saved plan."""
    job = draft.jobs.get(str(record.get("previewJob") or ""))
    if job is not None and not job_deleting(job):
        draft.delete_job(job)


def approval_condition(
    draft: Draft, status: Literal["True", "False"], reason: str, message: str
) -> None:
    draft.conditions = set_condition(
        draft.conditions,
        CONDITION_APPROVAL_PENDING,
        status,
        reason,
        message,
        now=draft.now,
        observed_generation=draft.generation,
    )
