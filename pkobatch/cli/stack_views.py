"""What the CLI shows about a Stack, read from the raw object (pure functions).

The CLI reads Stack objects as plain dicts rather than through the strict models of
``pkobatch.api.stack``: it must show whatever is stored — objects written by PKO, by an
older or newer pkobatch, or half-written status — and never refuse to display a Stack
because one field does not validate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pkobatch.api.annotations import recorded_request
from pkobatch.api.constants import (
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    OPERATION_REQUEST_ANNOTATION,
)
from pkobatch.api.cron import next_times
from pkobatch.api.objects import condition_in, conditions_of
from pkobatch.api.status import current_update, last_update, operation_request_status
from pkobatch.api.timestamps import parse_time

RUNNING: Final = "running"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class OperationRequestView:
    """The controller's acknowledgement of a CLI operation request (status.operationRequest)."""

    request: str
    operation: str
    state: str
    job_name: str
    message: str


@dataclass(frozen=True)
class StackView:
    namespace: str
    name: str
    uid: str
    stack: str
    created: datetime | None
    generation: int
    suspended: bool
    ready: str
    reason: str
    message: str
    last_operation: str
    result: str
    last_run: str
    current_run: str
    commit: str
    last_successful_commit: str
    last_finished: datetime | None
    failures: int
    permalink: str
    schedule: str
    drift_schedule: str
    time_zone: str
    preview_only: bool
    pending_request: str
    operation_request: OperationRequestView | None
    held_after_destroy: bool


def operation_request(stack: Mapping[str, Any]) -> OperationRequestView | None:
    raw = operation_request_status(stack.get("status"))
    if not raw.get("request"):
        return None
    return OperationRequestView(
        request=_str(raw.get("request")),
        operation=_str(raw.get("operation")),
        state=_str(raw.get("state")),
        job_name=_str(raw.get("jobName")),
        message=_str(raw.get("message")),
    )


def _headline(items: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The condition that explains the Stack best: Stalled, else Reconciling, else Ready."""
    for kind in (CONDITION_STALLED, CONDITION_RECONCILING):
        condition = condition_in(items, kind)
        if condition is not None and condition.get("status") == "True":
            return condition
    return condition_in(items, CONDITION_READY) or {}


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def stack_view(stack: Mapping[str, Any]) -> StackView:
    metadata = _dict(stack.get("metadata"))
    spec = _dict(stack.get("spec"))
    status = _dict(stack.get("status"))
    last = last_update(status)
    current = current_update(status)
    items = conditions_of(stack)
    ready = condition_in(items, CONDITION_READY)
    headline = _headline(items)
    request = operation_request(stack)
    current_run = _str(current.get("name"))
    generation = int(metadata.get("generation") or 0)

    last_operation = _str(last.get("type"))
    result = _str(last.get("state"))
    if current_run:
        result = RUNNING
        # PKO's currentUpdate has no type; a CLI request names its operation and Job.
        last_operation = (
            request.operation if request is not None and request.job_name == current_run else ""
        )
    annotation = _str(_dict(metadata.get("annotations")).get(OPERATION_REQUEST_ANNOTATION))
    recorded = recorded_request(annotation)
    pending = recorded if annotation and (request is None or request.request != recorded) else ""
    return StackView(
        namespace=_str(metadata.get("namespace")),
        name=_str(metadata.get("name")),
        uid=_str(metadata.get("uid")),
        stack=_str(spec.get("stack")),
        created=parse_time(metadata.get("creationTimestamp")),
        generation=generation,
        suspended=spec.get("suspend") is True,
        ready=_str(ready.get("status")) if ready else "",
        reason=_str(headline.get("reason")),
        message=_str(headline.get("message")),
        last_operation=last_operation,
        result=result,
        last_run=_str(last.get("name")),
        current_run=current_run,
        commit=_str(last.get("lastAttemptedCommit")),
        last_successful_commit=_str(last.get("lastSuccessfulCommit")),
        last_finished=parse_time(last.get("lastResyncTime")),
        failures=int(last.get("failures") or 0),
        permalink=_str(last.get("permalink")),
        schedule=_str(spec.get("schedule")),
        drift_schedule=_str(_dict(spec.get("driftDetection")).get("schedule")),
        time_zone=_str(spec.get("timeZone")) or "UTC",
        preview_only=spec.get("preview") is True,
        pending_request=pending,
        operation_request=request,
        held_after_destroy=(
            last.get("type") == "destroy"
            and last.get("state") == "succeeded"
            and int(last.get("generation") or 0) == generation
        ),
    )


# -- schedules ------------------------------------------------------------------------------

SCHEDULE: Final = "schedule"
DRIFT_CHECK: Final = "drift check"


@dataclass(frozen=True)
class ScheduledRun:
    """A future run from ``spec.schedule`` or ``spec.driftDetection.schedule``."""

    at: datetime
    source: str
    operation: str


def upcoming_runs(view: StackView, after: datetime, count: int = 1) -> list[ScheduledRun]:
    """The next ``count`` runs of each schedule, soonest first (ScheduleError if invalid)."""
    runs = []
    scheduled_operation = "preview" if view.preview_only else "up"
    for source, expr, operation in (
        (SCHEDULE, view.schedule, scheduled_operation),
        (DRIFT_CHECK, view.drift_schedule, "refresh --preview-only"),
    ):
        if expr:
            times = next_times(
                expr, after=after, count=count, time_zone=view.time_zone, hash_id=view.uid
            )
            runs += [ScheduledRun(at, source, operation) for at in times]
    return sorted(runs, key=lambda run: run.at)


# -- --status-selector ---------------------------------------------------------------------

STATUS_SELECTOR_KEYS: Final = ("ready", "suspended", "result", "reason", "operation")


@dataclass(frozen=True)
class StatusRequirement:
    key: str
    value: str
    negate: bool

    def matches(self, view: StackView) -> bool:
        actual = {
            "ready": view.ready or "Unknown",
            "suspended": str(view.suspended),
            "result": view.result,
            "reason": view.reason,
            "operation": view.last_operation,
        }[self.key]
        return (actual.lower() == self.value.lower()) != self.negate


def parse_status_selector(text: str) -> list[StatusRequirement]:
    """``ready=false,suspended!=true``; raises ValueError with a usage hint."""
    requirements = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        negate = "!=" in part
        key, sep, value = part.partition("!=" if negate else "=")
        key = key.strip().lower()
        if not sep or key not in STATUS_SELECTOR_KEYS or not value.strip():
            raise ValueError(
                f"invalid status selector {part!r}: use KEY=VALUE or KEY!=VALUE with KEY one of "
                + ", ".join(STATUS_SELECTOR_KEYS)
                + " (e.g. ready=false)"
            )
        requirements.append(StatusRequirement(key, value.strip(), negate))
    return requirements


def select(
    views: Sequence[StackView], requirements: Sequence[StatusRequirement]
) -> list[StackView]:
    return [v for v in views if all(r.matches(v) for r in requirements)]
