"""pkobatch.controller.schedule: the Stack's cron schedules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import Settings
from pkobatch.controller.schedule import (
    drift_check_due,
    next_schedule_times,
    scheduled_run_due,
)

NOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
META = {"uid": "u-1", "name": "s", "namespace": "n", "creationTimestamp": "2026-03-01T00:00:00Z"}


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", **fields})


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
