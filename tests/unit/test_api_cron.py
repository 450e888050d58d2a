"""pkobatch.api.cron: next times and due runs, time zones, H spreading, missed runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pkobatch.api.cron import (
    MAX_COUNTED_MISSED,
    DueRun,
    ScheduleError,
    due_run,
    next_time,
    next_times,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_next_times_are_utc_and_strictly_after() -> None:
    times = next_times("0 * * * *", after=utc(2026, 5, 1, 10, 0), count=3)
    assert times == [utc(2026, 5, 1, 11), utc(2026, 5, 1, 12), utc(2026, 5, 1, 13)]
    assert all(t.tzinfo is UTC for t in times)


def test_local_time_is_kept_across_spring_forward() -> None:
    # Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST.
    times = next_times("0 3 * * *", after=utc(2026, 3, 28, 12), count=3, time_zone="Europe/Berlin")
    # 03:00 local is 02:00 UTC before the change and 01:00 UTC after it.
    assert times == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 1), utc(2026, 3, 31, 1)]


def test_time_in_the_spring_gap_runs_once_at_the_end_of_the_gap() -> None:
    times = next_times("30 2 * * *", after=utc(2026, 3, 28, 12), count=2, time_zone="Europe/Berlin")
    # 02:30 does not exist on the 29th; the run happens once, at 03:00 CEST (01:00 UTC).
    assert times == [utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)]


def test_local_time_is_kept_across_fall_back() -> None:
    # Europe/Berlin: 2026-10-25 03:00 CEST -> 02:00 CET.
    times = next_times("0 4 * * *", after=utc(2026, 10, 24, 12), count=2, time_zone="Europe/Berlin")
    assert times == [utc(2026, 10, 25, 3), utc(2026, 10, 26, 3)]


def test_h_is_stable_per_hash_id_and_spreads_stacks() -> None:
    after = utc(2026, 1, 1)
    minutes = {next_time("H 3 * * *", after=after, hash_id=f"uid-{i}").minute for i in range(20)}
    assert len(minutes) > 5  # spread over the hour
    first = next_time("H 3 * * *", after=after, hash_id="uid-7")
    again = next_time("H 3 * * *", after=after, hash_id="uid-7")
    assert first == again
    assert first.hour == 3


def test_due_run_none_before_the_first_time() -> None:
    assert due_run("0 3 * * *", since=utc(2026, 1, 1, 4), now=utc(2026, 1, 2, 2, 59)) is None


def test_due_run_at_exactly_the_scheduled_time() -> None:
    run = due_run("0 3 * * *", since=utc(2026, 1, 1, 4), now=utc(2026, 1, 2, 3))
    assert run == DueRun(time=utc(2026, 1, 2, 3), skipped=0)


def test_due_run_not_again_once_recorded() -> None:
    assert due_run("0 3 * * *", since=utc(2026, 1, 2, 3), now=utc(2026, 1, 2, 3, 30)) is None


def test_missed_runs_collapse_to_the_most_recent() -> None:
    # Controller down from 00:00 to 01:02: twelve 5-minute slots, only 01:00 runs.
    run = due_run("*/5 * * * *", since=utc(2026, 1, 1, 0, 0), now=utc(2026, 1, 1, 1, 2))
    assert run == DueRun(time=utc(2026, 1, 1, 1, 0), skipped=11)


def test_skipped_count_is_bounded() -> None:
    run = due_run("* * * * *", since=utc(2026, 1, 1), now=utc(2026, 1, 3))
    assert run is not None
    assert run.time == utc(2026, 1, 3)
    assert run.skipped == MAX_COUNTED_MISSED


def test_starting_deadline_drops_a_time_that_is_too_old() -> None:
    since = utc(2026, 1, 1, 4)
    now = utc(2026, 1, 2, 3, 20)
    assert due_run("0 3 * * *", since=since, now=now) == DueRun(utc(2026, 1, 2, 3), 0)
    late = due_run("0 3 * * *", since=since, now=now, starting_deadline=timedelta(minutes=10))
    assert late is None
    in_time = due_run("0 3 * * *", since=since, now=now, starting_deadline=timedelta(minutes=30))
    assert in_time == DueRun(utc(2026, 1, 2, 3), 0)


def test_due_run_uses_the_time_zone() -> None:
    since = utc(2026, 6, 1)
    # 03:00 in New York (EDT, UTC-4) is 07:00 UTC.
    assert (
        due_run("0 3 * * *", since=since, now=utc(2026, 6, 1, 6, 59), time_zone="America/New_York")
        is None
    )
    run = due_run("0 3 * * *", since=since, now=utc(2026, 6, 1, 7), time_zone="America/New_York")
    assert run == DueRun(utc(2026, 6, 1, 7), 0)


@pytest.mark.parametrize(
    ("expr", "zone"),
    [
        ("0 3 * * *", "Mars/Olympus"),
        ("0 3 * *", "UTC"),
        ("0 0 3 * * *", "UTC"),
        ("61 * * * *", "UTC"),
    ],
)
def test_invalid_input_raises_schedule_error(expr: str, zone: str) -> None:
    with pytest.raises(ScheduleError):
        next_time(expr, after=utc(2026, 1, 1), time_zone=zone)


def test_naive_times_are_rejected() -> None:
    with pytest.raises(ScheduleError, match="timezone-aware"):
        next_time("0 3 * * *", after=datetime(2026, 1, 1))
