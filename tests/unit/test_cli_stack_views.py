"""What the CLI reads from a Stack object, status selectors and schedules (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pkobatch.cli.stack_views import (
    parse_status_selector,
    select,
    stack_view,
    upcoming_runs,
)


def stack(spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "s", "namespace": "n", "uid": "uid-1", "generation": 2},
        "spec": {"stack": "dev", **(spec or {})},
        "status": status,
    }


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def test_stalled_explains_more_than_ready() -> None:
    view = stack_view(
        stack(
            conditions=[
                condition("Ready", "False", "NotReadyStalled", "reconciliation is stalled"),
                condition("Stalled", "True", "SpecInvalid", "spec.branch and spec.commit"),
            ]
        )
    )

    assert (view.ready, view.reason, view.message) == (
        "False",
        "SpecInvalid",
        "spec.branch and spec.commit",
    )


def test_ready_stack() -> None:
    view = stack_view(
        stack(
            lastUpdate={"type": "up", "state": "succeeded", "name": "s-up-1"},
            conditions=[condition("Ready", "True", "ProcessingCompleted", "up to date")],
        )
    )

    assert (view.last_operation, view.result, view.ready, view.reason) == (
        "up",
        "succeeded",
        "True",
        "ProcessingCompleted",
    )
    assert view.last_run == "s-up-1"


def test_a_running_request_names_its_operation() -> None:
    view = stack_view(
        stack(
            lastUpdate={"type": "up", "state": "succeeded"},
            currentUpdate={"name": "s-refresh-9"},
            operationRequest={
                "request": "refresh:t",
                "operation": "refresh",
                "state": "Running",
                "jobName": "s-refresh-9",
            },
        )
    )

    assert (view.last_operation, view.result, view.current_run) == (
        "refresh",
        "running",
        "s-refresh-9",
    )


def test_a_running_run_of_unknown_type_does_not_claim_the_last_type() -> None:
    view = stack_view(
        stack(lastUpdate={"type": "up", "state": "failed"}, currentUpdate={"name": "j"})
    )

    assert (view.last_operation, view.result) == ("", "running")


def test_pending_request_is_one_the_controller_has_not_acknowledged() -> None:
    acknowledged = stack(operationRequest={"request": "up:1", "state": "Pending"})
    acknowledged["metadata"]["annotations"] = {"pkobatch.io/operation-request": "up:1"}
    waiting = stack(operationRequest={"request": "up:1", "state": "Succeeded"})
    waiting["metadata"]["annotations"] = {"pkobatch.io/operation-request": "up:2"}

    assert stack_view(acknowledged).pending_request == ""
    assert stack_view(waiting).pending_request == "up:2"


def test_held_after_a_destroy_until_the_generation_changes() -> None:
    destroyed = {"type": "destroy", "state": "succeeded", "generation": 2}

    assert stack_view(stack(lastUpdate=destroyed)).held_after_destroy
    assert not stack_view(stack(lastUpdate={**destroyed, "generation": 1})).held_after_destroy
    assert not stack_view(stack(lastUpdate={**destroyed, "state": "failed"})).held_after_destroy


def test_a_garbage_status_does_not_break_the_view() -> None:
    view = stack_view({"metadata": {"name": "x"}, "spec": None, "status": {"conditions": "nope"}})

    assert (view.name, view.ready, view.stack, view.generation) == ("x", "", "", 0)


def test_status_selector_matches_case_insensitively_and_negates() -> None:
    ready = stack_view(stack(conditions=[condition("Ready", "True", "ProcessingCompleted")]))
    failing = stack_view(
        stack(
            {"suspend": True},
            lastUpdate={"type": "up", "state": "failed"},
            conditions=[condition("Ready", "False", "NotReadyStalled")],
        )
    )
    unknown = stack_view(stack())

    assert select([ready, failing, unknown], parse_status_selector("ready=false")) == [failing]
    assert select([ready, failing, unknown], parse_status_selector("ready!=true")) == [
        failing,
        unknown,
    ]
    assert select([ready, failing], parse_status_selector("suspended=true,result=failed")) == [
        failing
    ]
    assert select([ready, unknown], parse_status_selector("ready=unknown")) == [unknown]


@pytest.mark.parametrize("text", ["ready", "colour=red", "ready=", "=true"])
def test_status_selector_errors_say_what_is_allowed(text: str) -> None:
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_status_selector(text)


def test_upcoming_runs_merge_both_schedules_in_the_stack_time_zone() -> None:
    view = stack_view(
        stack(
            {
                "schedule": "0 3 * * *",
                "timeZone": "Europe/Berlin",
                "preview": True,
                "driftDetection": {"schedule": "30 2 * * *"},
            }
        )
    )

    runs = upcoming_runs(view, datetime(2026, 11, 30, 12, 0, tzinfo=UTC), count=2)

    assert [(r.at.isoformat(), r.source, r.operation) for r in runs] == [
        ("2026-12-01T01:30:00+00:00", "drift check", "refresh --preview-only"),
        ("2026-12-01T02:00:00+00:00", "schedule", "preview"),
        ("2026-12-02T01:30:00+00:00", "drift check", "refresh --preview-only"),
        ("2026-12-02T02:00:00+00:00", "schedule", "preview"),
    ]


def test_hashed_schedules_depend_on_the_stack_uid() -> None:
    after = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    first = stack({"schedule": "H * * * *"})
    second = stack({"schedule": "H * * * *"})
    second["metadata"]["uid"] = "uid-2"

    times = {upcoming_runs(stack_view(s), after)[0].at.minute for s in (first, second)}

    assert upcoming_runs(stack_view(first), after) == upcoming_runs(stack_view(first), after)
    assert len(times) == 2
