"""The decision being drafted for one Stack, and what a step returns.

A ``Draft`` holds what the steps of ``controller.decide`` share: the observed Stack (its
parsed spec, annotations and Jobs), the status and conditions decided so far, and the
``Decision`` being filled in. Its helpers keep the bookkeeping in one place: Events are
bounded, Stalled's Warning is sent only when Stalled changes, a requeue is at least a
second away.

A step returns ``NEXT`` (go on with the next step), ``DONE`` (this pass is decided; the
later steps do not run) or ``Refold(job)``: the Job the step would create exists and has
finished, so ``decide`` folds it and decides again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, cast

from pkobatch.api.annotations import reconcile_request
from pkobatch.api.conditions import (
    READY_MESSAGE,
    find_condition,
    mark_ready,
    mark_reconciling,
    mark_stalled,
)
from pkobatch.api.constants import (
    CONDITION_DRIFTED,
    CONDITION_STALLED,
    RUN_OPERATIONS,
    Operation,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import job_finished
from pkobatch.api.run import Run, RunKind
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.stack.status import Condition
from pkobatch.api.stack.validation import SpecCheck, load_stack_spec
from pkobatch.api.status import (
    LastUpdate,
    StatusObject,
    current_update,
    operation_request_status,
)
from pkobatch.config import Settings
from pkobatch.controller.decision import Decision, JobDeletion, Observed
from pkobatch.controller.outcome import Event, EventType
from pkobatch.controller.retry import resting_state

# Finished Jobs named in a run's snapshot (the Stack's history keeps a few more at most).
MAX_ENDED_RUNS: Final = 20


@dataclass(frozen=True)
class Refold:
    """The Job this decision would create exists and has finished: fold it, decide again."""

    job: Mapping[str, Any]


NEXT: Final = "next"
DONE: Final = "done"
StepResult = Literal["next", "done"] | Refold


def truncated(moment: datetime) -> datetime:
    """Kubernetes timestamps have whole seconds; status must not change on every pass."""
    return moment.replace(microsecond=0)


def parse_conditions(raw: Any) -> list[Condition]:
    conditions = []
    for item in raw or ():
        try:
            conditions.append(Condition.model_validate(item))
        except ValueError:
            continue
    return conditions


def creation(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def running_message(run: Run, name: str) -> str:
    return f"{run.operation} {name} is in progress"


def _operation_from_name(name: str) -> Operation:
    for operation in RUN_OPERATIONS:
        if f"-{operation}-" in name:
            return operation
    return "up"


class Draft:
    """One Stack's decision in the making (see the module docstring)."""

    def __init__(self, observed: Observed, settings: Settings, template: Mapping[str, Any]):
        self.obs = observed
        self.settings = settings
        self.template = template
        self.now = truncated(observed.now)
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
        self.conditions = parse_conditions(self.status.get("conditions"))
        self.check: SpecCheck = load_stack_spec(stack.get("spec") or {}, self.namespace)
        self.spec: StackSpec | None = self.check.spec if self.check.valid else None
        self.jobs = {str(j["metadata"]["name"]): j for j in observed.jobs}
        self.decision = Decision(status=self.status)
        self.requeue: list[float] = []
        # (Job, seconds): come back then only to look at that Job's pod (``look_at_pod_in``).
        self.pod_checks: list[tuple[str, float]] = []
        # A Job whose run is recorded but whose pod is still stopping: no new run yet.
        self.stopping = ""
        # Why ``runs.start_run`` could not create the run's Job (its build or the API server
        # refused it).
        self.start_refused = ""
        # The revision to deploy, once ``source.source`` has resolved it (None: unknown).
        self.commit: str | None = None

    def valid_spec(self) -> StackSpec:
        """The parsed spec, for the steps after ``sync.valid_spec`` (which stops on none)."""
        assert self.spec is not None
        return self.spec

    # -- status bookkeeping ----------------------------------------------------------------

    def event(self, event_type: EventType, reason: str, message: str) -> None:
        self.decision.events.append(Event(event_type, reason, bound_message(message)))

    def requeue_in(self, delay: timedelta | float) -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        self.requeue.append(max(seconds, 1.0))

    def look_at_pod_in(self, job: str, delay: timedelta) -> None:
        """Come back after ``delay`` to look at Job ``job``'s pod: whether it was created,
        whether it started (``Decision.pod_check``: the shell drops that wake-up when the
        Job shows its pod ready first)."""
        self.pod_checks.append((job, max(delay.total_seconds(), 1.0)))

    def reconciling(self, reason: str, message: str) -> None:
        self.conditions = mark_reconciling(
            self.conditions, reason, message, now=self.now, observed_generation=self.generation
        )

    def stalled(self, reason: str, message: str, event_reason: str | None = None) -> None:
        previous = find_condition(self.conditions, CONDITION_STALLED)
        self.conditions = mark_stalled(
            self.conditions, reason, message, now=self.now, observed_generation=self.generation
        )
        changed = previous is None or (previous.reason, previous.message) != (reason, message)
        if changed:
            self.event("Warning", event_reason or reason, message)

    def ready(self) -> None:
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

    def resting(self, last: LastUpdate) -> None:
        """Conditions when no run is needed right now (``retry.resting_state``)."""
        resting = resting_state(last, self.settings)
        if resting.kind == "ready":
            self.ready()
        elif resting.kind == "stalled":
            self.stalled(resting.reason, resting.message)
        else:
            self.reconciling(resting.reason, resting.message)

    # -- the Stack's runs ------------------------------------------------------------------

    def delete_job(self, job: Mapping[str, Any], foreground: bool = False) -> None:
        """Delete ``job`` (by its UID); ``foreground``: see ``JobDeletion``."""
        meta = job["metadata"]
        self.decision.delete_jobs.append(
            JobDeletion(str(meta["name"]), str(meta.get("uid") or ""), foreground)
        )

    def current_name(self) -> str:
        return str(current_update(self.status).get("name") or "")

    def set_current(self, run: Run, name: str) -> None:
        self.status["currentUpdate"] = {
            "generation": run.generation,
            "reconcileRequest": run.reconcile_request,
            "name": name,
            "commit": run.commit,
        }

    def blocking_job(self) -> Mapping[str, Any] | None:
        """Any unfinished Job of the Stack, including one being deleted (its pod may run)."""
        current = self.jobs.get(self.current_name())
        if current is not None and not job_finished(current):
            return current
        active = [j for j in self.jobs.values() if not job_finished(j)]
        return max(active, key=creation) if active else None

    def ended_runs(self) -> list[str]:
        """The newest of this Stack's Jobs that have finished: the Job controller marks a
        Job finished only once none of its pods runs, so their Pulumi locks are stale."""
        ended = sorted(
            (j for j in self.jobs.values() if job_finished(j)), key=creation, reverse=True
        )
        return [str(j["metadata"]["name"]) for j in ended[:MAX_ENDED_RUNS]]

    def run_of(self, name: str, job: Mapping[str, Any] | None) -> Run:
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
