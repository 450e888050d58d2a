"""The schedules step: drift remediation and drift checks (``spec.driftDetection``), and
the requeue for the next cron times (``controller.schedule`` computes them).

``spec.schedule``'s runs of the normal operation are the sync step's (``sync.sync``): a due
schedule time is one more reason to sync.
"""

from __future__ import annotations

from pkobatch.api.conditions import find_condition
from pkobatch.api.constants import CONDITION_DRIFTED
from pkobatch.api.run import DRIFT_TRIGGER_PREFIX, REMEDIATE_TRIGGER_PREFIX, Run
from pkobatch.api.status import last_drift_check, last_update
from pkobatch.api.timestamps import format_time, parse_time
from pkobatch.controller.schedule import drift_check_due, next_schedule_times
from pkobatch.controller.steps.draft import DONE, Draft, Refold, StepResult
from pkobatch.controller.steps.runs import start_run


def schedules(draft: Draft) -> StepResult:
    """Look again at the next cron time; for a deployed Stack with drift detection, start
    the update that remediates a detected drift, else the drift check that is due. The
    last step: always DONE (or Refold)."""
    spec = draft.valid_spec()
    for moment in next_schedule_times(spec, draft.meta, draft.now):
        draft.requeue_in(moment - draft.now)
    last = last_update(draft.status)
    deployed = last.get("state") == "succeeded" and last.get("type") == "up"
    drift = spec.drift_detection
    if drift is None or not deployed:
        return DONE
    check = last_drift_check(draft.status)
    drifted = find_condition(draft.conditions, CONDITION_DRIFTED)
    checked_at = parse_time(check.get("time"))
    updated_at = parse_time(last.get("lastResyncTime"))
    if (
        drift.remediate
        and drifted is not None
        and drifted.status == "True"
        and checked_at is not None
        and (updated_at is None or updated_at <= checked_at)
    ):
        run = Run(
            operation="up",
            kind="sync",
            generation=draft.generation,
            reconcile_request=draft.request,
            commit=draft.commit or "",
            trigger=f"{REMEDIATE_TRIGGER_PREFIX}{check.get('name')}",
        )
        started = start_run(draft, run, "remediating drift")
        return started if isinstance(started, Refold) else DONE
    due = drift_check_due(spec, draft.meta, draft.status, draft.now, draft.settings)
    if due is None:
        return DONE
    run = Run(
        operation="refresh",
        kind="drift",
        generation=draft.generation,
        reconcile_request=draft.request,
        commit=draft.commit or "",
        trigger=f"{DRIFT_TRIGGER_PREFIX}{format_time(due.time)}",
    )
    started = start_run(draft, run, f"drift check {format_time(due.time)}")
    if isinstance(started, Refold):
        return started
    if started:
        draft.status["lastDriftCheck"] = {
            **check,
            "scheduledTime": format_time(due.time),
        }
    return DONE
