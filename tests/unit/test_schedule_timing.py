"""pkobatch.controller.schedule: PKO's timing rules and the Stack's cron schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pkobatch.api.stack import MAX_SPEC_SECONDS, StackSpec
from pkobatch.config import Settings
from pkobatch.controller.schedule import (
    cooldown,
    drift_check_due,
    next_schedule_times,
    resync_frequency,
    scheduled_run_due,
)

NOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
META = {"uid": "u-1", "name": "s", "namespace": "n", "creationTimestamp": "2026-03-01T00:00:00Z"}


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", **fields})


def test_resync_frequency_has_pkos_minimum() -> None:
    assert resync_frequency(spec()) == timedelta(seconds=60)
    assert resync_frequency(spec(resyncFrequencySeconds=5)) == timedelta(seconds=60)
    assert resync_frequency(spec(resyncFrequencySeconds=300)) == timedelta(seconds=300)


def test_out_of_bounds_seconds_are_clamped_never_overflow() -> None:
    # A spec stored before the CRD bounded these fields bypasses validation.
    huge = 2**63 - 1
    for value in (huge, -huge - 1):
        stored = StackSpec.model_construct(
            stack="dev",
            resync_frequency_seconds=value,
            retry_max_backoff_duration_seconds=value,
        )
        assert resync_frequency(stored) <= timedelta(seconds=MAX_SPEC_SECONDS)
        assert NOW + cooldown(40, stored, Settings()) > NOW
    assert cooldown(
        9,
        StackSpec.model_construct(stack="dev", retry_max_backoff_duration_seconds=huge),
        Settings(),
    ) == timedelta(seconds=min(10 * 3**9, MAX_SPEC_SECONDS))


def test_pko_backoff_ignores_a_negative_cap_and_waits_the_base_first() -> None:
    settings = Settings()
    negative = spec(retryMaxBackoffDurationSeconds=-1)
    assert [cooldown(n, negative, settings).total_seconds() for n in range(3)] == [10, 30, 90]
    low = spec(retryMaxBackoffDurationSeconds=4)
    assert [cooldown(n, low, settings).total_seconds() for n in range(3)] == [10, 4, 4]
    twenty = spec(retryMaxBackoffDurationSeconds=20)
    assert [cooldown(n, twenty, settings).total_seconds() for n in range(3)] == [10, 20, 20]


def test_cooldown_is_base_times_three_to_the_failures_capped() -> None:
    settings = Settings()
    assert [cooldown(n, spec(), settings).total_seconds() for n in range(4)] == [10, 30, 90, 270]
    assert cooldown(30, spec(), settings) == timedelta(hours=24)
    assert cooldown(5, spec(retryMaxBackoffDurationSeconds=100), settings) == timedelta(seconds=100)
    fast = Settings(retry={"base": "1s", "cap": "5s"})
    assert cooldown(3, spec(), fast) == timedelta(seconds=5)


def test_scheduled_run_due_since_creation_then_since_last_time() -> None:
    settings = Settings()
    s = spec(schedule="0 10 * * *")
    due = scheduled_run_due(s, META, {}, NOW, settings)
    assert due is not None and due.time == NOW
    assert (
        scheduled_run_due(s, META, {"lastScheduleTime": "2026-03-01T10:00:00Z"}, NOW, settings)
        is None
    )
    assert scheduled_run_due(spec(), META, {}, NOW, settings) is None


def test_schedule_uses_the_time_zone() -> None:
    s = spec(schedule="0 11 * * *", timeZone="Europe/Berlin")  # 11:00 CET == 10:00 UTC
    due = scheduled_run_due(s, META, {}, NOW, Settings())
    assert due is not None and due.time == NOW


def test_drift_check_counts_from_the_last_successful_up() -> None:
    settings = Settings()
    s = spec(driftDetection={"schedule": "30 9 * * *"})
    assert drift_check_due(s, META, {}, NOW, settings) is not None
    status = {
        "lastUpdate": {"state": "succeeded", "type": "up", "lastResyncTime": "2026-03-01T09:45:00Z"}
    }
    assert drift_check_due(s, META, status, NOW, settings) is None
    checked = {"lastDriftCheck": {"scheduledTime": "2026-03-01T09:30:00Z"}}
    assert drift_check_due(s, META, checked, NOW, settings) is None


def test_h_spreads_by_uid() -> None:
    s = spec(schedule="H * * * *")
    minutes = {
        next_schedule_times(s, {**META, "uid": f"uid-{i}"}, NOW)[0].minute for i in range(30)
    }
    assert len(minutes) > 10


def test_next_schedule_times_lists_each_schedule() -> None:
    s = spec(schedule="0 12 * * *", driftDetection={"schedule": "0 11 * * *"})
    assert next_schedule_times(s, META, NOW) == [
        datetime(2026, 3, 1, 12, tzinfo=UTC),
        datetime(2026, 3, 1, 11, tzinfo=UTC),
    ]
