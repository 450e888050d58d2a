"""The reconcile decision: observed objects in, actions out (pure).

``plan(observed, settings, template)`` reads one Stack with its Jobs and result ConfigMaps
(and the polled branch head, its prerequisites, whether a run slot is free) and returns a
``Plan``: the complete desired status, at most one Job to create, Jobs to delete, the
finalizer change, Events, prerequisite pokes, and when to look again. It never blocks and
never does I/O, so every rule below has unit tests.

Order of the decision, which is also the order of priority:

1. **Settle the current run.** ``status.currentUpdate`` names the Stack's Job. Once it has
   finished, fold its result — only one its pod vouches for, or sent itself in its
   termination message (then the result ConfigMap is created here, ``create_results``),
   ``fold.trusted_result`` — or the reason it has none; if it has vanished, fold an
   ``Interrupted`` failure. With no
   current run but an active Job of this Stack (a crash between creating the Job and
   writing status), adopt that Job.
2. **Deletion.** ``pkobatch.io/abandon: "true"`` drops the finalizer (any other value is
   refused, so the destroy runs). Otherwise wait for a running Job, then remove the
   finalizer at once — unless ``destroyOnFinalize`` (and not ``preview``) asks for a
   destroy first, retried with PKO's backoff; the finalizer goes only after a destroy that
   succeeded.
3. **Operation requests** (``pkobatch.io/operation-request: <op>:<token>``, see
   docs/operations.md), handled once each, acknowledged in ``status.operationRequest``.
4. **One run at a time.** While any Job of the Stack is active, nothing else starts —
   except that a spec change (new generation) replaces a sync run whose pod has not
   started its ``pulumi`` container (pending, image pull failure, missing Secret), as PKO
   does: that run is folded as ``Superseded`` and its Job deleted in the foreground.
5. **Suspend**, **invalid spec**, **source** (branch head), **hold after a requested
   destroy**, **prerequisites** (a cycle among them stalls).
6. **PKO's sync decision** (``isSynced``): initial run, new generation, new reconcile
   request, new commit, resync, retry after backoff — else Ready, retrying, or Stalled.
7. **Schedules**: ``spec.schedule`` runs, drift remediation, drift checks.

Every annotation a user writes on the Stack is read through its rule in
``pkobatch.api.annotations``: a value that breaks it is ignored in the safe direction and
reported (``AnnotationsRefused``, or the request's ``Rejected`` answer), never copied.

Job names are deterministic per decision, so when a Job with the name this decision would
create already exists and has finished (its result was never folded), it is folded
instead of starting another run — or, when its pods were not observed (the observer reads
them for the current run only), made the current run, to be folded by the next reconcile.

This module holds the order of the decision and turns it into a ``Plan``; the rules it
applies live with what they are about: how a finished run becomes status (``lastUpdate``,
``lastDriftCheck``, the Drifted condition, the answer to a request, the approval record of
a saved plan) in ``fold.py``; the decisions about saved plans in ``approval.py``; when a
Stack runs again (PKO's ``isSynced``, failure backoff, Ready/retrying/Stalled while
waiting) in ``retry.py``; cron schedules in ``schedule.py``; the Job for a run in
``jobs.py``; the operation-request protocol in ``pkobatch.api.operation_request``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast

from pkobatch.api.annotations import (
    accepted,
    reconcile_request,
    recorded_request,
    refusal,
    refusals,
)
from pkobatch.api.conditions import (
    READY_MESSAGE,
    find_condition,
    mark_ready,
    mark_reconciling,
    mark_stalled,
    remove_condition,
    set_condition,
)
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    ANNOTATION_INVALID_REASON,
    APPROVE_ANNOTATION,
    CONDITION_ANNOTATIONS_REFUSED,
    CONDITION_APPROVAL_PENDING,
    CONDITION_DRIFTED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    EVENT_CONFIG_INVALID,
    EVENT_UPDATE_DETECTED,
    FINALIZER,
    FLUX_SOURCE_GROUP,
    FLUX_SOURCE_VERSION,
    OPERATION_REQUEST_ANNOTATION,
    OPERATIONS,
    RECONCILE_REQUEST_ANNOTATION,
    RECONCILING_APPROVAL_PENDING_REASON,
    RECONCILING_PREREQUISITE_REASON,
    RECONCILING_PROCESSING_REASON,
    RECONCILING_RETRY_REASON,
    RECONCILING_WAITING_FOR_SOURCE_REASON,
    REJECT_ANNOTATION,
    STALLED_DESTROY_HELD_REASON,
    STALLED_NAMESPACE_TERMINATING_REASON,
    STALLED_PREREQUISITE_CYCLE_REASON,
    STALLED_RECONCILE_ERROR_REASON,
    STALLED_SOURCE_UNAVAILABLE_REASON,
    STALLED_SPEC_INVALID_REASON,
    STALLED_UPDATE_FAILED_REASON,
    SUSPENDED_REASON,
    Operation,
)
from pkobatch.api.durations import parse_duration
from pkobatch.api.messages import bound_message
from pkobatch.api.noop import noop_fields_in_use
from pkobatch.api.objects import JSON, job_finished
from pkobatch.api.operation_request import REQUEST_OPERATIONS, RequestState, split_request
from pkobatch.api.prerequisites import prerequisite_cycle
from pkobatch.api.program import program_revision
from pkobatch.api.run import ProjectInfo
from pkobatch.api.stack import Condition, FluxSource, SpecCheck, StackSpec, load_stack_spec
from pkobatch.api.status import (
    LastUpdate,
    StatusObject,
    current_update,
    last_drift_check,
    last_update,
    operation_request_status,
)
from pkobatch.api.timestamps import format_time, parse_time
from pkobatch.config import Settings
from pkobatch.controller import approval
from pkobatch.controller.fold import (
    POD_CREATION_GRACE,
    POD_CREATION_RECHECK,
    Event,
    EventType,
    Outcome,
    cancelled_outcome,
    changes_stack,
    fold_run,
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
from pkobatch.controller.jobs import (
    DRIFT_TRIGGER_PREFIX,
    REMEDIATE_TRIGGER_PREFIX,
    SCHEDULE_TRIGGER_PREFIX,
    JobBuildError,
    Run,
    RunKind,
    RunObjects,
    build_run,
    job_name,
)
from pkobatch.controller.retry import (
    cooldown,
    cooldown_remaining,
    failure_count,
    resting_state,
    sync_decision,
)
from pkobatch.controller.schedule import (
    drift_check_due,
    newer_schedule_time,
    next_schedule_times,
    scheduled_run_due,
)
from pkobatch.runner.result import result_config_map, result_labels

# How often to look again while waiting on something that sends no event of its own.
PREREQUISITE_RECHECK: Final = 30.0
SLOT_RECHECK: Final = 30.0
WATCH_RECHECK: Final = 5.0
NAMESPACE_RECHECK: Final = 30.0
# Result ConfigMaps whose Job is gone are deleted after this age (never a fresh one whose
# Job the cache has not shown yet).
ORPHAN_RESULT_AGE: Final = timedelta(minutes=10)

# Reasons of pkobatch's own Events and of the Drifted condition.
EVENT_DESTROYED: Final = "StackDestroyed"
EVENT_ABANDONED: Final = "FinalizerAbandoned"
EVENT_REQUEST_REJECTED: Final = "OperationRequestRejected"
EVENT_SPEC_NOTES: Final = "SpecNotes"
EVENT_PLAN_APPROVED: Final = "PlanApproved"
EVENT_PLAN_ENDED: Final = "PlanDiscarded"
EVENT_ANNOTATION_REFUSED: Final = "AnnotationRefused"
# The annotations whose refusal the AnnotationsRefused condition reports; an operation
# request's is answered in status.operationRequest.
CONDITION_CHECKED_ANNOTATIONS: Final = (
    RECONCILE_REQUEST_ANNOTATION,
    ABANDON_ANNOTATION,
    APPROVE_ANNOTATION,
    REJECT_ANNOTATION,
)
# Finished Jobs named in a run's snapshot (the Stack's history keeps a few more at most).
MAX_ENDED_RUNS: Final = 20


@dataclass(frozen=True)
class SourceHead:
    """The polled head of the branch a Stack tracks (``commit`` None: not known yet)."""

    commit: str | None = None
    error: str = ""


@dataclass(frozen=True)
class SourceObject:
    """The Program (or Flux source) a Stack names; ``obj`` None: it does not exist."""

    kind: str
    name: str
    obj: Mapping[str, Any] | None = None
    # False while the watch of a Flux kind has not listed yet (obj None means nothing then).
    watched: bool = True
    # Why listing or watching the Flux kind last failed ("" when it did not).
    error: str = ""


@dataclass(frozen=True)
class RunCheck:
    """``run_refusal``'s answer for the observed Stack (its spec valid), with the
    controller's settings and template: None when its Job may be created."""

    refusal: str | None


