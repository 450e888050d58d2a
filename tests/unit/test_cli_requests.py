"""The request protocols as the CLI reads them from a Stack (pure)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pkobatch.api.annotations import MAX_REQUEST_CHARS, recorded_request
from pkobatch.api.constants import APPROVE_ANNOTATION, OPERATION_REQUEST_ANNOTATION
from pkobatch.cli.requests import (
    Progress,
    new_token,
    operation_progress,
    outcome,
    reconcile_progress,
    set_annotation,
    unacknowledged_request,
)
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.session import CommandFailed

REQUEST = "refresh:2026-11-30T12:00:00.123456789Z"


def stack(annotations: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "team", "annotations": annotations or {}},
        "status": status,
    }


def test_tokens_are_go_rfc3339nano_in_utc() -> None:
    assert new_token(1_764_504_000_123_456_789) == "2025-11-30T12:00:00.123456789Z"
    assert new_token(1_764_504_000_120_000_000) == "2025-11-30T12:00:00.12Z"
    assert new_token(1_764_504_000_000_000_000) == "2025-11-30T12:00:00Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", new_token())


def test_operation_request_lifecycle() -> None:
    annotated = {"pkobatch.io/operation-request": REQUEST}

    waiting = operation_progress(stack(annotated), REQUEST)
    running = operation_progress(
        stack(
            annotated,
            operationRequest={"request": REQUEST, "state": "Running", "jobName": "web-refresh-1"},
        ),
        REQUEST,
    )
    failed = operation_progress(
        stack(
            annotated,
            operationRequest={
                "request": REQUEST,
                "state": "Failed",
                "jobName": "web-refresh-1",
                "message": "refresh failed",
            },
        ),
        REQUEST,
    )
    rejected = operation_progress(
        stack(
            annotated,
            operationRequest={"request": REQUEST, "state": "Rejected", "message": "suspended"},
        ),
        REQUEST,
    )

    assert (waiting.phase, waiting.done) == ("Waiting for the controller", False)
    assert (running.phase, running.job_name, running.done) == ("Running", "web-refresh-1", False)
    assert (failed.done, failed.failed_reason, failed.message) == (True, "Failed", "refresh failed")
    assert (rejected.done, rejected.failed_reason) == (True, "Rejected")


def test_an_acknowledgement_of_an_older_request_is_not_ours() -> None:
    old = {"request": "up:old", "state": "Succeeded"}

    progress = operation_progress(
        stack({"pkobatch.io/operation-request": REQUEST}, operationRequest=old), REQUEST
    )

    assert not progress.done


def test_a_replaced_request_is_superseded() -> None:
    progress = operation_progress(stack({"pkobatch.io/operation-request": "up:later"}), REQUEST)

    assert (progress.done, progress.phase) == (True, "Superseded")
    assert "up:later" in progress.message


def test_unacknowledged_request() -> None:
    assert unacknowledged_request(stack({"pkobatch.io/operation-request": REQUEST})) == REQUEST
    assert (
        unacknowledged_request(
            stack({"pkobatch.io/operation-request": REQUEST}, operationRequest={"request": REQUEST})
        )
        is None
    )
    assert unacknowledged_request(stack()) is None


def test_reconcile_request_lifecycle() -> None:
    token = "2026-11-30T12:00:00Z"
    annotated = {"pulumi.com/reconciliation-request": token}
    ready = [{"type": "Ready", "status": "True", "reason": "ProcessingCompleted"}]
    stalled = [
        {"type": "Ready", "status": "False", "reason": "NotReadyStalled", "message": "stalled"}
    ]

    assert reconcile_progress(stack(annotated), token).phase == "Waiting for the controller"
    assert reconcile_progress(stack(annotated, observedReconcileRequest=token), token).phase == (
        "Pending"
    )
    running = reconcile_progress(
        stack(
            annotated,
            observedReconcileRequest=token,
            currentUpdate={"name": "web-up-2", "reconcileRequest": token},
        ),
        token,
    )
    done = reconcile_progress(
        stack(
            annotated,
            observedReconcileRequest=token,
            lastUpdate={"name": "web-up-2", "reconcileRequest": token, "state": "succeeded"},
            conditions=ready,
        ),
        token,
    )
    not_ready = reconcile_progress(
        stack(
            annotated,
            observedReconcileRequest=token,
            lastUpdate={"name": "web-up-2", "reconcileRequest": token, "state": "failed"},
            conditions=stalled,
        ),
        token,
    )
    superseded = reconcile_progress(stack({"pulumi.com/reconciliation-request": "x"}), token)

    assert (running.phase, running.job_name, running.done) == ("Running", "web-up-2", False)
    assert (done.phase, done.done, done.failed_reason) == ("Ready", True, "")
    assert (not_ready.phase, not_ready.failed_reason, not_ready.message) == (
        "NotReady",
        "NotReadyStalled",
        "stalled",
    )
    assert superseded.done and superseded.phase == "Superseded"


def test_outcome_takes_reason_and_changes_from_the_run_result() -> None:
    record = RunRecord(
        name="web-refresh-1",
        operation="refresh",
        state="failed",
        reason="ProgramError",
        message="error:\n  boom",
        changes={"same": 1},
    )
    progress = Progress(phase="Failed", job_name="web-refresh-1", done=True, failed_reason="Failed")

    result = outcome(stack(), "refresh", REQUEST, progress, record)

    assert (result.result, result.reason, result.message, result.ok) == (
        "failed",
        "ProgramError",
        "error: boom",
        False,
    )
    assert result.to_json()["changes"] == {"same": 1}


def test_outcome_without_a_result_uses_the_acknowledgement() -> None:
    rejected = Progress(phase="Rejected", done=True, failed_reason="Rejected", message="suspended")
    succeeded = Progress(phase="Succeeded", job_name="j", done=True)
    record = RunRecord(name="j", operation="up", state="succeeded", reason="Succeeded")

    no_result = outcome(stack(), "up", REQUEST, rejected, None)
    ok = outcome(stack(), "up", REQUEST, succeeded, record)

    assert (no_result.result, no_result.message, no_result.ok) == ("rejected", "suspended", False)
    assert (ok.result, ok.reason, ok.ok, ok.duration) == ("succeeded", "", True, None)
    assert ok.to_json()["durationSeconds"] is None


class RefusingKube:
    """A client that fails the test if anything is written."""

    def merge_patch(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the CLI wrote a value the controller would refuse")


def test_the_cli_never_writes_a_value_the_controller_would_refuse() -> None:
    target = {"metadata": {"name": "web", "namespace": "team", "resourceVersion": "1"}}
    kube: Any = RefusingKube()
    oversized = "up:" + "t" * MAX_REQUEST_CHARS
    with pytest.raises(CommandFailed, match=f"{OPERATION_REQUEST_ANNOTATION} is 259 characters"):
        set_annotation(kube, target, OPERATION_REQUEST_ANNOTATION, oversized)
    with pytest.raises(CommandFailed, match=f"{APPROVE_ANNOTATION}: 'plan-1' is not a plan id"):
        set_annotation(kube, target, APPROVE_ANNOTATION, "plan-1")


def test_an_oversized_request_the_controller_answered_is_not_pending() -> None:
    value = "up:" + "t" * 300 * 1024
    answered = stack(
        {OPERATION_REQUEST_ANNOTATION: value},
        operationRequest={"request": recorded_request(value), "state": "Rejected"},
    )
    assert unacknowledged_request(answered) is None
    waiting = unacknowledged_request(stack({OPERATION_REQUEST_ANNOTATION: value}))
    assert waiting == recorded_request(value) and len(waiting) <= MAX_REQUEST_CHARS
