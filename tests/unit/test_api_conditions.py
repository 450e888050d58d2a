"""The ready protocol helpers (Ready / Reconciling / Stalled)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pkobatch.api.conditions import (
    IN_PROGRESS_MESSAGE,
    READY_MESSAGE,
    STALLED_MESSAGE,
    find_condition,
    mark_ready,
    mark_reconciling,
    mark_stalled,
    set_condition,
)
from pkobatch.api.constants import (
    CONDITION_DRIFTED,
    RECONCILING_PROCESSING_REASON,
    RECONCILING_RETRY_REASON,
    STALLED_SPEC_INVALID_REASON,
)
from pkobatch.api.stack.status import Condition

T0 = datetime(2026, 8, 1, 10, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
T2 = T1 + timedelta(minutes=5)


def summary(conditions: list[Condition]) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in conditions}


def ready_is_true(conditions: list[Condition]) -> bool:
    found = find_condition(conditions, "Ready")
    return found is not None and found.status == "True"


def test_reconciling_then_ready_then_stalled() -> None:
    conditions = mark_reconciling(
        [], RECONCILING_PROCESSING_REASON, "stack is being processed", now=T0, observed_generation=3
    )
    assert summary(conditions) == {
        "Ready": ("False", "NotReadyInProgress", IN_PROGRESS_MESSAGE),
        "Reconciling": ("True", "StackProcessing", "stack is being processed"),
    }
    assert all(c.observed_generation == 3 for c in conditions)

    conditions = mark_ready(conditions, now=T1, observed_generation=3)
    assert summary(conditions) == {"Ready": ("True", "ProcessingCompleted", READY_MESSAGE)}
    assert ready_is_true(conditions)

    conditions = mark_stalled(
        conditions, STALLED_SPEC_INVALID_REASON, "spec.stack is empty", now=T2
    )
    assert summary(conditions) == {
        "Ready": ("False", "NotReadyStalled", STALLED_MESSAGE),
        "Stalled": ("True", "SpecInvalid", "spec.stack is empty"),
    }
    assert not ready_is_true(conditions)


def test_stalled_to_reconciling_removes_stalled() -> None:
    conditions = mark_stalled([], "UpdateFailed", "up failed 3 times", now=T0)
    conditions = mark_reconciling(conditions, RECONCILING_RETRY_REASON, "1 update failure", now=T1)
    assert find_condition(conditions, "Stalled") is None
    reconciling = find_condition(conditions, "Reconciling")
    assert reconciling is not None
    assert reconciling.reason == "RetryingAfterFailure"


def test_transition_time_moves_only_when_status_changes() -> None:
    conditions = mark_reconciling([], RECONCILING_PROCESSING_REASON, "a", now=T0)
    conditions = mark_reconciling(conditions, RECONCILING_RETRY_REASON, "b", now=T1)
    ready = find_condition(conditions, "Ready")
    reconciling = find_condition(conditions, "Reconciling")
    assert ready is not None and reconciling is not None
    assert ready.last_transition_time == T0
    assert reconciling.last_transition_time == T0
    assert reconciling.reason == RECONCILING_RETRY_REASON  # reason and message still update
    assert reconciling.message == "b"

    conditions = mark_ready(conditions, now=T2)
    ready = find_condition(conditions, "Ready")
    assert ready is not None
    assert ready.last_transition_time == T2


def test_other_conditions_are_kept_in_place() -> None:
    conditions = set_condition(
        [], CONDITION_DRIFTED, "True", "DriftDetected", "2 resources", now=T0
    )
    conditions = mark_reconciling(conditions, RECONCILING_PROCESSING_REASON, "x", now=T1)
    conditions = mark_ready(conditions, now=T2)
    assert [c.type for c in conditions] == [CONDITION_DRIFTED, "Ready"]
    drifted = find_condition(conditions, CONDITION_DRIFTED)
    assert drifted is not None
    assert drifted.last_transition_time == T0


def test_inputs_are_not_modified() -> None:
    original = mark_reconciling([], RECONCILING_PROCESSING_REASON, "x", now=T0)
    snapshot = [c.model_copy() for c in original]
    mark_ready(original, now=T1)
    assert original == snapshot


def test_conditions_serialise_like_metav1() -> None:
    (ready,) = [c for c in mark_ready([], now=T0, observed_generation=2) if c.type == "Ready"]
    assert ready.to_manifest() == {
        "type": "Ready",
        "status": "True",
        "reason": "ProcessingCompleted",
        "message": READY_MESSAGE,
        "lastTransitionTime": "2026-08-01T10:00:00Z",
        "observedGeneration": 2,
    }
