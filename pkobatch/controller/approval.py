"""Approval of saved update plans (``spec.approval``): the pure rules (docs/api.md).

With ``spec.approval.required`` a change never runs ``up`` directly. Whenever the Stack's
normal sync would start an update (new generation, commit, Program/Flux revision, reconcile
request, schedule, retry), the controller instead starts a *preview* of kind ``approval``
that saves a Pulumi update plan (``preview --save-plan``) into a Secret owned by that
preview's Job, and records it in ``status.approval``: the plan id (a digest of the plan file,
the commit and the spec, ``pkobatch.api.run.plan_id``), its change summary and resources,
the commit and the trigger. Nothing changes until the plan is approved, by
``spec.approval.approvedPlan: <id>`` (GitOps) or the ``pkobatch.io/approve: <id>``
annotation (``pkobatch approve``). The approved ``up`` gets that plan (``up --plan``) and
refuses anything it does not allow (``PlanMismatch``); a new preview follows.

A plan is for one *target*: a digest of the spec without ``approval``, the reconcile
request and the sync trigger (which names the commit and the last update, or the schedule
time). A change of any of them supersedes a plan that was not approved yet. Approving by
spec raises the Stack's generation; the target leaves ``approval`` out, so that does not
supersede the plan it approves.

The plan's Secret is owned by the preview Job, which has no TTL: deleting that Job (which the
controller may do) deletes the plan, so the controller needs no right to delete Secrets. It
is deleted once the plan was used, superseded or rejected.

Who approved is read from ``metadata.managedFields``: the field manager that last wrote the
approving field, as the API server recorded it. A field manager is named by the client
(``pkobatch approve`` names it after the user the API server authenticated, asked with a
SelfSubjectReview); whoever may patch the Stack may approve, so RBAC on ``stacks`` is what
authorizes an approval, and the recorded name is for the record, not a proof.

This module holds the rules (``next_step``, ``approvals``, ``target_key``) and the records
written when a preview starts, a plan is approved or ends (``previewing``, ``approved``,
``ended``). How a finished preview or update changes the record (``folded_preview``,
``folded_update``) lives with the rest of a finished run's status in ``fold.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from pkobatch.api.annotations import accepted
from pkobatch.api.constants import APPROVE_ANNOTATION, REJECT_ANNOTATION
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import JSON
from pkobatch.api.run import Run
from pkobatch.api.timestamps import format_time, parse_time
from pkobatch.controller.fold import UNCHANGED_OPS
from pkobatch.controller.job_builder import short_hash

APPROVE_TRIGGER_PREFIX: Final = "approved:"
VIA_SPEC: Final = "spec.approval.approvedPlan"
VIA_ANNOTATION: Final = APPROVE_ANNOTATION
# An approval the controller gives itself: a plan that changes nothing needs no review.
NO_CHANGES_APPROVER: Final = "pkobatch (the plan changes nothing)"


def required(spec: Mapping[str, Any]) -> bool:
    """Whether the (canonical) spec asks for approval of every update."""
    approval = spec.get("approval")
    return (
        isinstance(approval, Mapping)
        and approval.get("required") is True
        and not spec.get("preview")
    )


def target_key(spec: Mapping[str, Any], request: str, trigger: str) -> str:
    """What a plan is for (see the module docstring)."""
    reviewed = {key: value for key, value in spec.items() if key != "approval"}
    return short_hash(json.dumps(reviewed, sort_keys=True), request, trigger, length=16)


@dataclass(frozen=True)
class Approver:
    plan_id: str
    by: str
    via: str


def _owns(fields: Any, path: Sequence[str]) -> bool:
    node = fields
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def field_manager(managed_fields: Sequence[Mapping[str, Any]], path: Sequence[str]) -> str:
    """The field manager that last wrote the field at ``path`` (fieldsV1 keys), or ""."""
    owners = [
        entry
        for entry in managed_fields
        if isinstance(entry, Mapping) and _owns(entry.get("fieldsV1"), path)
    ]
    if not owners:
        return ""
    latest = max(owners, key=lambda entry: str(entry.get("time") or ""))
    return str(latest.get("manager") or "")


def approvals(
    stack: Mapping[str, Any],
    spec: Mapping[str, Any],
    managed_fields: Sequence[Mapping[str, Any]] = (),
) -> list[Approver]:
    """The approvals the Stack holds: spec.approval.approvedPlan and the annotation.

    ``managed_fields``: the Stack's, read live (the controller's cache drops them), else
    those of ``stack``."""
    meta: Mapping[str, Any] = stack.get("metadata") or {}
    fields = managed_fields or meta.get("managedFields") or ()
    found = []
    approved = str((spec.get("approval") or {}).get("approvedPlan") or "").strip()
    if approved:
        path = ("f:spec", "f:approval", "f:approvedPlan")
        found.append(Approver(approved, field_manager(fields, path) or "unknown", VIA_SPEC))
    annotated = accepted(stack, APPROVE_ANNOTATION)
    if annotated:
        path = ("f:metadata", "f:annotations", f"f:{APPROVE_ANNOTATION}")
        found.append(Approver(annotated, field_manager(fields, path) or "unknown", VIA_ANNOTATION))
    return found


def names_pending_plan(stack: Mapping[str, Any]) -> bool:
    """Whether the Stack approves its pending plan: then its approver is read (managedFields)."""
    record = (stack.get("status") or {}).get("approval") or {}
    if record.get("state") != "Pending":
        return False
    spec = stack.get("spec") or {}
    named = {
        str((spec.get("approval") or {}).get("approvedPlan") or "").strip(),
        accepted(stack, APPROVE_ANNOTATION),
    }
    return str(record.get("planID") or "") in named


def rejected_plan(stack: Mapping[str, Any]) -> str:
    return accepted(stack, REJECT_ANNOTATION)


# -- next steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPreview:
    """Save a new plan for the target. ``attempt`` distinguishes retries of a failed one."""

    attempt: int = 0


@dataclass(frozen=True)
class Apply:
    approver: Approver


@dataclass(frozen=True)
class Wait:
    """Nothing runs; the status says why (``pending``: a plan awaits approval)."""

    message: str
    pending: bool = True
    # Seconds until the next look (a retry after a failed preview).
    recheck: float | None = None
    stalled: bool = False


@dataclass(frozen=True)
class Reject:
    plan_id: str


ApprovalStep = StartPreview | Apply | Wait | Reject


def next_step(
    record: Mapping[str, Any],
    target: str,
    approvers: Sequence[Approver],
    rejected: str,
    now: datetime,
    cooldown: timedelta,
    max_failures: int,
) -> ApprovalStep:
    """What to do when the Stack's sync wants an update and approval is required.

    ``record`` is ``status.approval``; ``cooldown`` the wait after ``record``'s failed
    previews (``schedule.cooldown``); ``max_failures`` how many failed previews stall.
    """
    if record.get("target") != target:
        return StartPreview()
    state = record.get("state")
    plan = str(record.get("planID") or "")
    if state == "Pending":
        if rejected and rejected == plan:
            return Reject(plan)
        for approver in approvers:
            if approver.plan_id == plan:
                return Apply(approver)
        if not changes_anything(record.get("changes")):
            return Apply(Approver(plan, NO_CHANGES_APPROVER, ""))
        return Wait(pending_message(record, approvers))
    if state == "Approved":
        # Its update was planned but did not start (no free slot, a crash): start it again.
        return Apply(
            Approver(
                plan, str(record.get("approvedBy") or ""), str(record.get("approvedVia") or "")
            )
        )
    if state == "Rejected":
        return Wait(
            f"plan {plan} was rejected; nothing runs until the spec, the source or the "
            "reconcile request changes",
            pending=False,
        )
    if state == "PreviewFailed":
        failures = int(record.get("failures") or 0)
        if failures >= max_failures:
            return Wait(
                f"the preview for approval failed {failures} times; not retrying until the "
                f"spec, the source or the reconcile request changes. Last error: "
                f"{record.get('message')}",
                pending=False,
                stalled=True,
            )
        failed_at = parse_time(record.get("createdTime")) or now
        wait = failed_at + cooldown - now
        if wait > timedelta(0):
            return Wait(
                f"the preview for approval failed: {record.get('message')}; retrying",
                pending=False,
                recheck=wait.total_seconds(),
            )
        return StartPreview(attempt=failures)
    # Previewing (a preview that vanished unseen), Applied, Failed, Superseded.
    return StartPreview(attempt=int(record.get("failures") or 0))


def changes_anything(changes: Any) -> bool:
    if not isinstance(changes, Mapping):
        return True
    return any(count for op, count in changes.items() if op not in UNCHANGED_OPS)


def pending_message(record: Mapping[str, Any], approvers: Sequence[Approver]) -> str:
    plan = record.get("planID")
    message = (
        f"plan {plan} awaits approval ({record.get('summary')}; made at "
        f"{record.get('commit') or 'no commit'} for {record.get('trigger')}); approve it with "
        f"`pkobatch approve <stack> --plan {plan}` or spec.approval.approvedPlan: {plan}"
    )
    for approver in approvers:
        if approver.plan_id != plan:
            message += (
                f"; {approver.via} names {approver.plan_id}, which is not the pending plan: ignored"
            )
    return bound_message(message)


# -- records --------------------------------------------------------------------------------


def previewing(target: str, run: Run, job: str, attempt: int, reason: str) -> JSON:
    """``status.approval`` while the preview of ``run`` saves a plan; ``reason`` is why the
    Stack wants an update (``new commit <sha>``, ``scheduled run <time>``, ...)."""
    return {
        "state": "Previewing",
        "target": target,
        "trigger": reason,
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "commit": run.commit,
        "previewJob": job,
        "failures": attempt,
        "message": f"preview {job} is saving a plan for approval",
    }


def preview_trigger(target: str, trigger: str, attempt: int) -> str:
    """The trigger of the preview Job: the target first (``fold.folded_preview`` reads it)."""
    return f"{target}:{attempt}#{trigger}"


def approved(record: Mapping[str, Any], approver: Approver, job: str, now: datetime) -> JSON:
    return {
        **record,
        "state": "Approved",
        "approvedBy": approver.by,
        "approvedVia": approver.via,
        "approvedTime": format_time(now),
        "updateJob": job,
        "message": f"approved by {approver.by}; update {job} applies plan {approver.plan_id}",
    }


def apply_run(record: Mapping[str, Any], generation: int, request: str) -> Run:
    """The ``up`` that applies the approved plan of ``record``, at the commit it was made."""
    plan = str(record.get("planID") or "")
    return Run(
        operation="up",
        kind="sync",
        generation=generation,
        reconcile_request=request,
        commit=str(record.get("commit") or ""),
        trigger=f"{APPROVE_TRIGGER_PREFIX}{plan}",
        plan=plan,
        plan_secret=str(record.get("planSecret") or ""),
    )


def ended(record: Mapping[str, Any], state: str, message: str) -> JSON:
    """``record`` Superseded or Rejected: its plan will never run."""
    return {**record, "state": state, "message": bound_message(message)}


def holds_plan(record: Mapping[str, Any]) -> bool:
    """Whether the record's preview Job (and so its plan Secret) must be kept."""
    return record.get("state") in ("Pending", "Approved")