@dataclass(frozen=True)
class Observed:
    """Everything ``plan`` may look at, read from the stores (and a few live reads)."""

    stack: Mapping[str, Any]
    jobs: Sequence[Mapping[str, Any]]
    # The Stack's result ConfigMaps by name (name == Job name).
    results: Mapping[str, Mapping[str, Any]]
    now: datetime
    # For a Stack tracking a branch; None when the Stack tracks none.
    source: SourceHead | None = None
    # For a Stack with spec.programRef (or spec.fluxSource): the object it names.
    source_object: SourceObject | None = None
    # The Stacks named in spec.prerequisites (None: does not exist).
    prerequisites: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    # Name -> prerequisites' names of the Stacks in the store reachable through
    # spec.prerequisites, to find a cycle among them.
    prerequisite_graph: Mapping[str, Sequence[str]] = field(default_factory=dict)
    namespace_terminating: bool = False
    # False when the cluster-wide cap of active Jobs is reached (see reconcile.Admission).
    slot_available: bool = True
    # The API server's message when it refused the Job this decision creates.
    job_rejected: str = ""
    # Job name -> why the Job controller cannot create its pod (its FailedCreate Event);
    # asked only for the current Job when it has no pod (see fold.job_without_pod).
    pod_creation_failures: Mapping[str, str] = field(default_factory=dict)
    # Job name -> its pods; read only for the current Job: once it has finished (its pod
    # vouches for its result, fold.trusted_result), or when they alone can tell why it cannot
    # start (see fold.pod_status_matters).
    run_pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    # The Stack's managedFields, read live only when it approves its pending plan (they name
    # the approver; the cache drops them).
    managed_fields: Sequence[Mapping[str, Any]] = ()
    # ``run_refusal``'s answer when the observer has already asked it (to decide whether to
    # poll the branch): building the probe Job is the costliest step of a reconcile, so it
    # is done once. None: ``plan`` asks itself.
    run_check: RunCheck | None = None


@dataclass(frozen=True)
class JobDeletion:
    name: str
    uid: str
    # Foreground for a cancelled run: the Job stays (and blocks new runs) until its pod
    # is gone, so two Pulumi processes never work on one stack.
    foreground: bool = False


@dataclass(frozen=True)
class FinishedRun:
    """A run folded in this reconcile (for metrics and for waking dependent Stacks)."""

    run: Run
    job_name: str
    outcome: Outcome
    started_at: datetime | None


@dataclass
class Plan:
    status: StatusObject | None
    """The desired status; None: leave status alone (the Stack is going away)."""
    finalizer: Literal["add", "remove"] | None = None
    create_job: JSON | None = None
    # What the pod of the new (or an adopted) Job reads besides the Job: inline secret values,
    # a large snapshot. Created after the Job, owned by it.
    create_inputs: tuple[JSON, ...] = ()
    inputs_job: str = ""
    run: Run | None = None
    delete_jobs: list[JobDeletion] = field(default_factory=list)
    delete_results: list[str] = field(default_factory=list)
    # Result ConfigMaps of runs that sent their result in their pod's termination message
    # (they may not write it): created before the status that folds them.
    create_results: list[JSON] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Prerequisite Stack name -> new value of its reconciliation-request annotation.
    prerequisite_requests: dict[str, str] = field(default_factory=dict)
    finished: list[FinishedRun] = field(default_factory=list)
    requeue_after: float | None = None
    # Set when planning failed (see ``plan``): the error, for the controller's log.
    error: str = ""
    # The status as decided, also when ``status`` is None because the Stack is released:
    # notifications compare it with the old one (a destroy on deletion is an event too).
    decided_status: StatusObject | None = None


def plan(observed: Observed, settings: Settings, template: Mapping[str, Any]) -> Plan:
    """The decision for one Stack. Never raises: a bug met while planning one Stack becomes
    ``Stalled/ReconcileError`` with the error on that Stack (and ``Plan.error``), instead of
    a reconcile that fails and is retried forever."""
    try:
        return _Planner(observed, settings, template).plan()
    except Exception as exc:
        return _error_plan(observed, exc)


def _error_plan(observed: Observed, exc: Exception) -> Plan:
    meta: Mapping[str, Any] = observed.stack.get("metadata") or {}
    error = bound_message(f"{type(exc).__name__}: {exc}")
    if meta.get("deletionTimestamp") and FINALIZER not in (meta.get("finalizers") or ()):
        return Plan(status=None, error=error)
    message = bound_message(
        f"pkobatch could not plan this Stack ({error}). This is a pkobatch bug: please report "
        f"it with this message. Editing the spec or setting {RECONCILE_REQUEST_ANNOTATION} "
        "makes the controller try again."
    )
    status = cast(StatusObject, copy.deepcopy(dict(observed.stack.get("status") or {})))
    raw_generation = meta.get("generation")
    generation = raw_generation if isinstance(raw_generation, int) else 0
    status["observedGeneration"] = generation
    conditions = _parse_conditions(status.get("conditions"))
    previous = find_condition(conditions, CONDITION_STALLED)
    conditions = mark_stalled(
        conditions,
        STALLED_RECONCILE_ERROR_REASON,
        message,
        now=_truncated(observed.now),
        observed_generation=generation,
    )
    status["conditions"] = [c.to_manifest() for c in conditions]
    events = []
    if previous is None or previous.reason != STALLED_RECONCILE_ERROR_REASON:
        events.append(Event("Warning", STALLED_RECONCILE_ERROR_REASON, message))
    return Plan(status=status, events=events, error=error)


