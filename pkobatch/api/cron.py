"""Cron schedules of Stacks: when the next run is, and which run is due now (pure).

Shared by the controller (``spec.schedule``, ``spec.driftDetection.schedule``) and the CLI
(``pkobatch schedule NAME --next 5``), so both always agree on the times.

- Expressions have exactly 5 fields (validated by ``pkobatch.api.stack.spec.check_cron``). ``H``
  picks a stable value per Stack: the hash seed is the Stack's UID, so a fleet with
  ``H 3 * * *`` spreads over the hour instead of starting all at 03:00.
- Times are evaluated in the Stack's IANA time zone (``spec.timeZone``, default UTC), so
  "0 3 * * *" stays at 03:00 local time across daylight-saving changes; results are UTC.
- Missed runs (controller down, Stack suspended) follow Kubernetes CronJob: only the most
  recent missed time runs, and only if it is not older than the starting deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

if TYPE_CHECKING:
    # Imported where used: importing croniter runs `file` on the interpreter (its 32-bit
    # check), a cost every run's pod would pay through the Stack model (api.stack).
    from croniter import croniter

DEFAULT_TIME_ZONE: Final = "UTC"
# Counting missed times stops here (CronJob reports "too many missed start times" at 100).
MAX_COUNTED_MISSED: Final = 100
# Every valid 5-field expression fires at least once in 8 years (Feb 29 on a given weekday
# needs up to 28); bounding the search keeps bad input from spinning.
_MAX_YEARS_BETWEEN_MATCHES: Final = 30


class ScheduleError(ValueError):
    """The expression or time zone cannot be evaluated."""


@dataclass(frozen=True)
class DueRun:
    """The scheduled time that should run now, and how many earlier times were skipped."""

    time: datetime
    skipped: int


def load_time_zone(time_zone: str | None) -> ZoneInfo:
    """The zone for an IANA name (UTC when empty); ScheduleError (a ValueError) otherwise."""
    name = time_zone or DEFAULT_TIME_ZONE
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"{name!r} is not an IANA time zone: use a name like 'UTC' or 'Europe/Paris'"
        ) from None


def _iterator(expr: str, start: datetime, time_zone: str | None, hash_id: str) -> croniter:
    from croniter import CroniterError, croniter

    if start.tzinfo is None:
        raise ScheduleError("schedule times must be timezone-aware")
    if len(expr.split()) != 5:
        raise ScheduleError(f"{expr!r} must have exactly 5 fields")
    try:
        return croniter(
            expr,
            start.astimezone(load_time_zone(time_zone)),
            hash_id=hash_id or None,
            max_years_between_matches=_MAX_YEARS_BETWEEN_MATCHES,
        )
    except (CroniterError, ValueError, KeyError) as exc:
        raise ScheduleError(f"{expr!r} is not a valid cron expression: {exc}") from None


def _next(it: croniter) -> datetime:
    from croniter import CroniterError

    try:
        value: datetime = it.get_next(datetime)
    except (CroniterError, ValueError) as exc:
        raise ScheduleError(f"the schedule never fires: {exc}") from None
    return value.astimezone(UTC)


def _prev(it: croniter) -> datetime:
    from croniter import CroniterError

    try:
        value: datetime = it.get_prev(datetime)
    except (CroniterError, ValueError) as exc:
        raise ScheduleError(f"the schedule never fired: {exc}") from None
    return value.astimezone(UTC)


def next_times(
    expr: str,
    *,
    after: datetime,
    count: int = 1,
    time_zone: str | None = None,
    hash_id: str = "",
) -> list[datetime]:
    """The next ``count`` scheduled times strictly after ``after`` (UTC)."""
    it = _iterator(expr, after, time_zone, hash_id)
    return [_next(it) for _ in range(count)]


def next_time(
    expr: str, *, after: datetime, time_zone: str | None = None, hash_id: str = ""
) -> datetime:
    """The first scheduled time strictly after ``after`` (UTC)."""
    return next_times(expr, after=after, time_zone=time_zone, hash_id=hash_id)[0]


def due_run(
    expr: str,
    *,
    since: datetime,
    now: datetime,
    time_zone: str | None = None,
    hash_id: str = "",
    starting_deadline: timedelta | None = None,
) -> DueRun | None:
    """The most recent scheduled time in (``since``, ``now``] that may still start, or None.

    ``since`` is the last time that already ran (or the Stack's creation). Older times in
    the window are skipped, not replayed, and a time older than ``now - starting_deadline``
    is dropped, like a Kubernetes CronJob's ``startingDeadlineSeconds``.
    """
    earliest = since
    if starting_deadline is not None and earliest < now - starting_deadline:
        earliest = now - starting_deadline
    if earliest >= now:
        return None
    # get_prev is strictly before its start; nudge so a time equal to ``now`` counts.
    latest = _prev(_iterator(expr, now + timedelta(microseconds=1), time_zone, hash_id))
    if latest <= earliest:
        return None
    skipped = 0
    it = _iterator(expr, earliest, time_zone, hash_id)
    while skipped < MAX_COUNTED_MISSED and _next(it) < latest:
        skipped += 1
    return DueRun(time=latest, skipped=skipped)
