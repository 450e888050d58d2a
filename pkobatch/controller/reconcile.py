"""The Stack reconciler: observe → decide → act, and what is shared across Stacks.

``build_reconciler(kube, stores, settings, metrics, enqueuer)`` is the factory the
composition root (``composition.build_manager``) calls. The reconciler is a ``Service``:
``start()`` starts the shared branch poller and, when configured, the push receiver
(``controller.receiver``, which makes the poller fetch a pushed branch now) and the Program
artifact server; ``stop()`` stops them. A ``ProgramKey`` is not a Stack's: its reconcile
keeps that Program's ``status.artifact`` (``controller.program_artifacts``); a
``WorkspaceKey`` or ``UpdateKey`` is PKO's Workspace or Update (``controller.auto_objects``).

Shared state lives here, never in ``decide``:

- ``Admission``: the cluster-wide cap on active Jobs (``Settings.max_active_jobs``) with
  fair ordering — when Stacks wait for a slot, the one waiting longest gets the next; a
  freed slot wakes the first waiters at once.
- ``Dependents``: which Stacks list a Stack as prerequisite, so a prerequisite's success
  wakes them at once instead of at their next recheck.
- ``OwnWrites``: the Stack versions this controller's own writes replaced, so a reconcile
  never starts from a cached Stack its previous reconcile already changed.
- ``PodChecks``: the wake-ups a decision asked for only to look at its Job's pod, dropped
  when the Job's watch shows that pod ready first.
- ``GitPoller``: branch heads (see ``polling``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pkobatch.api.objects import JSON, job_finished
from pkobatch.api.prerequisites import prerequisite_names
from pkobatch.controller.act import Actor, JobRejected, NamespaceTerminating
from pkobatch.controller.auto_objects import AutoObjects
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Decision, Observed, PodCheck
from pkobatch.controller.delivery import Notifier
from pkobatch.controller.echoes import job_event_is_echo, job_started, stack_update_is_echo
from pkobatch.controller.events import EventRecorder
from pkobatch.controller.fold import metric_result
from pkobatch.controller.job_builder import builtin_template, parse_template
from pkobatch.controller.observe import Observer
from pkobatch.controller.outcome import job_pod_ready
from pkobatch.controller.polling import GitPoller
from pkobatch.controller.program_artifacts import ProgramArtifacts
from pkobatch.controller.receiver import PushReceiver
from pkobatch.controller.run_pod import JobBuildError
from pkobatch.controller.sharding import handover
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import (
    ProgramKey,
    StackKey,
    Stores,
    UpdateKey,
    WorkspaceKey,
    stack_name_of,
)
from pkobatch.kube.client import STACKS, Conflict, Kube, NotFound
from pkobatch.runtime.interfaces import Enqueuer, ReconcileResult
from pkobatch.runtime.manager import default_lease_namespace

if TYPE_CHECKING:
    from pkobatch.config import Settings

log = logging.getLogger(__name__)
CONFLICT_RETRY: Final = 1.0
# A created Job counts against the cap until the store shows it (or this long has passed).
RESERVATION_SECONDS: Final = 60.0
# How long a reconcile waits for the cache to show this controller's own Stack write.
OWN_WRITE_SECONDS: Final = 30.0
# How much later than its reconcile's end the worker may set the wake-up it returned.
POD_CHECK_SLACK: Final = 1.0


class StaleStack(Exception):
    """The store's Stack is not the latest, or no longer in this controller's shard."""


class TemplateInvalid(Exception):
    """``Settings.job.template_file`` cannot be used; the message says why."""


def load_template(path: str) -> JSON:
    if not path:
        return builtin_template()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TemplateInvalid(f"PKOBATCH_JOB__TEMPLATE_FILE: cannot read {path}: {exc}") from None
    try:
        return parse_template(text, path)
    except JobBuildError as exc:
        raise TemplateInvalid(f"PKOBATCH_JOB__TEMPLATE_FILE: {exc}") from None


class Admission:
    """The cap on active Jobs across all Stacks, oldest waiter first."""

    def __init__(
        self,
        limit: int,
        enqueue: Callable[[StackKey], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._enqueue = enqueue
        self._clock = clock
        self._lock = threading.Lock()
        self._active: dict[StackKey, str] = {}
        self._reserved: dict[StackKey, float] = {}
        self._waiting: dict[StackKey, float] = {}

    def seed(
        self,
        jobs: Sequence[Mapping[str, Any]],
        stack_of: Callable[[Mapping[str, Any]], StackKey | None],
    ) -> None:
        """Count the Jobs already running (at start-up, before any reconcile)."""
        with self._lock:
            for job in jobs:
                key = stack_of(job)
                if key is not None and not job_finished(job):
                    self._active[key] = str(job["metadata"]["name"])

    def track(self, key: StackKey, active_job: str | None) -> None:
        """What a reconcile saw: the Stack's active Job, if any."""
        wake: list[StackKey] = []
        with self._lock:
            if active_job:
                self._reserved.pop(key, None)
                self._active[key] = active_job
            elif self._active.pop(key, None) is not None:
                wake = self._first_waiters(self._free())
        for waiter in wake:
            self._enqueue(waiter)

    def forget(self, key: StackKey) -> None:
        self.track(key, None)
        with self._lock:
            self._waiting.pop(key, None)
            self._reserved.pop(key, None)

    def withdraw(self, key: StackKey) -> None:
        """``key`` no longer wants to start a Job (it must not hold up those behind it)."""
        with self._lock:
            self._waiting.pop(key, None)

    def acquire(self, key: StackKey) -> bool:
        """May ``key`` start a Job now? A True reserves a slot until ``track`` sees it."""
        with self._lock:
            now = self._clock()
            for stale in [k for k, at in self._reserved.items() if now - at > RESERVATION_SECONDS]:
                del self._reserved[stale]
            free = self._free()
            since = self._waiting.get(key, now)
            ahead = sum(1 for other, at in self._waiting.items() if other != key and at < since)
            if free <= ahead:
                self._waiting.setdefault(key, now)
                return False
            self._waiting.pop(key, None)
            self._reserved[key] = now
            return True

    def waiting(self) -> int:
        """How many Stacks wait for a free slot."""
        with self._lock:
            return len(self._waiting)

    def _free(self) -> int:
        busy = set(self._active) | set(self._reserved)
        return self._limit - len(busy)

    def _first_waiters(self, count: int) -> list[StackKey]:
        ordered = sorted(self._waiting.items(), key=lambda item: item[1])
        return [key for key, _ in ordered[: max(count, 0)]]


