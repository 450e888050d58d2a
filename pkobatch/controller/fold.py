"""How a finished run becomes Stack status (pure).

``fold_run`` records a run's ``Outcome`` (``pkobatch.controller.outcome``: how the run
ended; a Stack never waits on an object that is gone) then records the outcome in
the Stack's status, all of it here: ``folded_last_update`` applies PKO's bookkeeping for a
run that changes the stack — consecutive failures are counted for the same generation and
reconcile request (``retry.same_attempt_key``); a new commit does not reset the count (it
starts one run at once, see ``retry.sync_decision``), so a Stack failing on every commit
still stalls; a success resets them — with ``folded_outputs`` and ``projectInfo``; a drift
check sets ``lastDriftCheck`` (``folded_drift_check``) and the Drifted condition
(``drift_verdict``); a requested run answers its request in ``operationRequest``
(``folded_operation_request``); a run of a saved plan updates the approval record
``status.approval`` (``folded_preview`` for the preview that saved it, with the "plan saved,
awaits approval" Event; ``folded_update`` for the update that applied it). ``decide`` decides
when to fold (the order of the decision) and deletes the preview Job of a plan that was
used; ``approval.py`` decides what a saved plan needs next; ``retry.py`` decides what
happens next otherwise.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Literal

from pkobatch.api.conditions import set_condition
from pkobatch.api.constants import (
    CONDITION_DRIFTED,
    EVENT_CREATED,
    EVENT_GIT_AUTHENTICATION_FAILURE,
    EVENT_INITIALIZATION_FAILURE,
    EVENT_OUTPUT_RETRIEVAL_FAILURE,
    EVENT_UPDATE_CONFLICT_DETECTED,
    EVENT_UPDATE_FAILURE,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import JSON
from pkobatch.api.run import (
    DRIFT_TRIGGER_PREFIX,
    MAX_PLANNED_RESOURCES,
    REMEDIATE_TRIGGER_PREFIX,
    SCHEDULE_TRIGGER_PREFIX,
    SECRET_PLACEHOLDER,
    Run,
)
from pkobatch.api.stack.status import Condition
from pkobatch.api.status import (
    DriftCheck,
    LastUpdate,
    OperationRequest,
    StatusObject,
    current_update,
    last_drift_check,
    operation_request_status,
)
from pkobatch.api.timestamps import format_time
from pkobatch.controller.outcome import Event, Outcome
from pkobatch.controller.retry import same_attempt_key
from pkobatch.controller.run_snapshot import plan_secret_name
from pkobatch.controller.schedule import newer_schedule_time

_OUTPUT_KEY_INVALID: Final = re.compile(r"[^-._a-zA-Z0-9]")


def folded_last_update(
    previous: LastUpdate | None, run: Run, job_name: str, outcome: Outcome
) -> LastUpdate:
    """``status.lastUpdate`` after ``run`` ended with ``outcome`` (PKO's fields); the failure
    count follows ``retry.same_attempt_key``."""
    previous = previous or {}
    result = outcome.result
    commit = (result.commit if result is not None and result.commit else "") or run.commit
    if outcome.succeeded:
        failures = 0
        successful_commit = commit
    else:
        failures = (
            int(previous.get("failures") or 0) + 1
            if previous and same_attempt_key(previous, run)
            else 0
        )
        successful_commit = str(previous.get("lastSuccessfulCommit") or "")
    return {
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "name": job_name,
        "type": run.operation,
        "state": outcome.state,
        "message": bound_message(outcome.message),
        "lastAttemptedCommit": commit,
        "lastSuccessfulCommit": successful_commit,
        "permalink": result.permalink if result is not None else "",
        "lastResyncTime": format_time(outcome.finished_at),
        "failures": failures,
        "reason": outcome.reason,
    }


def sanitize_output_key(key: str) -> str:
    """PKO's rule: characters outside ``[-._a-zA-Z0-9]`` become ``_``."""
    return _OUTPUT_KEY_INVALID.sub("_", key)


def folded_outputs(previous: Mapping[str, Any] | None, run: Run, outcome: Outcome) -> JSON | None:
    """``status.outputs``: replaced by a successful up, emptied by a successful destroy.

    Secret outputs are masked again here: status must never hold a secret value, even if a
    runner forgot to redact one.
    """
    result = outcome.result
    if not outcome.succeeded or result is None:
        return dict(previous) if previous is not None else None
    if run.operation == "destroy":
        return {}
    if run.operation != "up":
        return dict(previous) if previous is not None else None
    secret = set(result.secret_outputs)
    return {
        sanitize_output_key(key): SECRET_PLACEHOLDER if key in secret else value
        for key, value in sorted(result.outputs.items())
    }


# Reasons of the Drifted condition, and of the Events about a finished run.
DRIFT_DETECTED_REASON: Final = "DriftDetected"
NO_DRIFT_REASON: Final = "NoDrift"
DRIFT_CHECK_FAILED_REASON: Final = "DriftCheckFailed"
REMEDIATED_REASON: Final = "Remediated"
EVENT_DRIFT_DETECTED: Final = "DriftDetected"
EVENT_STALE_LOCK_REMOVED: Final = "StaleLockRemoved"
EVENT_PLAN_SAVED: Final = "PlanAwaitingApproval"


def changes_stack(run: Run) -> bool:
    """Runs recorded in lastUpdate (and shown as Reconciling): all but drift checks,
    requested previews/refreshes and the previews that save a plan for approval, which
    report in lastDriftCheck / operationRequest / approval."""
    return run.kind == "sync" or (run.kind == "request" and run.operation in ("up", "destroy"))


def folded_drift_check(
    previous: DriftCheck, run: Run, job_name: str, outcome: Outcome
) -> DriftCheck:
    """``status.lastDriftCheck`` after drift check ``run`` ended with ``outcome``."""
    check = previous.copy()
    if run.trigger.startswith(DRIFT_TRIGGER_PREFIX):
        check["scheduledTime"] = run.trigger.removeprefix(DRIFT_TRIGGER_PREFIX)
    check["name"] = job_name
    check["time"] = format_time(outcome.finished_at)
    check["state"] = outcome.state
    check["driftedResources"] = _drifted_resources(outcome)
    check["message"] = bound_message(outcome.message)
    return check


def _drifted_resources(outcome: Outcome) -> int:
    return (outcome.result.drifted_resources if outcome.result else None) or 0


@dataclass(frozen=True)
class DriftVerdict:
    """The Drifted condition a finished drift check sets."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


def drift_verdict(job_name: str, outcome: Outcome) -> DriftVerdict:
    drifted = _drifted_resources(outcome)
    if not outcome.succeeded:
        return DriftVerdict("Unknown", DRIFT_CHECK_FAILED_REASON, f"drift check {job_name} failed")
    if drifted:
        message = f"{drifted} resource(s) drifted from the last update (check {job_name})"
        return DriftVerdict("True", DRIFT_DETECTED_REASON, message)
    return DriftVerdict("False", NO_DRIFT_REASON, f"no drift found (check {job_name})")


def folded_operation_request(
    previous: OperationRequest, run: Run, job_name: str, outcome: Outcome
) -> OperationRequest | None:
    """``status.operationRequest`` once the run a request started has ended; None when the
    run answers no request, or a newer request is recorded already (only this run's own
    entry is updated)."""
    if run.kind != "request" or previous.get("request") not in (None, "", run.request):
        return None
    return {
        "request": run.request,
        "operation": run.operation,
        "state": "Succeeded" if outcome.succeeded else "Failed",
        "jobName": job_name,
        "message": bound_message(outcome.message),
    }


# Pulumi's step kinds that change nothing.
UNCHANGED_OPS: Final = frozenset({"same", "read"})


def summary(changes: Mapping[str, int]) -> str:
    """``2 to create, 1 to update`` (Pulumi's words), or ``no changes``."""
    parts = [
        f"{count} to {op}"
        for op, count in sorted(changes.items())
        if count and op not in UNCHANGED_OPS
    ]
    return ", ".join(parts) if parts else "no changes"


def folded_preview(record: Mapping[str, Any], run: Run, job: str, outcome: Outcome) -> JSON:
    """``status.approval`` once the preview ``job`` ended; its trigger names the target
    first (``approval.preview_trigger``)."""
    target = run.trigger.partition("#")[0].rpartition(":")[0]
    result = outcome.result
    same = record.get("target") == target
    base: JSON = {
        "target": target,
        "trigger": record.get("trigger") if same else run.trigger.partition("#")[2],
        "generation": run.generation,
        "reconcileRequest": run.reconcile_request,
        "commit": (result.commit if result is not None and result.commit else run.commit),
        "previewJob": job,
        "createdTime": format_time(outcome.finished_at),
    }
    if not outcome.succeeded or result is None or not result.plan_id:
        failures = int(record.get("failures") or 0) + 1 if same else 1
        return {
            **base,
            "state": "PreviewFailed",
            "failures": failures,
            "message": bound_message(outcome.message or "the preview saved no plan"),
        }
    changes = dict(result.changes)
    return {
        **base,
        "state": "Pending",
        "planID": result.plan_id,
        "planSecret": plan_secret_name(job),
        "summary": summary(changes),
        "changes": changes,
        "resources": [
            step.model_dump(mode="json")
            for step in result.planned_resources[:MAX_PLANNED_RESOURCES]
        ],
        "resourceCount": result.planned_resource_count,
        "failures": 0,
        "message": "",
    }


def folded_update(record: Mapping[str, Any], run: Run, job: str, outcome: Outcome) -> JSON:
    """``status.approval`` once the update applying ``run.plan`` ended."""
    if record.get("planID") != run.plan:
        return dict(record)
    if outcome.succeeded:
        return {**record, "state": "Applied", "message": f"update {job} applied plan {run.plan}"}
    return {
        **record,
        "state": "Failed",
        "message": bound_message(
            f"update {job} did not apply plan {run.plan} ({outcome.reason}): {outcome.message}"
        ),
    }


@dataclass(frozen=True)
class FoldedRun:
    """The status and conditions after one run ended, and the Events that tell about it."""

    status: StatusObject
    conditions: list[Condition]
    events: list[Event]


def fold_run(
    status: StatusObject,
    conditions: Sequence[Condition],
    run: Run,
    job_name: str,
    outcome: Outcome,
    *,
    now: datetime,
    generation: int,
) -> FoldedRun:
    """Record how run ``job_name`` ended in (a copy of) ``status``: ``approval`` for the
    preview that saved a plan and for the update that applied one, ``lastUpdate``,
    ``outputs`` and ``projectInfo`` for a run that changes the stack, ``lastDriftCheck`` and
    the Drifted condition for a drift check, the request's answer in ``operationRequest``,
    the schedule time it ran for; ``currentUpdate`` is cleared if it named this run.
    ``generation`` is the Stack's, for the conditions."""
    status = copy.deepcopy(status)
    conditions = list(conditions)
    events: list[Event] = []

    def drifted(verdict: DriftVerdict) -> list[Condition]:
        return set_condition(
            conditions,
            CONDITION_DRIFTED,
            verdict.status,
            verdict.reason,
            verdict.message,
            now=now,
            observed_generation=generation,
        )

    if current_update(status).get("name") == job_name:
        status.pop("currentUpdate", None)
    result = outcome.result
    record = status.get("approval") or {}
    if run.kind == "approval":
        record = status["approval"] = folded_preview(record, run, job_name, outcome)
        if record["state"] == "Pending":
            events.append(
                Event(
                    "Normal",
                    EVENT_PLAN_SAVED,
                    f"plan {record['planID']} awaits approval: {record['summary']}",
                )
            )
    elif changes_stack(run) and run.plan:
        status["approval"] = folded_update(record, run, job_name, outcome)
    if run.kind == "drift":
        status["lastDriftCheck"] = folded_drift_check(
            last_drift_check(status), run, job_name, outcome
        )
        verdict = drift_verdict(job_name, outcome)
        conditions = drifted(verdict)
        if verdict.reason == DRIFT_DETECTED_REASON:
            events.append(Event("Warning", EVENT_DRIFT_DETECTED, verdict.message))
    elif changes_stack(run):
        previous = status.get("lastUpdate")
        status["lastUpdate"] = folded_last_update(previous, run, job_name, outcome)
        outputs = folded_outputs(status.get("outputs"), run, outcome)
        if outputs is not None:
            status["outputs"] = outputs
        if outcome.succeeded and result is not None and result.project_info is not None:
            status["projectInfo"] = result.project_info.model_dump(mode="json")
        if outcome.succeeded and run.trigger.startswith(REMEDIATE_TRIGGER_PREFIX):
            conditions = drifted(
                DriftVerdict("False", REMEDIATED_REASON, f"drift was remediated by {job_name}")
            )
    answered = folded_operation_request(operation_request_status(status), run, job_name, outcome)
    if answered is not None:
        status["operationRequest"] = answered
    if run.trigger.startswith(SCHEDULE_TRIGGER_PREFIX):
        moment = newer_schedule_time(
            status.get("lastScheduleTime"), run.trigger.removeprefix(SCHEDULE_TRIGGER_PREFIX)
        )
        if moment is not None:
            status["lastScheduleTime"] = moment
    for cleared in result.cleared_locks if result is not None else []:
        events.append(Event("Warning", EVENT_STALE_LOCK_REMOVED, f"{job_name}: {cleared}"))
    if outcome.result_event is not None:
        events.append(outcome.result_event)
    if outcome.succeeded:
        events.append(Event("Normal", EVENT_CREATED, f"{run.operation} {job_name} succeeded"))
    else:
        events.append(
            Event(
                "Warning",
                failure_event_reason(outcome),
                f"{run.operation} {job_name} failed: {outcome.message}",
            )
        )
    return FoldedRun(status, conditions, events)


_STEP_EVENT_REASONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "gitAuthentication": EVENT_GIT_AUTHENTICATION_FAILURE,
        "stackInitialization": EVENT_INITIALIZATION_FAILURE,
        "outputRetrieval": EVENT_OUTPUT_RETRIEVAL_FAILURE,
    }
)


def failure_event_reason(outcome: Outcome) -> str:
    """The reason of the Warning Event about a failed run, as PKO names the same failure:
    another update holds the stack's lock (``UpdateConflict``), or the run stopped at a step
    with a reason of its own (the result's ``failedStep``); otherwise ``StackUpdateFailure``."""
    if outcome.reason == "UpdateConflict":
        return EVENT_UPDATE_CONFLICT_DETECTED
    step = outcome.result.failed_step if outcome.result is not None else None
    return _STEP_EVENT_REASONS.get(step or "", EVENT_UPDATE_FAILURE)


def metric_result(outcome: Outcome) -> str:
    """The ``result`` label of ``pkobatch_stack_operations_total``."""
    if outcome.succeeded:
        return "succeeded"
    return {
        "UpdateConflict": "conflict",
        "Cancelled": "cancelled",
        "DeadlineExceeded": "timeout",
    }.get(outcome.reason, "failed")