class _Refold(Exception):
    """The Job this decision would create exists and has finished: fold it and decide again."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        super().__init__(job.get("metadata", {}).get("name"))
        self.job = job


def _truncated(moment: datetime) -> datetime:
    """Kubernetes timestamps have whole seconds; status must not change on every pass."""
    return moment.replace(microsecond=0)


def _parse_conditions(raw: Any) -> list[Condition]:
    conditions = []
    for item in raw or ():
        try:
            conditions.append(Condition.model_validate(item))
        except ValueError:
            continue
    return conditions


def _creation(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


class _Planner:
    def __init__(self, observed: Observed, settings: Settings, template: Mapping[str, Any]):
        self.obs = observed
        self.settings = settings
        self.template = template
        self.now = _truncated(observed.now)
        stack = observed.stack
        self.meta: Mapping[str, Any] = stack.get("metadata") or {}
        self.name = str(self.meta.get("name"))
        self.namespace = str(self.meta.get("namespace"))
        self.uid = str(self.meta.get("uid") or "")
        self.generation = int(self.meta.get("generation") or 0)
        self.annotations: Mapping[str, str] = self.meta.get("annotations") or {}
        self.request = reconcile_request(stack)
        self.old_status: Mapping[str, Any] = stack.get("status") or {}
        self.status = cast(StatusObject, copy.deepcopy(dict(self.old_status)))
        self.conditions = _parse_conditions(self.status.get("conditions"))
        self.check: SpecCheck = load_stack_spec(stack.get("spec") or {}, self.namespace)
        self.spec: StackSpec | None = self.check.spec if self.check.valid else None
        self.jobs = {str(j["metadata"]["name"]): j for j in observed.jobs}
        self.result = Plan(status=self.status)
        self.requeue: list[float] = []
        # A Job whose run is recorded but whose pod is still stopping: no new run yet.
        self.stopping = ""
        # Why ``_start`` could not create the run's Job (its build or the API server refused).
        self.start_refused = ""

    # -- entry ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        deleting = bool(self.meta.get("deletionTimestamp"))
        finalizers = self.meta.get("finalizers") or []
        if deleting and FINALIZER not in finalizers:
            return Plan(status=None)
        if not deleting and FINALIZER not in finalizers:
            self.result.finalizer = "add"
        self._observe_generation()
        self._refused_annotations()
        self._settle_current()
        for _ in range(3):
            try:
                if deleting:
                    self._finalize()
                else:
                    self._reconcile()
                break
            except _Refold as refold:
                if not self._fold_job(refold.job):
                    break
        self._prune_history()
        self.status["conditions"] = [c.to_manifest() for c in self.conditions]
        if not self.status["conditions"]:
            del self.status["conditions"]
        if self.result.status is not None:
            self.result.status = self.status
        self.result.decided_status = self.status
        positive = [r for r in self.requeue if r is not None]
        self.result.requeue_after = max(1.0, min(positive)) if positive else None
        return self.result

    # -- bookkeeping helpers ---------------------------------------------------------------

    def _event(self, event_type: EventType, reason: str, message: str) -> None:
        self.result.events.append(Event(event_type, reason, bound_message(message)))

    def _requeue_in(self, delay: timedelta | float) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        self.requeue.append(max(seconds, 1.0))

    def _reconciling(self, reason: str, message: str) -> None:
        self.conditions = mark_reconciling(
            self.conditions, reason, message, now=self.now, observed_generation=self.generation
        )

    def _stalled(self, reason: str, message: str, event_reason: str | None = None) -> None:
        previous = find_condition(self.conditions, CONDITION_STALLED)
        self.conditions = mark_stalled(
            self.conditions, reason, message, now=self.now, observed_generation=self.generation
        )
        changed = previous is None or (previous.reason, previous.message) != (reason, message)
        if changed:
            self._event("Warning", event_reason or reason, message)

    def _ready(self) -> None:
        # Argo CD and Flux show Ready's message as the Stack's health message: it must not
        # say "up to date" while a drift check says otherwise.
        drifted = find_condition(self.conditions, CONDITION_DRIFTED)
        message = (
            f"the last update succeeded, but {drifted.message}; see condition Drifted"
            if drifted is not None and drifted.status == "True"
            else READY_MESSAGE
        )
        self.conditions = mark_ready(
            self.conditions, now=self.now, observed_generation=self.generation, message=message
        )

    def _observe_generation(self) -> None:
        first_time = self.old_status.get("observedGeneration") != self.generation
        self.status["observedGeneration"] = self.generation
        self.status["observedReconcileRequest"] = self.request
        # Deletion raises the generation of a custom resource without a spec change: the
        # notes about the spec were given for it already.
        deleting = bool(self.meta.get("deletionTimestamp"))
        if first_time and not deleting and self.check.spec is not None:
            notes = list(self.check.alias_notes)
            notes += [
                f"{n.path} is ignored: {n.reason}" for n in noop_fields_in_use(self.check.spec)
            ]
            if notes:
                self._event("Normal", EVENT_SPEC_NOTES, "; ".join(notes))

    def _refused_annotations(self) -> None:
        """AnnotationsRefused names every annotation whose value breaks its rule (and is
        ignored); a Warning Event when that changes."""
        refused = refusals(self.obs.stack, CONDITION_CHECKED_ANNOTATIONS)
        if not refused:
            self.conditions = remove_condition(self.conditions, CONDITION_ANNOTATIONS_REFUSED)
            return
        message = bound_message("; ".join(refused))
        previous = find_condition(self.conditions, CONDITION_ANNOTATIONS_REFUSED)
        self.conditions = set_condition(
            self.conditions,
            CONDITION_ANNOTATIONS_REFUSED,
            "True",
            ANNOTATION_INVALID_REASON,
            message,
            now=self.now,
            observed_generation=self.generation,
        )
        if previous is None or previous.message != message:
            self._event("Warning", EVENT_ANNOTATION_REFUSED, message)

    # -- runs --------------------------------------------------------------------------------

    def _current_name(self) -> str:
        return str(current_update(self.status).get("name") or "")

    def _blocking_job(self) -> Mapping[str, Any] | None:
        """Any unfinished Job of the Stack, including one being deleted (its pod may run)."""
        current = self.jobs.get(self._current_name())
        if current is not None and not job_finished(current):
            return current
        active = [j for j in self.jobs.values() if not job_finished(j)]
        return max(active, key=_creation) if active else None

    def _ended_runs(self) -> list[str]:
        """The newest of this Stack's Jobs that have finished: the Job controller marks a
        Job finished only once none of its pods runs, so their Pulumi locks are stale."""
        ended = sorted(
            (j for j in self.jobs.values() if job_finished(j)), key=_creation, reverse=True
        )
        return [str(j["metadata"]["name"]) for j in ended[:MAX_ENDED_RUNS]]

    def _run_of(self, name: str, job: Mapping[str, Any] | None) -> Run:
        """The run a Job was for; inferred from status when the Job is gone."""
        if job is not None:
            run = Run.from_job(job)
            if run is not None:
                return run
        current = current_update(self.status)
        request = operation_request_status(self.status)
        operation = _operation_from_name(name)
        kind: RunKind = "sync"
        if request.get("jobName") == name and request.get("operation") != "cancel":
            kind = "request"
        elif (self.status.get("approval") or {}).get("previewJob") == name:
            kind = "approval"
        elif operation == "refresh":
            kind = "drift"
        return Run(
            operation=operation,
            kind=kind,
            generation=int(current.get("generation") or self.generation),
            reconcile_request=str(current.get("reconcileRequest") or ""),
            commit=str(current.get("commit") or ""),
            trigger="",
            request=str(request.get("request") or "") if kind == "request" else "",
        )

    def _settle_current(self) -> None:
        name = self._current_name()
        if name:
            job = self.jobs.get(name)
            if job is None:
                self._fold(self._run_of(name, None), name, vanished_outcome(name, self.now), None)
            else:
                self._fold_job(job)
            return
        recorded = {
            last_update(self.status).get("name"),
            operation_request_status(self.status).get("jobName"),
            last_drift_check(self.status).get("name"),
            (self.status.get("approval") or {}).get("previewJob"),
        }
        orphans = [
            j
            for name, j in self.jobs.items()
            if name not in recorded
            and not job_finished(j)
            and not job_deleting(j)
            and Run.from_job(j) is not None
        ]
        if orphans:
            job = max(orphans, key=_creation)
            run = Run.from_job(job)
            assert run is not None
            self._set_current(run, str(job["metadata"]["name"]))
            self._repair_inputs(job, run)

    def _set_current(self, run: Run, name: str) -> None:
        self.status["currentUpdate"] = {
            "generation": run.generation,
            "reconcileRequest": run.reconcile_request,
            "name": name,
            "commit": run.commit,
        }

    def _fold_job(self, job: Mapping[str, Any]) -> bool:
        """Fold ``job`` if it has ended (True), else look again in time (False)."""
        name = str(job["metadata"]["name"])
        if job_finished(job) and name not in self.obs.run_pods:
            # Its result is trusted only as its pod vouches for it, and the observer reads
            # the pods of the current run only: make it current, fold it next time.
            if self._current_name() != name:
                run = self._run_of(name, job)
                self._set_current(run, name)
                if changes_stack(run):
                    self._reconciling(RECONCILING_PROCESSING_REASON, _running_message(run, name))
            self._requeue_in(1.0)
            return False
        pods = self.obs.run_pods.get(name, ())
        outcome = job_outcome(job, self.obs.results.get(name), self.uid, self.now, pods)
        # A run whose pod cannot be created, or cannot start: its Job must go so the retry
        # is not blocked by it.
        stuck = None if outcome is not None else pod_start_outcome(job, pods, self.now)
        if (
            outcome is None
            and stuck is None
            and name in self.obs.run_pods
            and superseded(job, self.generation)
            and run_not_started(job, pods)
        ):
            # A spec change replaces a run that has not started, as PKO does. Foreground:
            # should its pod start at this very moment, the Job stays (and blocks the new
            # run) until that pod is gone, as for a cancelled run.
            uid = str(job["metadata"].get("uid") or "")
            self.result.delete_jobs.append(JobDeletion(name, uid, foreground=True))
            outcome = superseded_outcome(name, self.generation, self.now)
        if outcome is None and stuck is None and job_without_pod(job, self.now):
            failure = self.obs.pod_creation_failures.get(name)
            if not failure:
                # Look for the Job controller's FailedCreate Event again in a while.
                self._requeue_in(POD_CREATION_RECHECK)
                return False
            stuck = pod_creation_outcome(job, failure, self.now)
        if stuck is not None:
            self.result.delete_jobs.append(JobDeletion(name, str(job["metadata"].get("uid") or "")))
            outcome = stuck
        if outcome is None:
            created = parse_time(_creation(job))
            status = job.get("status") or {}
            if created is not None and not status.get("active"):
                self._requeue_in(max(created + POD_CREATION_GRACE - self.now, timedelta(0)))
            elif created is not None and not status.get("ready"):
                # Look at its pod when it may have been unable to start for too long.
                check = next_pod_start_check(created, self.now)
                self._requeue_in(max(check - self.now, POD_CREATION_RECHECK))
            return False
        if outcome.result is not None and name not in self.obs.results:
            # Its pod sent the result itself: the ConfigMap keeps it for history, as the
            # runner's would have.
            labels = (job.get("metadata") or {}).get("labels") or {}
            self.result.create_results.append(
                result_config_map(
                    outcome.result,
                    name=name,
                    namespace=self.namespace,
                    labels=result_labels(labels, self.name, outcome.result.operation),
                    job_uid=str(job["metadata"].get("uid") or ""),
                )
            )
        started = parse_time((job.get("status") or {}).get("startTime"))
        self._fold(self._run_of(name, job), name, outcome, started)
        return True

    def _fold(self, run: Run, name: str, outcome: Outcome, started: datetime | None) -> None:
        """Record how run ``name`` ended (``fold.fold_run``, the approval record included).
        An update that applied a saved plan used it up: its preview Job, named by the
        record as it was before the fold, is deleted with the plan's Secret."""
        if changes_stack(run) and run.plan:
            self._discard_plan(self.status.get("approval") or {})
        folded = fold_run(
            self.status,
            self.conditions,
            run,
            name,
            outcome,
            now=self.now,
            generation=self.generation,
        )
        self.status = folded.status
        self.conditions = folded.conditions
        self.result.finished.append(FinishedRun(run, name, outcome, started))
        for event in folded.events:
            self._event(event.type, event.reason, event.message)

    def _build(self, run: Run) -> RunObjects:
        assert self.spec is not None
        project_info = None
        if self.status.get("projectInfo"):
            try:
                project_info = ProjectInfo.model_validate(self.status["projectInfo"])
            except ValueError:
                project_info = None
        return build_run(
            self.obs.stack,
            self.spec,
            run,
            self.settings.job,
            self.template,
            project_info,
            insecure_http_git_hosts=self.settings.insecure_http_git_hosts,
            source=self.obs.source_object.obj if self.obs.source_object else None,
            ended_runs=self._ended_runs(),
        )

    def _repair_inputs(self, job: Mapping[str, Any], run: Run) -> None:
        """An adopted Job was created by a reconcile that may have stopped before its inputs:
        create them again (``AlreadyExists`` when they are there), if the spec is unchanged."""
        if self.spec is None or run.generation != self.generation:
            return
        try:
            objects = self._build(run)
        except JobBuildError:
            return
        if objects.job["metadata"]["name"] == job["metadata"]["name"]:
            self.result.create_inputs = objects.inputs
            self.result.inputs_job = str(job["metadata"]["name"])

    def _start(self, run: Run, reason: str) -> bool:
        """Plan the Job for ``run``; False when it cannot start now (the status says why)."""
        assert self.spec is not None
        name = job_name(self.name, self.uid, run)
        existing = self.jobs.get(name)
        if existing is not None and job_finished(existing):
            raise _Refold(existing)
        if self.stopping:
            self._reconciling(
                RECONCILING_PROCESSING_REASON,
                f"waiting for run {self.stopping} to stop before starting {run.operation}",
            )
            return False
        if not self.obs.slot_available:
            self._reconciling(
                RECONCILING_PROCESSING_REASON,
                "waiting for a free run slot (the controller's max_active_jobs is reached)",
            )
            self._requeue_in(SLOT_RECHECK)
            return False
        try:
            objects = self._build(run)
        except JobBuildError as exc:
            self.start_refused = str(exc)
            self._stalled(STALLED_SPEC_INVALID_REASON, self.start_refused, EVENT_CONFIG_INVALID)
            return False
        if self.obs.job_rejected:
            self.start_refused = (
                f"the API server refused the run's Job: {self.obs.job_rejected}. The Job "
                "carries the Stack's spec.workspaceTemplate and spec.jobTemplate (its pod, "
                "labels and annotations): change what the API server's message names"
            )
            self._stalled(STALLED_SPEC_INVALID_REASON, self.start_refused, EVENT_CONFIG_INVALID)
            return False
        self.result.create_job = objects.job
        self.result.create_inputs = objects.inputs
        self.result.inputs_job = name
        self.result.run = run
        self._set_current(run, name)
        if changes_stack(run):
            self._reconciling(RECONCILING_PROCESSING_REASON, _running_message(run, name))
        self._event("Normal", EVENT_UPDATE_DETECTED, f"{reason}: starting {run.operation} {name}")
        return True

    # -- deletion ------------------------------------------------------------------------------

    def _finalize(self) -> None:
        # Only `true` abandons: any other value (a typo) is refused and the destroy runs.
        if accepted(self.obs.stack, ABANDON_ANNOTATION) == "true":
            self.result.finalizer = "remove"
            self.result.status = None
            self._event(
                "Warning",
                EVENT_ABANDONED,
                f"finalizer removed on request ({ABANDON_ANNOTATION}); no destroy was run and "
                "the stack's resources were left in place",
            )
            return
        self._reject_request_while_deleting()
        blocking = self._blocking_job()
        if blocking is not None:
            self._reconciling(
                RECONCILING_PROCESSING_REASON,
                f"waiting for run {blocking['metadata']['name']} to finish before deletion",
            )
            return
        raw_spec = self.obs.stack.get("spec") or {}
        destroy = bool(raw_spec.get("destroyOnFinalize") or raw_spec.get("destroyOnDelete"))
        last = last_update(self.status)
        if not destroy or raw_spec.get("preview"):
            self._release()
            return
        if last.get("type") == "destroy" and last.get("state") == "succeeded":
            self._event("Normal", EVENT_DESTROYED, f"the stack was destroyed by {last.get('name')}")
            self._release()
            return
        if self.spec is None:
            self._stalled(
                STALLED_SPEC_INVALID_REASON,
                "cannot run the destroy on deletion: "
                + "; ".join(self.check.problems)
                + f"; fix the spec, or set the annotation {ABANDON_ANNOTATION}=true to delete "
                "the Stack without destroying its resources",
                EVENT_CONFIG_INVALID,
            )
            return
        if self.obs.namespace_terminating:
            self._stalled(
                STALLED_NAMESPACE_TERMINATING_REASON,
                f"namespace {self.namespace} is being deleted, so the destroy Job cannot start. "
                f"Recovery: destroy the resources yourself (pulumi destroy --stack "
                f"{self.spec.stack}), then run `kubectl annotate stack {self.name} -n "
                f"{self.namespace} {ABANDON_ANNOTATION}=true` to release the finalizer",
            )
            self._requeue_in(NAMESPACE_RECHECK)
            return
        if (
            last.get("type") == "destroy"
            and last.get("state") == "failed"
            and last.get("generation") == self.generation
            and (last.get("reconcileRequest") or "") == self.request
        ):
            failures = failure_count(last)
            if failures >= self.settings.retry.max_failures:
                self._stalled(
                    STALLED_UPDATE_FAILED_REASON,
                    f"destroy failed {failures + 1} times; the finalizer stays so the "
                    f"resources are not orphaned. Last error: {last.get('message')}. Fix the "
                    f"cause and set {RECONCILE_REQUEST_ANNOTATION} to retry, or set "
                    f"{ABANDON_ANNOTATION}=true to delete the Stack without destroying",
                )
                return
            wait = cooldown_remaining(last, self.spec, self.settings, self.now)
            if wait > timedelta(0):
                self._reconciling(
                    RECONCILING_RETRY_REASON, f"destroy failed: {last.get('message')}"
                )
                self._requeue_in(wait)
                return
        run = Run(
            operation="destroy",
            kind="sync",
            generation=self.generation,
            reconcile_request=self.request,
            commit=str(last.get("lastSuccessfulCommit") or ""),
            trigger=f"finalize:{last.get('name') or ''}",
        )
        self._start(run, "the Stack is being deleted (destroyOnFinalize)")

    def _release(self) -> None:
        self.result.finalizer = "remove"
        self.result.status = None

    def _reject_request_while_deleting(self) -> None:
        value = str(self.annotations.get(OPERATION_REQUEST_ANNOTATION) or "")
        current = operation_request_status(self.status)
        if value and current.get("request") != recorded_request(value):
            self._request_status(
                value, split_request(value)[0], "Rejected", "", "the Stack is being deleted"
            )

    # -- the normal path ------------------------------------------------------------------------

    def _reconcile(self) -> None:
        if self._handle_operation_request():
            return
        blocking = self._blocking_job()
        if blocking is not None:
            name = str(blocking["metadata"]["name"])
            if name == self._current_name():
                run = self._run_of(name, blocking)
                if changes_stack(run):
                    self._reconciling(RECONCILING_PROCESSING_REASON, _running_message(run, name))
                return
            # Its run is recorded (cancelled) but its pod has not stopped yet:
            # decide as usual, only start nothing until it is gone.
            self.stopping = name
        spec = self.spec
        if spec is None:
            self._stalled(
                STALLED_SPEC_INVALID_REASON, "; ".join(self.check.problems), EVENT_CONFIG_INVALID
            )
            return
        refusal = (
            self.obs.run_check.refusal
            if self.obs.run_check is not None
            else run_refusal(self.obs.stack, spec, self.settings, self.template)
        )
        if refusal is not None:
            self._stalled(STALLED_SPEC_INVALID_REASON, refusal, EVENT_CONFIG_INVALID)
            return
        if spec.suspend:
            self._suspended()
            return
        commit = self._commit(spec)
        if commit is _PENDING:
            last = last_update(self.status)
            if (
                not last
                or last.get("generation") != self.generation
                or (last.get("reconcileRequest") or "") != self.request
            ):
                self._reconciling(
                    RECONCILING_PROCESSING_REASON,
                    f"waiting for the head of branch {spec.branch} of {spec.project_repo}",
                )
            return
        if isinstance(commit, _SourceError):
            self._stalled(STALLED_SOURCE_UNAVAILABLE_REASON, commit.message)
            return
        if isinstance(commit, _Waiting):
            self._reconciling(RECONCILING_WAITING_FOR_SOURCE_REASON, commit.message)
            if commit.recheck is not None:
                self._requeue_in(commit.recheck)
            return
        assert commit is None or isinstance(commit, str)
        if self._held():
            return
        if self._sync(spec, commit):
            return
        self._schedules(spec, commit)

    def _suspended(self) -> None:
        last = last_update(self.status)
        ok = last.get("state") == "succeeded"
        message = "reconciliation is suspended (spec.suspend: true); " + (
            f"the last {last.get('type')} succeeded"
            if ok
            else (f"the last {last.get('type')} failed" if last else "nothing has run yet")
        )
        self.conditions = set_condition(
            self.conditions,
            CONDITION_READY,
            "True" if ok else "False",
            SUSPENDED_REASON,
            message,
            now=self.now,
            observed_generation=self.generation,
        )
        self.conditions = remove_condition(self.conditions, CONDITION_RECONCILING)
        if ok:
            self.conditions = remove_condition(self.conditions, CONDITION_STALLED)
            return
        # Not Ready and nothing in progress: without Stalled, kstatus (Flux's healthChecks)
        # and Argo CD would read the Stack as in progress and wait for a run that never
        # comes. Nothing happens until the user resumes it, which is what Stalled means.
        self.conditions = set_condition(
            self.conditions,
            CONDITION_STALLED,
            "True",
            SUSPENDED_REASON,
            message + "; resume it (spec.suspend: false) to run",
            now=self.now,
            observed_generation=self.generation,
        )

    def _commit(self, spec: StackSpec) -> str | _SourceError | _Pending | _Waiting | None:
        """The revision to deploy: spec.commit, the polled branch head, the Program's
        generation, or None (unknown)."""
        if spec.program_ref is not None:
            return self._program_revision(spec.program_ref.name)
        if spec.flux_source is not None:
            return self._flux_revision(spec.flux_source)
        if not spec.project_repo:
            return None
        if spec.commit:
            return spec.commit
        head = self.obs.source
        if head is None or (head.commit is None and not head.error):
            return _PENDING
        if head.error:
            return _SourceError(
                f"cannot read branch {spec.branch} of {spec.project_repo}: {head.error}"
            )
        return head.commit

    def _program_revision(self, name: str) -> str | _Waiting:
        source = self.obs.source_object
        program = source.obj if source is not None and source.name == name else None
        if program is None:
            return _Waiting(
                f"Program {name} does not exist in namespace {self.namespace}; "
                "the Stack runs as soon as it is created"
            )
        return program_revision(program)

    def _flux_revision(self, flux: FluxSource) -> str | _Waiting:
        """A Flux source's artifact revision; wait (no failure) while it has no artifact."""
        ref = flux.source_ref
        what = f"{ref.kind} {ref.name}"
        source = self.obs.source_object
        if source is None or not source.watched:
            watch = (
                f"the controller's watch of {ref.kind} ({FLUX_SOURCE_GROUP}/{FLUX_SOURCE_VERSION})"
            )
            if source is not None and source.error:
                message = f"{watch} cannot list them, retrying with backoff: {source.error}"
            else:
                message = (
                    f"waiting for {watch} to list them (is Flux's CRD installed, and may the "
                    "controller list it?)"
                )
            # The first list sends events only for sources that exist: look again.
            return _Waiting(message, recheck=WATCH_RECHECK)
        if source.obj is None:
            return _Waiting(
                f"{what} does not exist in namespace {self.namespace}; the Stack runs as soon "
                "as it has an artifact"
            )
        status = source.obj.get("status") or {}
        artifact = status.get("artifact") or {}
        if not artifact.get("revision") or not artifact.get("url"):
            ready = next(
                (
                    c
                    for c in status.get("conditions") or []
                    if isinstance(c, Mapping) and c.get("type") == CONDITION_READY
                ),
                {},
            )
            why = str(ready.get("message") or "no Ready condition yet")
            return _Waiting(f"{what} has no artifact yet ({why}); the Stack runs once it has")
        return str(artifact["revision"])

    def _held(self) -> bool:
        """After a requested destroy, nothing runs until the spec changes or `up` is asked."""
        last = last_update(self.status)
        request = operation_request_status(self.status)
        held = (
            last.get("type") == "destroy"
            and request.get("operation") == "destroy"
            and request.get("jobName") == last.get("name")
            and last.get("generation") == self.generation
            and (last.get("reconcileRequest") or "") == self.request
        )
        if not held:
            return False
        if last.get("state") == "succeeded":
            message = (
                f"destroyed on request ({request.get('request')}); no update runs until the "
                f"spec changes or an up is requested (pkobatch up {self.name})"
            )
        else:
            message = (
                f"the requested destroy failed: {last.get('message')}; request destroy again, "
                f"or request an up (pkobatch up {self.name})"
            )
        self._stalled(STALLED_DESTROY_HELD_REASON, message)
        return True

    def _sync(self, spec: StackSpec, commit: str | None) -> bool:
        """Start the normal operation if out of sync; else set the resting conditions."""
        decision = sync_decision(
            last_update(self.status),
            spec,
            generation=self.generation,
            reconcile_request=self.request,
            commit=commit,
            now=self.now,
            settings=self.settings,
        )
        if decision.recheck is not None:
            self._requeue_in(decision.recheck)
        reason = decision.reason
        due = scheduled_run_due(spec, self.meta, self.status, self.now, self.settings)
        last = last_update(self.status)
        if reason is None and due is not None:
            reason = f"scheduled run {format_time(due.time)}"
            if due.skipped:
                reason += f" ({due.skipped} earlier scheduled time(s) skipped)"
        requires_approval = approval.required(spec.to_manifest())
        if not requires_approval:
            self._end_plan("Superseded", "spec.approval.required is off")
            self.conditions = remove_condition(self.conditions, CONDITION_APPROVAL_PENDING)
        if reason is None:
            if requires_approval:
                self._end_plan("Superseded", "the Stack is in sync without it")
                self._approval_condition("False", "NoChangePending", "no change awaits approval")
            self._resting(last)
            return False
        if not self._prerequisites_ready(spec):
            return True
        trigger = f"after:{last.get('name') or ''}:{commit or ''}"
        if due is not None:
            # A run that starts anyway covers the due schedule time.
            self._record_schedule_time(format_time(due.time))
            if reason.startswith("scheduled run"):
                trigger = f"{SCHEDULE_TRIGGER_PREFIX}{format_time(due.time)}"
        if requires_approval:
            self._approve_first(spec, commit, trigger, reason)
            return True
        run = Run(
            operation="preview" if spec.preview else "up",
            kind="sync",
            generation=self.generation,
            reconcile_request=self.request,
            commit=commit or "",
            trigger=trigger,
        )
        self._start(run, reason)
        return True

    def _record_schedule_time(self, moment: str) -> None:
        recorded = newer_schedule_time(self.status.get("lastScheduleTime"), moment)
        if recorded is not None:
            self.status["lastScheduleTime"] = recorded

    def _resting(self, last: LastUpdate) -> None:
        """Conditions when no run is needed right now (``retry.resting_state``)."""
        resting = resting_state(last, self.settings)
        if resting.kind == "ready":
            self._ready()
        elif resting.kind == "stalled":
            self._stalled(resting.reason, resting.message)
        else:
            self._reconciling(resting.reason, resting.message)

    def _prerequisites_ready(self, spec: StackSpec) -> bool:
        if self._prerequisite_cycle(spec):
            return False
        waiting: list[str] = []
        for prerequisite in spec.prerequisites or ():
            other = self.obs.prerequisites.get(prerequisite.name)
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
                prerequisite.requirement.succeeded_within_duration
                if prerequisite.requirement
                else None
            )
            succeeded_at = parse_time(other_last.get("lastResyncTime"))
            if within and (
                succeeded_at is None or self.now - succeeded_at > parse_duration(within)
            ):
                waiting.append(f"{prerequisite.name} last succeeded more than {within} ago")
                poke = f"after-{other_last.get('name')}"
                if other_request != poke:
                    self.result.prerequisite_requests[prerequisite.name] = poke
        if not waiting:
            return True
        self._reconciling(
            RECONCILING_PREREQUISITE_REASON, "waiting for prerequisites: " + "; ".join(waiting)
        )
        self._requeue_in(PREREQUISITE_RECHECK)
        return False

    def _prerequisite_cycle(self, spec: StackSpec) -> bool:
        """Stalled when the prerequisites lead to a cycle: its Stacks would wait forever.
        Looked at again every recheck, since an edit of any Stack on it can end it."""
        graph = {
            **self.obs.prerequisite_graph,
            self.name: [p.name for p in spec.prerequisites or ()],
        }
        cycle = prerequisite_cycle(self.name, graph)
        if not cycle:
            return False
        path = " -> ".join(cycle)
        where = (
            f"spec.prerequisites form a cycle: {path}"
            if self.name in cycle
            else f"its prerequisites wait on a cycle: {path}"
        )
        self._stalled(
            STALLED_PREREQUISITE_CYCLE_REASON,
            f"{where}; no Stack on it can ever run. Remove one of these prerequisites to "
            "break the cycle",
        )
        self._requeue_in(PREREQUISITE_RECHECK)
        return True

    def _schedules(self, spec: StackSpec, commit: str | None) -> None:
        """Drift remediation and drift checks; and the requeue for the next cron times."""
        for moment in next_schedule_times(spec, self.meta, self.now):
            self._requeue_in(moment - self.now)
        last = last_update(self.status)
        deployed = last.get("state") == "succeeded" and last.get("type") == "up"
        drift = spec.drift_detection
        if drift is None or not deployed:
            return
        check = last_drift_check(self.status)
        drifted = find_condition(self.conditions, CONDITION_DRIFTED)
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
                generation=self.generation,
                reconcile_request=self.request,
                commit=commit or "",
                trigger=f"{REMEDIATE_TRIGGER_PREFIX}{check.get('name')}",
            )
            self._start(run, "remediating drift")
            return
        due = drift_check_due(spec, self.meta, self.status, self.now, self.settings)
        if due is None:
            return
        run = Run(
            operation="refresh",
            kind="drift",
            generation=self.generation,
            reconcile_request=self.request,
            commit=commit or "",
            trigger=f"{DRIFT_TRIGGER_PREFIX}{format_time(due.time)}",
        )
        if self._start(run, f"drift check {format_time(due.time)}"):
            self.status["lastDriftCheck"] = {
                **check,
                "scheduledTime": format_time(due.time),
            }

    # -- operation requests -------------------------------------------------------------------

    def _request_status(
        self, value: str, operation: str, state: RequestState, job: str, message: str
    ) -> None:
        previous = operation_request_status(self.status)
        # A refused value is never copied whole (api.annotations.recorded_request).
        recorded = recorded_request(value)
        self.status["operationRequest"] = {
            "request": recorded,
            "operation": operation if operation in REQUEST_OPERATIONS else "",
            "state": state,
            "jobName": job,
            "message": bound_message(message),
        }
        if state == "Rejected" and previous.get("request") != recorded:
            self._event("Warning", EVENT_REQUEST_REJECTED, f"{recorded}: {message}")

    def _handle_operation_request(self) -> bool:
        """Act on a new (or still pending) request; True when it decided this pass."""
        value = str(self.annotations.get(OPERATION_REQUEST_ANNOTATION) or "")
        current = operation_request_status(self.status)
        answered = current.get("request") == recorded_request(value)
        if not value or (answered and current.get("state") != "Pending"):
            return False
        operation, _ = split_request(value)
        problem = refusal(OPERATION_REQUEST_ANNOTATION, value)
        if problem is not None:
            self._request_status(value, operation, "Rejected", "", problem)
            return False
        blocking = self._blocking_job()
        if operation == "cancel":
            return self._cancel(value, blocking)
        raw_spec = self.obs.stack.get("spec") or {}
        if operation == "up" and approval.required(raw_spec):
            self._request_status(
                value,
                operation,
                "Rejected",
                "",
                "spec.approval.required: updates run only an approved plan; see `pkobatch "
                f"plan {self.name}` and approve it with `pkobatch approve {self.name}`",
            )
            return False
        if raw_spec.get("preview") and operation in ("up", "destroy"):
            self._request_status(
                value,
                operation,
                "Rejected",
                "",
                f"spec.preview is true: this Stack never runs {operation}",
            )
            return False
        if self.spec is None:
            self._request_status(
                value,
                operation,
                "Rejected",
                "",
                "the spec is invalid: " + "; ".join(self.check.problems),
            )
            return False
        if blocking is not None:
            name = str(blocking["metadata"]["name"])
            self._request_status(
                value, operation, "Pending", "", f"waiting for run {name} to finish"
            )
            return False
        commit = self._commit(self.spec)
        op: Operation = operation  # type: ignore[assignment]
        run = Run(
            operation=op,
            kind="request",
            generation=self.generation,
            reconcile_request=self.request,
            commit=commit if isinstance(commit, str) else "",
            trigger=f"request:{value}",
            request=value,
        )
        name = job_name(self.name, self.uid, run)
        if self._start(run, f"requested {operation} ({value})"):
            self._request_status(value, operation, "Running", name, f"run {name} started")
            return True
        if self.result.create_job is None and self.obs.slot_available is False:
            self._request_status(value, operation, "Pending", "", "waiting for a free run slot")
            return True
        self._request_status(
            value, operation, "Rejected", "", f"its run could not start: {self.start_refused}"
        )
        return True

    def _cancel(self, value: str, blocking: Mapping[str, Any] | None) -> bool:
        if blocking is None or blocking["metadata"]["name"] != self._current_name():
            self._request_status(
                value, "cancel", "Rejected", "", "nothing to cancel: no run is in progress"
            )
            return False
        name = str(blocking["metadata"]["name"])
        run = self._run_of(name, blocking)
        self.result.delete_jobs.append(
            JobDeletion(name, str(blocking["metadata"].get("uid") or ""), foreground=True)
        )
        self._fold(run, name, cancelled_outcome(name, value, self.now), None)
        self._request_status(value, "cancel", "Succeeded", name, f"run {name} was cancelled")
        # The cancelled Job blocks new runs until its pod is gone (foreground deletion).
        self._resting(last_update(self.status))
        return True

    # -- approval of saved plans (pkobatch.controller.approval) -------------------------------

    def _approve_first(
        self, spec: StackSpec, commit: str | None, trigger: str, reason: str
    ) -> None:
        """spec.approval.required: save a plan, wait for its approval, apply exactly it."""
        manifest = spec.to_manifest()
        target = approval.target_key(manifest, self.request, trigger)
        record = self.status.get("approval") or {}
        if record.get("target") != target:
            self._end_plan("Superseded", f"superseded by a newer change ({reason})")
            record = self.status.get("approval") or {}
        failures = int(record.get("failures") or 0)
        decision = approval.decide(
            record,
            target,
            approval.approvals(self.obs.stack, manifest, self.obs.managed_fields),
            approval.rejected_plan(self.obs.stack),
            self.now,
            cooldown(failures - 1, spec, self.settings),
            self.settings.retry.max_failures,
        )
        if isinstance(decision, approval.StartPreview):
            run = Run(
                operation="preview",
                kind="approval",
                generation=self.generation,
                reconcile_request=self.request,
                commit=commit or "",
                trigger=approval.preview_trigger(target, trigger, decision.attempt),
            )
            name = job_name(self.name, self.uid, run)
            if self._start(run, f"{reason} (spec.approval: saving a plan to review)"):
                self.status["approval"] = approval.previewing(
                    target, run, name, decision.attempt, reason
                )
                self._reconciling(
                    RECONCILING_PROCESSING_REASON,
                    f"preview {name} is saving a plan for approval",
                )
            self._approval_condition("False", "Previewing", f"preview {name} saves a plan")
        elif isinstance(decision, approval.Apply):
            run = approval.apply_run(record, self.generation, self.request)
            name = job_name(self.name, self.uid, run)
            if self._start(run, f"plan {run.plan} approved by {decision.approver.by}"):
                if record.get("state") != "Approved":
                    self._event(
                        "Normal",
                        EVENT_PLAN_APPROVED,
                        f"plan {run.plan} approved by {decision.approver.by} "
                        f"({decision.approver.via or 'no review needed'})",
                    )
                self.status["approval"] = approval.approved(
                    record, decision.approver, name, self.now
                )
            self._approval_condition("False", "Approved", f"plan {run.plan} is approved")
        elif isinstance(decision, approval.Reject):
            self._end_plan("Rejected", f"rejected ({REJECT_ANNOTATION})")
            self._approval_condition("False", "Rejected", f"plan {decision.plan_id} was rejected")
            self._reconciling(
                RECONCILING_APPROVAL_PENDING_REASON,
                f"plan {decision.plan_id} was rejected; nothing runs until the spec, the source "
                "or the reconcile request changes",
            )
        else:
            if decision.stalled:
                self._stalled(STALLED_UPDATE_FAILED_REASON, decision.message)
            else:
                self._reconciling(RECONCILING_APPROVAL_PENDING_REASON, decision.message)
            if decision.recheck is not None:
                self._requeue_in(decision.recheck)
            if decision.pending:
                self._approval_condition("True", "AwaitingApproval", decision.message)

    def _end_plan(self, state: str, message: str) -> None:
        """Supersede or reject the plan that holds its Secret; its preview Job goes with it."""
        record = self.status.get("approval") or {}
        if not approval.holds_plan(record) or record.get("state") == "Approved":
            return
        self.status["approval"] = approval.ended(
            record, state, f"plan {record.get('planID')} {state.lower()}: {message}"
        )
        self._event("Normal", EVENT_PLAN_ENDED, self.status["approval"]["message"])
        self._discard_plan(record)

    def _discard_plan(self, record: Mapping[str, Any]) -> None:
        job = self.jobs.get(str(record.get("previewJob") or ""))
        if job is not None and not job_deleting(job):
            meta = job["metadata"]
            self.result.delete_jobs.append(
                JobDeletion(str(meta["name"]), str(meta.get("uid") or ""))
            )

    def _approval_condition(
        self, status: Literal["True", "False"], reason: str, message: str
    ) -> None:
        self.conditions = set_condition(
            self.conditions,
            CONDITION_APPROVAL_PENDING,
            status,
            reason,
            message,
            now=self.now,
            observed_generation=self.generation,
        )

    # -- history -----------------------------------------------------------------------------

    def _prune_history(self) -> None:
        current = self._current_name()
        record = self.status.get("approval") or {}
        kept = {current, record.get("previewJob") if approval.holds_plan(record) else None}
        done = [
            j
            for name, j in self.jobs.items()
            if name not in kept and job_finished(j) and not job_deleting(j)
        ]
        done.sort(key=_creation, reverse=True)
        for job in done[self.settings.job.history_limit :]:
            meta = job["metadata"]
            self.result.delete_jobs.append(
                JobDeletion(str(meta["name"]), str(meta.get("uid") or ""))
            )
        for name, configmap in self.obs.results.items():
            created = parse_time(_creation(configmap))
            if (
                name not in self.jobs
                and created is not None
                and self.now - created > ORPHAN_RESULT_AGE
            ):
                self.result.delete_results.append(name)


