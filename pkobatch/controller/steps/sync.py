"""The sync steps: a valid spec, suspend, the hold after a requested destroy, and PKO's
sync decision (``isSynced``) with its prerequisites.

When a Stack runs again (initial run, new generation, reconcile request or commit, resync,
failure backoff) and the conditions while it waits (Ready, retrying, Stalled) are
``controller.retry``'s; a due ``spec.schedule`` time is ``controller.schedule``'s. The sync
starts ``up`` (``preview`` for a ``spec.preview`` Stack), or with approval required, the
preview that saves an update plan (``saved_plans.approve_first``).
"""

from __future__ import annotations

from typing import Final

from pkobatch.api.annotations import reconcile_request
from pkobatch.api.conditions import remove_condition, set_condition
from pkobatch.api.constants import (
    CONDITION_APPROVAL_PENDING,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    EVENT_CONFIG_INVALID,
    RECONCILING_PREREQUISITE_REASON,
    STALLED_DESTROY_HELD_REASON,
    STALLED_PREREQUISITE_CYCLE_REASON,
    STALLED_SPEC_INVALID_REASON,
    SUSPENDED_REASON,
)
from pkobatch.api.durations import parse_duration
from pkobatch.api.prerequisites import prerequisite_cycle
from pkobatch.api.run import SCHEDULE_TRIGGER_PREFIX, Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.status import last_update, operation_request_status
from pkobatch.api.timestamps import format_time, parse_time
from pkobatch.controller import approval
from pkobatch.controller.retry import sync_decision
from pkobatch.controller.schedule import newer_schedule_time, scheduled_run_due
from pkobatch.controller.steps.draft import DONE, NEXT, Draft, Refold, StepResult
from pkobatch.controller.steps.runs import start_run
from pkobatch.controller.steps.saved_plans import (
    approval_condition,
    approve_first,
    end_saved_plan,
)

# How often to look again while waiting for prerequisites (they send no event of their own
# when they only age).
PREREQUISITE_RECHECK: Final = 30.0


def valid_spec(draft: Draft) -> StepResult:
    """DONE (Stalled/SpecInvalid, naming every problem) when the spec does not parse."""
    if draft.spec is not None:
        return NEXT
    draft.stalled(
        STALLED_SPEC_INVALID_REASON, "; ".join(draft.check.problems), EVENT_CONFIG_INVALID
    )
    return DONE


def suspend(draft: Draft) -> StepResult:
    """``spec.suspend``: nothing starts (a running Job is still folded, by ``settle``). DONE
    with Ready from the last run, and Stalled when that did not succeed; else NEXT."""
    if not draft.valid_spec().suspend:
        return NEXT
    last = last_update(draft.status)
    ok = last.get("state") == "succeeded"
    message = "reconciliation is suspended (spec.suspend: true); " + (
        f"the last {last.get('type')} succeeded"
        if ok
        else (f"the last {last.get('type')} failed" if last else "nothing has run yet")
    )
    draft.conditions = set_condition(
        draft.conditions,
        CONDITION_READY,
        "True" if ok else "False",
        SUSPENDED_REASON,
        message,
        now=draft.now,
        observed_generation=draft.generation,
    )
    draft.conditions = remove_condition(draft.conditions, CONDITION_RECONCILING)
    if ok:
        draft.conditions = remove_condition(draft.conditions, CONDITION_STALLED)
        return DONE
    # Not Ready and nothing in progress: without Stalled, kstatus (Flux's healthChecks)
    # and Argo CD would read the Stack as in progress and wait for a run that never
    # comes. Nothing happens until the user resumes it, which is what Stalled means.
    draft.conditions = set_condition(
        draft.conditions,
        CONDITION_STALLED,
        "True",
        SUSPENDED_REASON,
        message + "; resume it (spec.suspend: false) to run",
        now=draft.now,
        observed_generation=draft.generation,
    )
    return DONE


_REQUESTS_KEEPING_A_HOLD: Final = ("preview", "refresh", "unlock", "cancel")


def destroy_hold(draft: Draft) -> StepResult:
    """After a requested destroy, nothing runs until the spec changes or `up` is asked:
    DONE (Stalled/DestroyHeld) while that holds, else NEXT."""
    last = last_update(draft.status)
    request = operation_request_status(draft.status)
    destroyed = request.get("operation") == "destroy" and request.get("jobName") == last.get("name")
    held = (
        last.get("type") == "destroy"
        # A request that changes no resource, answered since the destroy (an unlock after a
        # destroy that met a stale lock), does not end the hold either.
        and (destroyed or request.get("operation") in _REQUESTS_KEEPING_A_HOLD)
        and last.get("generation") == draft.generation
        and (last.get("reconcileRequest") or "") == draft.request
    )
    if not held:
        return NEXT
    if last.get("state") == "succeeded":
        message = (
            f"destroyed on request ({request.get('request')}); no update runs until the "
            f"spec changes or an up is requested (pkobatch up {draft.name})"
        )
    else:
        message = (
            f"the requested destroy failed: {last.get('message')}; request destroy again, "
            f"or request an up (pkobatch up {draft.name})"
        )
    draft.stalled(STALLED_DESTROY_HELD_REASON, message)
    return DONE


