"""The object accessors of pkobatch.api.objects, on the shapes the API server (or another
writer) may hand over."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pkobatch.api.objects import (
    condition_of,
    conditions_of,
    job_finished,
    owned_by,
    true_condition,
)
from pkobatch.cli.stack_views import stack_view


def job(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def test_conditions_read_as_absent_when_malformed() -> None:
    assert conditions_of({}) == []
    assert conditions_of({"status": "pending"}) == []
    assert conditions_of({"status": {"conditions": {"type": "Ready"}}}) == []
    assert conditions_of({"status": {"conditions": ["Ready", {"type": "Ready"}]}}) == [
        {"type": "Ready"}
    ]
    assert condition_of({"status": {"conditions": ["x"]}}, "Ready") is None


def test_a_true_condition_needs_status_true() -> None:
    stack = job(("Ready", "False"), ("Stalled", "True"))
    assert condition_of(stack, "Ready") == {"type": "Ready", "status": "False"}
    assert true_condition(stack, "Ready") is None
    assert true_condition(stack, "Stalled") == {"type": "Stalled", "status": "True"}


def test_a_job_is_finished_when_complete_or_failed_is_true() -> None:
    assert not job_finished(job())
    assert not job_finished(job(("Complete", "False"), ("Suspended", "True")))
    assert job_finished(job(("Complete", "True")))
    assert job_finished(job(("FailureTarget", "True"), ("Failed", "True")))


def test_owned_by_matches_an_owner_reference_uid() -> None:
    obj = {"metadata": {"ownerReferences": [{"uid": "a"}, "junk", {"uid": "b"}]}}
    assert owned_by(obj, "b")
    assert not owned_by(obj, "c")
    assert not owned_by({"metadata": None}, "a")


def test_the_cli_reads_a_timestamp_without_zone_as_utc() -> None:
    """A timestamp written without a zone (not by the API server) is UTC, so it compares
    with the CLI's aware "now" instead of raising TypeError."""
    view = stack_view({"metadata": {"name": "s", "creationTimestamp": "2026-01-02T03:04:05"}})
    assert view.created == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