class Dependents:
    """Reverse index of ``spec.prerequisites``: who waits on whom."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._of: dict[StackKey, set[StackKey]] = {}
        self._needs: dict[StackKey, set[StackKey]] = {}

    def record(self, key: StackKey, prerequisites: list[str]) -> None:
        needs = {StackKey(key.namespace, name) for name in prerequisites}
        with self._lock:
            for old in self._needs.get(key, set()) - needs:
                self._of.get(old, set()).discard(key)
            for new in needs:
                self._of.setdefault(new, set()).add(key)
            self._needs[key] = needs

    def of(self, key: StackKey) -> list[StackKey]:
        with self._lock:
            return sorted(self._of.get(key, set()))


@dataclass
class _Awaited:
    """What one Stack's recent writes left for the watches to bring back."""

    replaced: set[str] = field(default_factory=set)
    created_jobs: set[str] = field(default_factory=set)
    at: float = 0.0
    # A reconcile found the cache behind and relies on a watch event to be queued again.
    deferred: bool = False


class OwnWrites:
    """The resourceVersions of each Stack that this controller's own writes replace, and the
    Jobs they create, until the watches bring the changes back (client-go's
    ``ControllerExpectations``, for the controller's own writes). Both are recorded before
    the write: its watch event may come before its response.

    A reconcile's writes wake the Stack again (the Job's watch event may arrive while they
    are still being made), and the next reconcile may find the cache still showing the Stack
    from before them. Whatever it decided from that version would be refused by the status
    precondition (a wasted write, and a retry a second later) or repeat what was just done.
    So it does nothing (``behind``): the watch event of the written version queues the Stack
    again (a watch that breaks lists again, which queues every changed Stack). After
    ``OWN_WRITE_SECONDS`` without that event the reconcile goes ahead as if none were awaited.

    The watch events that only bring those writes back are dropped (``echoed_stack``,
    ``echoed_job``; which ones is ``controller.echoes``): deciding again from what the writes
    left is a no-op. Never while a reconcile waits for them.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._awaited: dict[StackKey, _Awaited] = {}

    def _entry(self, key: StackKey) -> _Awaited:
        entry = self._awaited.setdefault(key, _Awaited())
        entry.at = self._clock()
        return entry

    def _current(self, key: StackKey) -> _Awaited | None:
        """``key``'s entry, unless its writes are older than ``OWN_WRITE_SECONDS``."""
        entry = self._awaited.get(key)
        if entry is not None and self._clock() - entry.at >= OWN_WRITE_SECONDS:
            del self._awaited[key]
            return None
        return entry

    def record(self, key: StackKey, replaced_version: str) -> None:
        with self._lock:
            self._entry(key).replaced.add(replaced_version)

    def record_job(self, key: StackKey, job_name: str) -> None:
        with self._lock:
            self._entry(key).created_jobs.add(job_name)

    def behind(self, key: StackKey, cached_version: str) -> bool:
        """Is ``cached_version`` one that this controller's writes have replaced? If so the
        caller relies on the next watch event of the Stack, which is then never dropped."""
        with self._lock:
            entry = self._current(key)
            if entry is None:
                return False
            if cached_version in entry.replaced:
                entry.deferred = True
                return True
            del self._awaited[key]  # the cache caught up
            return False

    def echoed_stack(self, key: StackKey, old: JSON | None, new: JSON | None) -> bool:
        """Is this Stack event only the echo of a write of this controller?"""
        with self._lock:
            entry = self._current(key)
            if entry is None or entry.deferred:
                return False
            if not stack_update_is_echo(old, new, entry.replaced):
                return False
            # The cache has moved past that version: no reconcile waits for it any more.
            entry.replaced.discard(str((old or {})["metadata"]["resourceVersion"]))
            if not entry.replaced and not entry.created_jobs:
                del self._awaited[key]
            return True

    def echoed_job(self, key: StackKey, old: JSON | None, new: JSON | None) -> bool:
        """Is this Job event only the echo of this controller's own Job creation, an update
        that changed nothing but the resourceVersion, or the Job controller's record of the
        run's start (``echoes.job_started``)?"""
        name = str(((new or old or {}).get("metadata") or {}).get("name") or "")
        with self._lock:
            entry = self._current(key)
            if entry is not None and entry.deferred:
                return False
            created = entry is not None and name in entry.created_jobs
            if not (job_event_is_echo(old, new, created) or job_started(old, new)):
                return False
            if entry is not None and created:
                entry.created_jobs.discard(name)
                if not entry.replaced and not entry.created_jobs:
                    del self._awaited[key]
            return True

    def forget_job(self, key: StackKey, job_name: str) -> None:
        """The Job ``record_job`` announced was not created."""
        with self._lock:
            entry = self._awaited.get(key)
            if entry is not None:
                entry.created_jobs.discard(job_name)

    def forget(self, key: StackKey) -> None:
        with self._lock:
            self._awaited.pop(key, None)


