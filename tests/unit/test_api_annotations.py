"""pkobatch.api.annotations: each annotation the controller reads has one strict rule."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.annotations import (
    MAX_REQUEST_CHARS,
    RULES,
    accepted,
    reconcile_request,
    recorded_request,
    refusal,
    refusals,
)
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    APPROVE_ANNOTATION,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REJECT_ANNOTATION,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
PLAN_ID = "plan-0123456789abcdef0123"


def stack(annotations: dict[str, str], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "web", "annotations": annotations}, "status": status}


@pytest.mark.parametrize("value", ["true", "false"])
def test_abandon_accepts_only_true_and_false(value: str) -> None:
    assert refusal(ABANDON_ANNOTATION, value) is None
    assert accepted(stack({ABANDON_ANNOTATION: value}), ABANDON_ANNOTATION) == value


@pytest.mark.parametrize("value", ["no", "0", "1", "yes", "True", "FALSE", " true", "ture"])
def test_any_other_abandon_value_is_refused_and_the_destroy_still_runs(value: str) -> None:
    message = refusal(ABANDON_ANNOTATION, value)
    assert message is not None
    assert message.startswith(f"{ABANDON_ANNOTATION}: {value!r} is not true or false")
    assert "deleting the Stack runs its destroy" in message
    assert accepted(stack({ABANDON_ANNOTATION: value}), ABANDON_ANNOTATION) == ""


def test_an_absent_annotation_is_neither_accepted_nor_refused() -> None:
    assert accepted(stack({}), ABANDON_ANNOTATION) == ""
    assert refusals(stack({}), (ABANDON_ANNOTATION, RECONCILE_REQUEST_ANNOTATION)) == []


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_a_value_one_over_its_bound_is_refused_naming_the_annotation_and_the_bound(
    rule: Any,
) -> None:
    value = "x" * (rule.max_chars + 1)
    message = refusal(rule.name, value)
    assert message is not None
    assert message.startswith(
        f"{rule.name} is {rule.max_chars + 1} characters long, over its bound of {rule.max_chars}"
    )
    assert value not in message  # never quoted whole


def test_an_oversized_value_is_quoted_only_by_its_start() -> None:
    message = refusal(APPROVE_ANNOTATION, "plan-" + "z" * 10)
    assert message is not None and "'plan-zzzzzzzzzz' is not a plan id" in message
    long_bad = "!" * 200
    message = refusal(RECONCILE_REQUEST_ANNOTATION, long_bad * 2)
    assert message is not None and long_bad not in message


def test_operation_requests_need_an_operation_and_a_token_within_the_bound() -> None:
    assert refusal(OPERATION_REQUEST_ANNOTATION, "refresh:2026-05-01T10:00:00Z") is None
    assert refusal(OPERATION_REQUEST_ANNOTATION, "up:" + "t" * (MAX_REQUEST_CHARS - 3)) is None
    for value in ("explode:now", "up:", "up", ":token"):
        message = refusal(OPERATION_REQUEST_ANNOTATION, value)
        assert message is not None and "'<operation>:<token>'" in message, value
    message = refusal(OPERATION_REQUEST_ANNOTATION, "up:" + "t" * MAX_REQUEST_CHARS)
    assert message is not None and "over its bound of 256" in message
    assert "the request is rejected" in message


def test_approve_and_reject_take_a_plan_id() -> None:
    for name in (APPROVE_ANNOTATION, REJECT_ANNOTATION):
        assert refusal(name, PLAN_ID) is None
        assert accepted(stack({name: PLAN_ID}), name) == PLAN_ID
        for value in ("plan-1", PLAN_ID.upper(), PLAN_ID + "0", f" {PLAN_ID}"):
            assert accepted(stack({name: value}), name) == "", value


def test_refusals_lists_only_the_named_annotations_in_their_order() -> None:
    annotations = {
        ABANDON_ANNOTATION: "no",
        RECONCILE_REQUEST_ANNOTATION: "r" * 300,
        OPERATION_REQUEST_ANNOTATION: "explode:now",
        APPROVE_ANNOTATION: PLAN_ID,
    }
    found = refusals(
        stack(annotations), (RECONCILE_REQUEST_ANNOTATION, ABANDON_ANNOTATION, APPROVE_ANNOTATION)
    )
    assert [message.split(" ")[0].rstrip(":") for message in found] == [
        RECONCILE_REQUEST_ANNOTATION,
        ABANDON_ANNOTATION,
    ]


def test_a_refused_reconcile_request_leaves_the_last_accepted_one_in_force() -> None:
    assert reconcile_request(stack({RECONCILE_REQUEST_ANNOTATION: "now"})) == "now"
    oversized = {RECONCILE_REQUEST_ANNOTATION: "r" * (MAX_REQUEST_CHARS + 1)}
    assert reconcile_request(stack(oversized, observedReconcileRequest="before")) == "before"
    assert reconcile_request(stack(oversized)) == ""
    # An over-long value stored before the bound existed is not taken up again either.
    assert reconcile_request(stack(oversized, observedReconcileRequest="o" * 1000)) == ""


def test_status_records_a_request_within_its_bound_and_tells_oversized_ones_apart() -> None:
    assert recorded_request("up:t1") == "up:t1"
    big = "up:" + "t" * 250 * 1024
    other = big[:-1] + "u"
    assert len(recorded_request(big)) <= MAX_REQUEST_CHARS
    assert recorded_request(big) == recorded_request(big)
    assert recorded_request(big) != recorded_request(other)
    assert f"({len(big)} characters, sha256 " in recorded_request(big)


def test_docs_list_every_rule_with_its_bound() -> None:
    text = (DOCS / "operations.md").read_text()
    table = text.split("\n## Annotations: syntax and bounds\n", 1)[1].split("\n## ", 1)[0]
    for rule in RULES:
        row = next((line for line in table.splitlines() if f"`{rule.name}`" in line), "")
        assert row, f"docs/operations.md does not list {rule.name}"
        assert re.search(rf"\b{rule.max_chars}\b", row), f"{rule.name}: bound not documented"
