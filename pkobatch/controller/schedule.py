"""Cron schedules of a Stack: ``spec.schedule`` runs and drift checks (pure, given a clock).

Schedules follow Kubernetes CronJobs: the last handled time is in status
(``lastScheduleTime``, ``lastDriftCheck.scheduledTime``); after downtime only the most
recent missed time runs, and only within ``Settings.schedule_starting_deadline``.

PKO's timing rules (resync period, failure backoff) are in ``retry.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from pkobatch.api.cron import DueRun, ScheduleError, due_run, next_time
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.status import last_drift_check, last_update
from pkobatch.api.timestamps import parse_time
from pkobatch.config import Settings


def scheduled_run_due(
    spec: StackSpec,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    now: datetime,
    settings: Settings,
) -> DueRun | None:
    """The ``spec.schedule`` time that should start a run now, if any."""
    if not spec.schedule:
        return None
    since = parse_time(status.get("lastScheduleTime")) or parse_time(meta.get("creationTimestamp"))
    return _due(spec.schedule, spec, meta, since, now, settings)


def drift_check_due(
    spec: StackSpec,
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    now: datetime,
    settings: Settings,
) -> DueRun | None:
    """The drift-check time that should start a check now, if any.

    A successful update is as good as a check (it left the stack as the program says), so
    times before the last successful ``up`` do not count as missed.
    """
    if spec.drift_detection is None:
        return None
    last_check = last_drift_check(status)
    candidates = [
        parse_time(last_check.get("scheduledTime")),
        parse_time(meta.get("creationTimestamp")),
    ]
    last = last_update(status)
    if last.get("state") == "succeeded" and last.get("type") == "up":
        candidates.append(parse_time(last.get("lastResyncTime")))
    since = max((c for c in candidates if c is not None), default=None)
    return _due(spec.drift_detection.schedule, spec, meta, since, now, settings)


def _due(
    expr: str,
    spec: StackSpec,
    meta: Mapping[str, Any],
    since: datetime | None,
    now: datetime,
    settings: Settings,
) -> DueRun | None:
    try:
        return due_run(
            expr,
            since=since or now,
            now=now,
            time_zone=spec.time_zone,
            hash_id=_hash_id(meta),
            starting_deadline=settings.schedule_starting_deadline,
        )
    except ScheduleError:
        return None


def next_schedule_times(spec: StackSpec, meta: Mapping[str, Any], now: datetime) -> list[datetime]:
    """The next time of each cron schedule of the Stack (for the requeue)."""
    exprs: Iterable[str | None] = (
        spec.schedule,
        spec.drift_detection.schedule if spec.drift_detection else None,
    )
    times = []
    for expr in exprs:
        if expr:
            try:
                times.append(
                    next_time(expr, after=now, time_zone=spec.time_zone, hash_id=_hash_id(meta))
                )
            except ScheduleError:
                continue
    return times


def _hash_id(meta: Mapping[str, Any]) -> str:
    """``H`` is seeded by the Stack's UID: stable for the Stack, different across Stacks."""
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def newer_schedule_time(recorded: Any, moment: str) -> str | None:
    """``moment`` when it is later than the recorded ``lastScheduleTime``; None: keep that."""
    previous = parse_time(recorded)
    started = parse_time(moment)
    if started is not None and (previous is None or started > previous):
        return moment
    return None