def sync(draft: Draft) -> StepResult:
    """PKO's sync decision (``retry.sync_decision``: initial run, new generation, reconcile
    request or commit, resync, retry after backoff) or a due ``spec.schedule`` time: start
    the normal operation — once the prerequisites are ready, and through a saved update plan
    when approval is required — and return DONE. In sync: the resting conditions (Ready,
    retrying, or Stalled) and NEXT, to the schedules."""
    spec = draft.valid_spec()
    commit = draft.commit
    verdict = sync_decision(
        last_update(draft.status),
        spec,
        generation=draft.generation,
        reconcile_request=draft.request,
        commit=commit,
        now=draft.now,
        settings=draft.settings,
    )
    if verdict.recheck is not None:
        draft.requeue_in(verdict.recheck)
    reason = verdict.reason
    due = scheduled_run_due(spec, draft.meta, draft.status, draft.now, draft.settings)
    last = last_update(draft.status)
    if reason is None and due is not None:
        reason = f"scheduled run {format_time(due.time)}"
        if due.skipped:
            reason += f" ({due.skipped} earlier scheduled time(s) skipped)"
    requires_approval = approval.required(spec.to_manifest())
    if not requires_approval:
        end_saved_plan(draft, "Superseded", "spec.approval.required is off")
        draft.conditions = remove_condition(draft.conditions, CONDITION_APPROVAL_PENDING)
    if reason is None:
        if requires_approval:
            end_saved_plan(draft, "Superseded", "the Stack is in sync without it")
            approval_condition(draft, "False", "NoChangePending", "no change awaits approval")
        draft.resting(last)
        return NEXT
    if not _prerequisites_ready(draft, spec):
        return DONE
    trigger = f"after:{last.get('name') or ''}:{commit or ''}"
    if due is not None:
        # A run that starts anyway covers the due schedule time.
        _record_schedule_time(draft, format_time(due.time))
        if reason.startswith("scheduled run"):
            trigger = f"{SCHEDULE_TRIGGER_PREFIX}{format_time(due.time)}"
    if requires_approval:
        refold = approve_first(draft, spec, commit, trigger, reason)
        return refold if refold is not None else DONE
    run = Run(
        operation="preview" if spec.preview else "up",
        kind="sync",
        generation=draft.generation,
        reconcile_request=draft.request,
        commit=commit or "",
        trigger=trigger,
    )
    started = start_run(draft, run, reason)
    return started if isinstance(started, Refold) else DONE


def _record_schedule_time(draft: Draft, moment: str) -> None:
    recorded = newer_schedule_time(draft.status.get("lastScheduleTime"), moment)
    if recorded is not None:
        draft.status["lastScheduleTime"] = recorded


def _prerequisites_ready(draft: Draft, spec: StackSpec) -> bool:
    if _prerequisite_cycle(draft, spec):
        return False
    waiting: list[str] = []
    for prerequisite in spec.prerequisites or ():
        other = draft.obs.prerequisites.get(prerequisite.name)
        if other is None:
            waiting.append(f"{prerequisite.name} does not exist")
            continue
        other_meta = other.get("metadata") or {}
        other_last = last_update(other.get("status"))
        other_request = reconcile_request(other)
        if (
            other_last.get("state") != "succeeded"
            or other_last.get("type") == "destroy"
            or other_last.get("generation") != other_meta.get("generation")
            or (other_last.get("reconcileRequest") or "") != other_request
        ):
            waiting.append(f"{prerequisite.name} has not succeeded at its current spec")
            continue
        within = (
            prerequisite.requirement.succeeded_within_duration if prerequisite.requirement else None
        )
        succeeded_at = parse_time(other_last.get("lastResyncTime"))
        if within and (succeeded_at is None or draft.now - succeeded_at > parse_duration(within)):
            waiting.append(f"{prerequisite.name} last succeeded more than {within} ago")
            poke = f"after-{other_last.get('name')}"
            if other_request != poke:
                draft.decision.prerequisite_requests[prerequisite.name] = poke
    if not waiting:
        return True
    draft.reconciling(
        RECONCILING_PREREQUISITE_REASON, "waiting for prerequisites: " + "; ".join(waiting)
    )
    draft.requeue_in(PREREQUISITE_RECHECK)
    return False


def _prerequisite_cycle(draft: Draft, spec: StackSpec) -> bool:
    """Stalled when the prerequisites lead to a cycle: its Stacks would wait forever.
    Looked at again every recheck, since an edit of any Stack on it can end it."""
    graph = {
        **draft.obs.prerequisite_graph,
        draft.name: [p.name for p in spec.prerequisites or ()],
    }
    cycle = prerequisite_cycle(draft.name, graph)
    if not cycle:
        return False
    path = " -> ".join(cycle)
    where = (
        f"spec.prerequisites form a cycle: {path}"
        if draft.name in cycle
        else f"its prerequisites wait on a cycle: {path}"
    )
    draft.stalled(
        STALLED_PREREQUISITE_CYCLE_REASON,
        f"{where}; no Stack on it can ever run. Remove one of these prerequisites to "
        "break the cycle",
    )
    draft.requeue_in(PREREQUISITE_RECHECK)
    return True
