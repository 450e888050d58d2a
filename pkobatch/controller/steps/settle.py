"""Settling the current run: fold a finished or vanished Job, adopt an orphaned one.

``status.currentUpdate`` names the Stack's Job. Once it has finished, its result is folded —
only one its pod vouches for, or sent itself in its termination message (then the result
ConfigMap is created here, ``Decision.create_results``), ``fold.trusted_result`` — or the
reason it has none; if it has vanished, an ``Interrupted`` failure. With no current run but
an active Job of this Stack (a crash between creating the Job and writing status), that Job
is adopted. A spec change (new generation) replaces a sync run whose pod has not started
its ``pulumi`` container (pending, image pull failure, missing Secret), as PKO does: that run
is folded as ``Superseded`` and its Job deleted in the foreground. How a finished run
becomes status is ``fold.fold_run``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pkobatch.api.constants import RECONCILING_PROCESSING_REASON
from pkobatch.api.objects import job_finished
from pkobatch.api.run import Run, result_config_map, result_labels
from pkobatch.api.status import last_drift_check, last_update, operation_request_status
from pkobatch.api.timestamps import parse_time
from pkobatch.controller.decision import FinishedRun
from pkobatch.controller.fold import changes_stack, fold_run
from pkobatch.controller.outcome import (
    POD_CREATION_GRACE,
    POD_CREATION_RECHECK,
    Outcome,
    job_deleting,
    job_outcome,
    job_without_pod,
    next_pod_start_check,
    pod_creation_outcome,
    pod_start_outcome,
    run_not_started,
    superseded,
    superseded_outcome,
    vanished_outcome,
)
from pkobatch.controller.steps.draft import Draft, creation, running_message
from pkobatch.controller.steps.runs import repair_inputs
from pkobatch.controller.steps.saved_plans import discard_saved_plan


def settle_current(draft: Draft) -> None:
    """Fold the current run if it has ended or vanished; with none, adopt the newest active
    Job of the Stack that no status field records."""
    name = draft.current_name()
    if name:
        job = draft.jobs.get(name)
        if job is None:
            fold(draft, draft.run_of(name, None), name, vanished_outcome(name, draft.now), None)
        else:
            fold_job(draft, job)
        return
    recorded = {
        last_update(draft.status).get("name"),
        operation_request_status(draft.status).get("jobName"),
        last_drift_check(draft.status).get("name"),
        (draft.status.get("approval") or {}).get("previewJob"),
    }
    orphans = [
        j
        for name, j in draft.jobs.items()
        if name not in recorded
        and not job_finished(j)
        and not job_deleting(j)
        and Run.from_job(j) is not None
    ]
    if orphans:
        job = max(orphans, key=creation)
        run = Run.from_job(job)
        assert run is not None
        draft.set_current(run, str(job["metadata"]["name"]))
        repair_inputs(draft, job, run)
        # Unfinished: only says when to look at its pod, as for a Job this controller made.
        fold_job(draft, job)


def fold_job(draft: Draft, job: Mapping[str, Any]) -> bool:
    """Fold ``job`` if it has ended (True), else look again in time (False)."""
    name = str(job["metadata"]["name"])
    if job_finished(job) and name not in draft.obs.run_pods:
        # Its result is trusted only as its pod vouches for it, and the observer reads
        # the pods of the current run only: make it current, fold it next time.
        if draft.current_name() != name:
            run = draft.run_of(name, job)
            draft.set_current(run, name)
            if changes_stack(run):
                draft.reconciling(RECONCILING_PROCESSING_REASON, running_message(run, name))
        draft.requeue_in(1.0)
        return False
    pods = draft.obs.run_pods.get(name, ())
    outcome = job_outcome(job, draft.obs.results.get(name), draft.uid, draft.now, pods)
    # A run whose pod cannot be created, or cannot start: its Job must go so the retry
    # is not blocked by it.
    stuck = None if outcome is not None else pod_start_outcome(job, pods, draft.now)
    if (
        outcome is None
        and stuck is None
        and name in draft.obs.run_pods
        and superseded(job, draft.generation)
        and run_not_started(job, pods)
    ):
        # A spec change replaces a run that has not started, as PKO does. Foreground:
        # should its pod start at this very moment, the Job stays (and blocks the new
        # run) until that pod is gone, as for a cancelled run.
        draft.delete_job(job, foreground=True)
        outcome = superseded_outcome(name, draft.generation, draft.now)
    if outcome is None and stuck is None and job_without_pod(job, draft.now):
        failure = draft.obs.pod_creation_failures.get(name)
        if not failure:
            # Look for the Job controller's FailedCreate Event again in a while.
            draft.look_at_pod_in(name, POD_CREATION_RECHECK)
            return False
        stuck = pod_creation_outcome(job, failure, draft.now)
    if stuck is not None:
        draft.delete_job(job)
        outcome = stuck
    if outcome is None:
        created = parse_time(creation(job))
        status = job.get("status") or {}
        if created is not None and not status.get("active"):
            draft.look_at_pod_in(name, max(created + POD_CREATION_GRACE - draft.now, timedelta(0)))
        elif created is not None and not status.get("ready"):
            # Look at its pod when it may have been unable to start for too long.
            check = next_pod_start_check(created, draft.now)
            draft.look_at_pod_in(name, max(check - draft.now, POD_CREATION_RECHECK))
        return False
    if outcome.result is not None and name not in draft.obs.results:
        # Its pod sent the result itself: the ConfigMap keeps it for history, as the
        # runner's would have.
        labels = (job.get("metadata") or {}).get("labels") or {}
        draft.decision.create_results.append(
            result_config_map(
                outcome.result,
                name=name,
                namespace=draft.namespace,
                labels=result_labels(labels, draft.name, outcome.result.operation),
                job_uid=str(job["metadata"].get("uid") or ""),
            )
        )
    started = parse_time((job.get("status") or {}).get("startTime"))
    fold(draft, draft.run_of(name, job), name, outcome, started)
    return True


def fold(draft: Draft, run: Run, name: str, outcome: Outcome, started: datetime | None) -> None:
    """Record how run ``name`` ended (``fold.fold_run``, the approval record included).
    An update that applied a saved plan used it up: its preview Job, named by the
    record as it was before the fold, is deleted with the saved plan's Secret."""
    if changes_stack(run) and run.plan:
        discard_saved_plan(draft, draft.status.get("approval") or {})
    folded = fold_run(
        draft.status,
        draft.conditions,
        run,
        name,
        outcome,
        now=draft.now,
        generation=draft.generation,
    )
    draft.status = folded.status
    draft.conditions = folded.conditions
    draft.decision.finished.append(FinishedRun(run, name, outcome, started))
    for event in folded.events:
        draft.event(event.type, event.reason, event.message)