class _Pending:
    pass


_PENDING: Final = _Pending()


@dataclass(frozen=True)
class _SourceError:
    message: str


@dataclass(frozen=True)
class _Waiting:
    """The source object is missing or not ready: wait for its watch event, count nothing."""

    message: str
    # Seconds until the next look, when no watch event is sure to come.
    recheck: float | None = None


# The run whose Job ``run_refusal`` builds to check a Stack (the pod does not depend on it).
_PROBE_RUN: Final = Run(
    operation="up", kind="sync", generation=0, reconcile_request="", commit="", trigger="check"
)


def run_refusal(
    stack: Mapping[str, Any], spec: StackSpec, settings: Settings, template: Mapping[str, Any]
) -> str | None:
    """Why no Job of this Stack may be created (Flux source kind, Pod Security,
    ServiceAccount, git transport).

    Checked before the Stack waits for its source, so a Stack that can never run is Stalled
    at once, the branch poller never sends its credentials anywhere, and no watch of a Flux
    kind the controller does not accept is started.
    """
    flux = spec.flux_source
    if flux is not None and flux.source_ref.kind not in settings.flux_source_kinds:
        kind = flux.source_ref.kind
        return (
            f"spec.fluxSource.sourceRef.kind {kind!r} is not a Flux source kind this controller "
            f"reads ({', '.join(settings.flux_source_kinds)}): name one of them, or ask the "
            f"operator to add {kind} with the controller setting "
            f"PKOBATCH_EXTRA_FLUX_SOURCE_KINDS and to let the controller get, list and watch it"
        )
    try:
        build_run(
            stack,
            spec,
            _PROBE_RUN,
            settings.job,
            template,
            insecure_http_git_hosts=settings.insecure_http_git_hosts,
        )
    except JobBuildError as exc:
        return str(exc)
    return None


def _operation_from_name(name: str) -> Operation:
    for operation in OPERATIONS:
        if f"-{operation}-" in name:
            return operation
    return "up"


def _running_message(run: Run, name: str) -> str:
    return f"{run.operation} {name} is in progress"
