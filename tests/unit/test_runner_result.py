"""Result shaping: size bound with truncation, change counts, drift, the ConfigMap."""

from __future__ import annotations

import hashlib
import json

from pulumi.automation.events import OpType

from pkobatch.api.constants import (
    MANAGED_BY_LABEL,
    OPERATION_LABEL,
    RESULT_KEY,
    RESULT_LABEL,
    STACK_LABEL,
)
from pkobatch.api.run import (
    MAX_RESULT_BYTES,
    MAX_RESULT_OUTPUTS,
    MAX_TERMINATION_MESSAGE_BYTES,
    RunResult,
    StackRef,
    result_config_map,
    result_in_message,
    result_labels,
)
from pkobatch.runner.result import (
    bound_result,
    count_drift,
    find_permalink,
    fitted_result_message,
    normalize_changes,
)


def make_result(**fields: object) -> RunResult:
    base: dict[str, object] = {
        "operation": "up",
        "state": "succeeded",
        "reason": "Succeeded",
        "stack": StackRef(name="web", namespace="prod", uid="u1"),
        "job_name": "web-up-1",
    }
    return RunResult.model_validate({**base, **fields})


def size(result: RunResult) -> int:
    return len(result.to_json().encode())


def test_a_small_result_is_unchanged() -> None:
    result = make_result(outputs={"a": 1})
    assert bound_result(result) is result


def test_5000_outputs_are_cut_to_the_bound_and_flagged() -> None:
    outputs = {f"out{i:04d}": "v" * 200 for i in range(5000)}
    secret = [f"out{i:04d}" for i in range(0, 5000, 7)]
    result = bound_result(make_result(outputs=outputs, secret_outputs=secret))
    assert size(result) <= MAX_RESULT_BYTES
    assert result.truncated
    assert 0 < len(result.outputs) < 5000
    assert all(outputs[key] == value for key, value in result.outputs.items())
    assert f"kept {len(result.outputs)} of 5000 outputs" in result.message
    assert set(result.secret_outputs) == set(secret) & set(result.outputs)
    assert json.loads(result.to_json())["truncated"] is True


def test_small_outputs_are_cut_to_the_count_bound() -> None:
    outputs = {f"out{i}": f"value {i}" for i in range(5000)}
    result = bound_result(make_result(outputs=outputs))
    assert len(result.outputs) == MAX_RESULT_OUTPUTS
    assert result.truncated
    assert size(result) <= MAX_RESULT_BYTES


def test_truncation_keeps_an_existing_message() -> None:
    outputs = {f"k{i}": "v" * 1000 for i in range(2000)}
    result = bound_result(make_result(outputs=outputs, message="first line"), max_bytes=100_000)
    assert size(result) <= 100_000
    assert result.message.startswith("first line\n")


def test_one_huge_output_is_dropped_but_smaller_ones_kept() -> None:
    outputs = {"big": "x" * 200_000, "small": "y"}
    result = bound_result(make_result(outputs=outputs), max_bytes=50_000)
    assert result.outputs == {"small": "y"}
    assert result.truncated


def test_changes_get_string_keys() -> None:
    assert normalize_changes({OpType.SAME: 2, OpType.UPDATE: 1}) == {"same": 2, "update": 1}
    assert normalize_changes(None) == {}


def test_drift_counts_everything_but_unchanged_resources() -> None:
    assert count_drift({"same": 3, "update": 1, "delete": 2}) == 3
    assert count_drift({"same": 3}) == 0


def test_permalink_is_found_in_the_cli_output() -> None:
    stdout = (
        "Updating (dev)\n\nView in Browser (Ctrl+O): https://app.pulumi.com/o/p/dev/updates/4\n"
    )
    assert find_permalink(stdout) == "https://app.pulumi.com/o/p/dev/updates/4"
    assert find_permalink("View Live: https://x/y\n") == "https://x/y"
    assert find_permalink("Updating (dev):\n") == ""


def test_labels_come_from_the_job_when_known() -> None:
    job_labels = {
        MANAGED_BY_LABEL: "pkobatch",
        STACK_LABEL: "hashed-value",
        OPERATION_LABEL: "up",
        "unrelated": "x",
    }
    assert result_labels(job_labels, "web", "up") == {
        MANAGED_BY_LABEL: "pkobatch",
        STACK_LABEL: "hashed-value",
        OPERATION_LABEL: "up",
    }
    assert result_labels({}, "web", "destroy") == {
        MANAGED_BY_LABEL: "pkobatch",
        STACK_LABEL: "web",
        OPERATION_LABEL: "destroy",
    }
    assert STACK_LABEL not in result_labels({}, "x" * 64, "up")


def test_config_map_is_owned_by_the_job_and_holds_the_result() -> None:
    result = make_result(outputs={"a": "b"})
    body = result_config_map(
        result, name="web-up-1", namespace="prod", labels={"l": "v"}, job_uid="job-uid"
    )
    assert body["metadata"]["name"] == "web-up-1"
    assert body["metadata"]["namespace"] == "prod"
    assert body["metadata"]["labels"] == {"l": "v", RESULT_LABEL: "succeeded"}
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "web-up-1",
            "uid": "job-uid",
            "controller": True,
        }
    ]
    assert RunResult.model_validate_json(body["data"][RESULT_KEY]) == result
    unowned = result_config_map(result, name="n", namespace="ns", labels={}, job_uid=None)
    assert "ownerReferences" not in unowned["metadata"]


def test_a_result_in_the_termination_message_fits_the_kubelets_4096_bytes() -> None:
    # Random-looking values, so compression cannot make them fit.
    outputs = {f"key{i:03}": hashlib.sha256(str(i).encode()).hexdigest() for i in range(300)}
    result = make_result(
        state="failed",
        reason="ProgramError",
        message="the update failed: " + "x" * 2000,
        commit="c0ffee",
        outputs=outputs,
        secret_outputs=["key000"],
    )
    message = fitted_result_message(result)
    assert len(message.encode()) <= MAX_TERMINATION_MESSAGE_BYTES
    sent = RunResult.model_validate_json(result_in_message(message))
    assert (sent.state, sent.reason, sent.commit) == ("failed", "ProgramError", "c0ffee")
    assert sent.truncated and 0 < len(sent.outputs) < len(outputs)
    assert sent.message.startswith("the update failed: ")
    assert "result truncated" in sent.message


def test_a_result_that_fits_is_sent_whole() -> None:
    result = make_result(outputs={"url": "https://web.example"})
    sent = RunResult.model_validate_json(result_in_message(fitted_result_message(result)))
    assert sent == result and not sent.truncated


def test_a_damaged_inline_result_reads_as_none() -> None:
    message = fitted_result_message(make_result())
    assert result_in_message(message[:-10]) == ""
    assert result_in_message("pkobatch.io/result/v1 sha256:00") == ""
