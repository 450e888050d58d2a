"""pkobatch.cli.approvals: reading a Stack's saved plan (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from pkobatch.cli.approvals import (
    approval_progress,
    chosen_plan,
    pending_record,
    plan_lines,
    rejection_progress,
)
from pkobatch.cli.session import CommandFailed

PLAN = "plan-00000000000000000001"


def stack(state: str, plan: str = PLAN, **record: Any) -> dict[str, Any]:
    return {
        "spec": {"approval": {"required": True}},
        "status": {"approval": {"planID": plan, "state": state, **record}},
    }


def test_the_pending_plan_and_a_mistaken_id() -> None:
    record = pending_record(stack("Pending"), "web")
    assert chosen_plan(record, None, "web") == PLAN
    assert chosen_plan(record, PLAN, "web") == PLAN
    with pytest.raises(CommandFailed, match="not the plan awaiting approval"):
        chosen_plan(record, "plan-other", "web")


def test_no_pending_plan_says_what_there_is() -> None:
    with pytest.raises(CommandFailed, match="Applied"):
        pending_record(stack("Applied"), "web")
    with pytest.raises(CommandFailed, match="does not require approval"):
        pending_record({"spec": {}}, "web")


def test_plan_lines_list_every_change_and_the_rest_counted() -> None:
    lines = plan_lines(
        "web",
        stack(
            "Pending",
            summary="2 to create",
            commit="abc",
            resources=[{"urn": "urn:a", "op": "create"}],
            resourceCount=2,
        )["status"]["approval"],
    )
    assert lines[0] == f"plan {PLAN} for stack web: 2 to create"
    assert "  create: urn:a" in lines
    assert "  ... and 1 more" in lines


@pytest.mark.parametrize(
    ("state", "phase", "done", "failed"),
    [
        ("Pending", "Waiting for the controller", False, ""),
        ("Approved", "Running", False, ""),
        ("Applied", "Succeeded", True, ""),
        ("Failed", "Failed", True, "Failed"),
        ("Rejected", "Rejected", True, "Rejected"),
    ],
)
def test_approval_progress(state: str, phase: str, done: bool, failed: str) -> None:
    progress = approval_progress(stack(state, updateJob="web-up-1"), PLAN)
    assert (progress.phase, progress.done, progress.failed_reason) == (phase, done, failed)


def test_a_replaced_plan_ends_the_wait_as_superseded() -> None:
    progress = approval_progress(stack("Pending", plan="plan-new"), PLAN)
    assert progress.done and progress.failed_reason == "Superseded"
    assert "plan-new" in progress.message


def test_a_rejection_is_done_when_the_controller_records_it() -> None:
    waiting = rejection_progress(stack("Pending"), PLAN)
    rejected = rejection_progress(stack("Rejected", message="rejected by x"), PLAN)
    approved_first = rejection_progress(stack("Approved", updateJob="web-up-1"), PLAN)
    replaced = rejection_progress(stack("Pending", plan="plan-other"), PLAN)

    assert (waiting.done, rejected.done) == (False, True)
    assert (rejected.phase, rejected.failed_reason) == ("Succeeded", "")
    assert (approved_first.done, approved_first.failed_reason) == (True, "Approved")
    assert approved_first.job_name == "web-up-1"
    assert (replaced.done, replaced.failed_reason) == (True, "Superseded")