@dataclass(frozen=True)
class _PendingPodCheck:
    job: str
    due: float
    otherwise: float | None


class PodChecks:
    """The wake-ups decisions asked for only to look at a Job's pod (``Decision.pod_check``:
    did the Job controller create it, did it start), until the Job shows its pod ready
    (client-go's expectations: the awaited event cancels the wake-up). The Job's start wakes
    nothing (``controller.echoes``), so without this every new Stack would be reconciled once
    more, for nothing, ``POD_CREATION_GRACE`` after its Job's creation. A ready pod moves the
    wake-up to when the decision needs the Stack back otherwise; a wake-up already taken, or
    one of another cause, is left alone (an extra reconcile, never a lost one).
    """

    def __init__(self, enqueuer: Enqueuer, clock: Callable[[], float] = time.monotonic) -> None:
        self._enqueuer = enqueuer
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[StackKey, _PendingPodCheck] = {}

    def expect(self, key: StackKey, check: PodCheck, after: float) -> None:
        """The reconcile of ``key`` returns ``after`` seconds only for ``check``."""
        now = self._clock()
        otherwise = None if check.otherwise is None else now + check.otherwise
        with self._lock:
            self._pending[key] = _PendingPodCheck(check.job, now + after, otherwise)

    def forget(self, key: StackKey) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def pod_ready(self, key: StackKey, job: str) -> None:
        """``job``'s pod is ready: drop the look at it that ``key`` waits for, if any."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is None or pending.job != job:
                return
            del self._pending[key]
        now = self._clock()
        otherwise = None if pending.otherwise is None else max(pending.otherwise - now, 0.0)
        self._enqueuer.reschedule(key, pending.due - now + POD_CHECK_SLACK, otherwise)


class StackReconciler:
    def __init__(
        self,
        kube: Kube,
        stores: Stores,
        settings: Settings,
        metrics: StackMetrics,
        enqueuer: Enqueuer,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._stores = stores
        self._settings = settings
        self._metrics = metrics
        self._enqueuer = enqueuer
        self._clock = clock
        self._template = load_template(settings.job.template_file)
        self.poller = GitPoller(
            kube,
            settings.poll_interval.total_seconds(),
            enqueuer.enqueue,
            registry=metrics.registry,
            insecure_http_hosts=tuple(settings.insecure_http_git_hosts),
        )
        self.receiver = (
            PushReceiver(settings.receiver, self.poller, metrics.registry)
            if settings.receiver.enabled
            else None
        )
        self.admission = Admission(settings.max_active_jobs, enqueuer.enqueue)
        metrics.track_admission(self.admission.waiting, settings.max_active_jobs)
        self.dependents = Dependents()
        self._observer = Observer(kube, stores, self.poller, settings, self._template)
        # Events have their own rate limit and sender thread (``controller.events``).
        self._events = EventRecorder(kube.with_own_rate_limit(), on_dropped=metrics.events_dropped)
        self.own_writes = OwnWrites()
        self.pod_checks = PodChecks(enqueuer)
        self._actor = Actor(
            kube,
            self._events,
            lambda namespace, name, version: self.own_writes.record(
                StackKey(namespace, name), version
            ),
        )
        self.notifier = Notifier(
            kube,
            settings.notifications,
            metrics.registry,
            [*settings.namespaces] or [None],
            self._events,
        )
        self.program_artifacts = ProgramArtifacts(
            self._actor, stores.programs, settings.programs, default_lease_namespace(), clock
        )
        self.auto_objects = AutoObjects(
            kube,
            self._actor,
            self._events,
            (stores.workspaces, stores.updates, stores.jobs),
            settings,
            self._template,
            clock,
        )
        self._in_scope: Callable[[str], bool] = lambda namespace: True
        self._seeded = False

    def scope_to(self, in_scope: Callable[[str], bool]) -> None:
        """Reconcile, count and serve only what belongs to the namespaces ``in_scope``
        accepts (the manager's namespace selector)."""
        self._in_scope = in_scope
        self.program_artifacts.serve_only(in_scope)

    # -- Service ---------------------------------------------------------------------------

    def start(self) -> None:
        self._seed()
        self._events.start()
        self.notifier.start()
        self.poller.start()
        if self.receiver is not None:
            self.receiver.start()
        self.program_artifacts.start()

    def stop(self) -> None:
        self.program_artifacts.stop()
        if self.receiver is not None:
            self.receiver.stop()
        self.poller.stop()
        self.notifier.stop()
        self._events.stop()

    def _seed(self) -> None:
        if self._seeded:
            return
        self._seeded = True

        def stack_of(job: Mapping[str, Any]) -> StackKey | None:
            """The Job's Stack if this controller reconciles it: a Job of a Stack outside
            its namespace selector or shard (e.g. created before the Stack moved) holds no
            slot here, as nothing here would ever release it."""
            name = stack_name_of(dict(job))
            namespace = str((job.get("metadata") or {}).get("namespace") or "")
            if not name or not self._in_scope(namespace):
                return None
            if self._stores.stacks.get(namespace, name) is None:
                return None
            return StackKey(namespace, name)

        self.admission.seed(self._stores.jobs.list_unpacked(), stack_of)

    # -- Reconciler ------------------------------------------------------------------------

    def _cached_version(self, key: StackKey) -> str:
        cached = self._stores.stacks.get(key.namespace, key.name)
        return str(((cached or {}).get("metadata") or {}).get("resourceVersion") or "")

    def forget(self, key: StackKey) -> None:
        """``key``'s namespace stopped matching the namespace selector: no branch polling or
        Flux source watch on its behalf any more (``runtime.interfaces.Forgetful``), and its
        running Job no longer holds a run slot: nothing here would see it end."""
        self._observer.forget(key)
        self.admission.forget(key)

    def reconcile(self, key: StackKey) -> ReconcileResult:
        if isinstance(key, ProgramKey):
            return self.program_artifacts.reconcile(key)
        if isinstance(key, WorkspaceKey):
            return self.auto_objects.reconcile_workspace(key)
        if isinstance(key, UpdateKey):
            return self.auto_objects.reconcile_update(key)
        self._seed()
        self.pod_checks.forget(key)  # this reconcile decides again when to look
        cached = self._stores.stacks.get(key.namespace, key.name)
        version = self._cached_version(key)
        if cached is not None and self.own_writes.behind(key, version):
            log.debug("stack %s: the cache does not show this controller's write yet", key)
            # The written version's event is never dropped from now on; one that came
            # while this reconcile looked may have been: then the cache shows it already.
            if self._cached_version(key) != version:
                self._enqueuer.enqueue(key)
            return ReconcileResult()
        observed = self._observer.observe(key, self._clock())
        if observed is None:
            self.own_writes.forget(key)
            self.admission.forget(key)
            self.dependents.record(key, [])
            return ReconcileResult()
        spec = observed.stack.get("spec") or {}
        self.dependents.record(key, prerequisite_names(spec))
        relabels = handover(observed.stack, observed.jobs, observed.results)
        if relabels and self._settings.shard_selector:
            try:
                self._confirm_latest(observed.stack)
            except StaleStack:
                return ReconcileResult(requeue_after=CONFLICT_RETRY)
            self._actor.relabel(key.namespace, relabels)
        decision = decide(observed, self._settings, self._template)
        if decision.error:
            log.error("deciding for stack %s failed (a bug): %s", key, decision.error)
        if decision.create_job is None:
            self.admission.withdraw(key)
        elif not self.admission.acquire(key):
            decision = decide(
                replace(observed, slot_available=False), self._settings, self._template
            )
        try:
            decision = self._create_job(key, observed, decision)
            if decision.create_job is None:
                self._actor.create_inputs(
                    decision.inputs_job, key.namespace, decision.create_inputs
                )
            outbox = self.notifier.add_events(observed.stack, decision, observed.now)
            self._actor.apply(observed.stack, decision)
        except (Conflict, StaleStack):
            # Status computed from a stale cache (or a concurrent edit): look again shortly.
            return ReconcileResult(requeue_after=CONFLICT_RETRY)
        # Only after the status holding them is written (never for a write that failed).
        self.notifier.track(observed.stack, outbox, durable=decision.status is not None)
        active = decision.create_job or next(
            (j for j in observed.jobs if not job_finished(j)), None
        )
        self.admission.track(key, str(active["metadata"]["name"]) if active else None)
        self._after_runs(key, decision)
        return ReconcileResult(requeue_after=self._requeue(key, decision))

    def _requeue(self, key: StackKey, decision: Decision) -> float | None:
        """The decision's requeue, less a look at a pod the Job already shows ready."""
        check = decision.pod_check
        if check is None or decision.requeue_after is None:
            return decision.requeue_after
        job = self._stores.jobs.get(key.namespace, check.job)
        if job is not None and job_pod_ready(job):
            return check.otherwise  # it started while this reconcile decided
        self.pod_checks.expect(key, check, decision.requeue_after)
        return decision.requeue_after

    def echoed_job(self, key: StackKey, old: JSON | None, new: JSON | None) -> bool:
        """``OwnWrites.echoed_job``; a Job that shows its pod ready also ends its Stack's
        wait to look at that pod (``PodChecks``)."""
        if new is not None and job_pod_ready(new):
            self.pod_checks.pod_ready(key, str(new["metadata"]["name"]))
        return self.own_writes.echoed_job(key, old, new)

    def _create_job(self, key: StackKey, observed: Observed, decision: Decision) -> Decision:
        if decision.create_job is None:
            return decision
        if self._settings.shard_selector:
            try:
                self._confirm_latest(observed.stack)
            except StaleStack:
                self.admission.forget(key)
                raise
        job_name = str(decision.create_job["metadata"]["name"])
        if not (observed.stack.get("metadata") or {}).get("deletionTimestamp"):
            # A destroy's Job comes back as news (``controller.echoes``).
            self.own_writes.record_job(key, job_name)
        if decision.create_run_cache is not None:
            self._actor.create_run_cache(decision.create_run_cache)
        try:
            self._actor.create_job(decision.create_job, decision.create_inputs)
        except NamespaceTerminating:
            self.own_writes.forget_job(key, job_name)
            self.admission.forget(key)
            return decide(
                replace(observed, namespace_terminating=True), self._settings, self._template
            )
        except JobRejected as exc:
            self.own_writes.forget_job(key, job_name)
            self.admission.forget(key)
            log.warning("job for stack %s was rejected: %s", key, exc)
            return decide(replace(observed, job_rejected=str(exc)), self._settings, self._template)
        return decision

    def _confirm_latest(self, stack: Mapping[str, Any]) -> None:
        """Raise ``StaleStack`` unless ``stack`` is the latest version and still in this
        controller's shard. Asked before the two writes a status precondition does not guard
        (creating a Job, relabelling objects), so a controller whose watch has not yet shown a
        Stack's move to another shard does neither (docs/sharding.md)."""
        meta = stack.get("metadata") or {}
        try:
            live = self._kube.get(STACKS, str(meta.get("name")), str(meta.get("namespace")))
        except NotFound:
            raise StaleStack("the Stack is gone") from None
        live_meta = live.get("metadata") or {}
        if live_meta.get("resourceVersion") != meta.get("resourceVersion"):
            raise StaleStack("the store's Stack is not the latest")
        if not self._settings.in_shard(live_meta.get("labels") or {}):
            raise StaleStack("the Stack moved to another shard")

    def _after_runs(self, key: StackKey, decision: Decision) -> None:
        for finished in decision.finished:
            duration = -1.0
            if finished.started_at is not None:
                duration = (finished.outcome.finished_at - finished.started_at).total_seconds()
            self._metrics.operation_finished(
                finished.run.operation, metric_result(finished.outcome), duration
            )
            if finished.outcome.succeeded:
                for dependent in self.dependents.of(key):
                    self._enqueuer.enqueue(dependent)


def build_reconciler(
    kube: Kube, stores: Stores, settings: Settings, metrics: StackMetrics, enqueuer: Enqueuer
) -> StackReconciler:
    """The factory ``composition.build_manager`` uses by default."""
    return StackReconciler(kube, stores, settings, metrics, enqueuer)
