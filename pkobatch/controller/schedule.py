"""When a Stack runs next: PKO's timing rules and pkobatch's cron schedules (pure).

PKO v2.9's rules, kept as they are:

- ``resyncFreq = max(60 s, spec.resyncFrequencySeconds)`` — the period of
  ``continueResyncOnCommitMatch`` re-runs;
- after a failure, wait ``base · 3^failures`` (base 10 s, ``Settings.retry.base``), capped at
  ``spec.retryMaxBackoffDurationSeconds`` when it is positive, else ``Settings.retry.cap``
  (PKO's 24 h). As PKO's ``wait.Backoff`` does, the cap applies from the second wait on:
  the first wait is always ``base``, even under a lower cap;
- after ``Settings.retry.max_failures`` (3) counted failures: stalled, no more retries.

Cron schedules (``spec.schedule`` and ``spec.driftDetection.schedule``) follow Kubernetes
CronJobs: the last handled time is in status (``lastScheduleTime``,
``lastDriftCheck.scheduledTime``); after downtime only the most recent missed time runs,
and only within ``Settings.schedule_starting_deadline``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from pkobatch.api.constants import PKO_MIN_RESYNC_SECONDS
from pkobatch.api.schedule import DueRun, ScheduleError, due_run, next_time
from pkobatch.api.stack import MAX_SPEC_SECONDS, StackSpec
from pkobatch.api.timestamps import parse_time
from pkobatch.config import Settings

MIN_RESYNC: Final = timedelta(seconds=PKO_MIN_RESYNC_SECONDS)
# 3^40 seconds is far beyond any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT: Final = 40


def _spec_seconds(value: int | None) -> int:
    """A seconds field of the spec, clamped to the CRD's bounds (objects stored before the
    bounds existed may hold anything)."""
    return max(-MAX_SPEC_SECONDS, min(value or 0, MAX_SPEC_SECONDS))


def resync_frequency(spec: StackSpec) -> timedelta:
    return max(MIN_RESYNC, timedelta(seconds=_spec_seconds(spec.resync_frequency_seconds)))


def backoff_cap(spec: StackSpec, settings: Settings) -> timedelta:
    """PKO: a positive ``retryMaxBackoffDurationSeconds`` replaces the default cap; zero and
    negative values are ignored."""
    seconds = _spec_seconds(spec.retry_max_backoff_duration_seconds)
    return timedelta(seconds=seconds) if seconds > 0 else settings.retry.cap


def cooldown(failures: int, spec: StackSpec, settings: Settings) -> timedelta:
    """How long to wait after a failed run before retrying it (PKO's ``cooldown``)."""
    base = settings.retry.base.total_seconds()
    if failures <= 0:
        return timedelta(seconds=base)
    exponent = min(failures, _MAX_EXPONENT)
    return timedelta(seconds=min(base * 3.0**exponent, backoff_cap(spec, settings).total_seconds()))


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
    last_check = status.get("lastDriftCheck") or {}
    candidates = [
        parse_time(last_check.get("scheduledTime")),
        parse_time(meta.get("creationTimestamp")),
    ]
    last_update = status.get("lastUpdate") or {}
    if last_update.get("state") == "succeeded" and last_update.get("type") == "up":
        candidates.append(parse_time(last_update.get("lastResyncTime")))
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
