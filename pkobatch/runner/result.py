"""Shaping a run's ``RunResult`` to its bounds (pure functions; its ConfigMap: ``api.run``).

Size: a result must fit ``MAX_RESULT_BYTES`` (far below the 1 MiB object limit) and hold at
most ``MAX_RESULT_OUTPUTS`` outputs. When it does not, outputs go first — kept in key order
while they fit — then the list of secret output keys; the result says ``truncated: true`` and
its message tells how many were kept. The message is already bounded by ``MAX_MESSAGE_CHARS``.

A result sent in the termination message (``fitted_result_message``: the run may not write
its ConfigMap) must fit ``MAX_TERMINATION_MESSAGE_BYTES`` compressed: it is cut the same way
to ever fewer bytes until it does; state, reason, commit, times and the start of the message
always stay, so the Stack's status still records what happened.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from pkobatch.api.run import (
    MAX_RESULT_BYTES,
    MAX_RESULT_OUTPUTS,
    MAX_TERMINATION_MESSAGE_BYTES,
    RunResult,
    inline_result_message,
)

# Step operations that mean "the real resource differs from the state" in a refresh.
_NOT_DRIFT: Final = frozenset({"same", "read"})
_PERMALINK: Final = re.compile(r"(?:View in Browser \(Ctrl\+O\)|View Live|Permalink):\s*(\S+)")


def normalize_changes(changes: Mapping[Any, Any] | None) -> dict[str, int]:
    """Pulumi's resource-change counts with plain string keys (the SDK uses an enum)."""
    normalized: dict[str, int] = {}
    for op, count in (changes or {}).items():
        key = str(getattr(op, "value", op))
        normalized[key] = normalized.get(key, 0) + int(count)
    return normalized


def count_drift(changes: Mapping[str, int]) -> int:
    """Resources a refresh found changed or gone outside Pulumi."""
    return sum(count for op, count in changes.items() if op not in _NOT_DRIFT)


def find_permalink(stdout: str) -> str:
    """The Pulumi Cloud URL of the update, from the CLI's output ("" for DIY backends)."""
    match = _PERMALINK.search(stdout)
    return match.group(1) if match else ""


def _size(result: RunResult) -> int:
    return len(result.to_json().encode("utf-8"))


def _entry_size(key: str, value: Any) -> int:
    # "key":value, — what one entry adds to the serialised object.
    return len(json.dumps({key: value}, ensure_ascii=False).encode("utf-8"))


def bound_result(
    result: RunResult, max_bytes: int = MAX_RESULT_BYTES, max_outputs: int = MAX_RESULT_OUTPUTS
) -> RunResult:
    """``result`` made to fit ``max_bytes`` of JSON and ``max_outputs`` outputs, dropping
    outputs first (kept in key order while they fit)."""
    if _size(result) <= max_bytes and len(result.outputs) <= max_outputs:
        return result
    bare = result.model_copy(update={"outputs": {}, "secret_outputs": [], "truncated": True})
    budget = max_bytes - _size(bare) - 256  # room for the truncation note in the message
    outputs: dict[str, Any] = {}
    for key in sorted(result.outputs):
        if len(outputs) == max_outputs:
            break
        cost = _entry_size(key, result.outputs[key])
        if cost > budget:
            continue
        outputs[key] = result.outputs[key]
        budget -= cost
    secret_outputs: list[str] = []
    for key in (k for k in result.secret_outputs if k in outputs):
        cost = len(json.dumps(key, ensure_ascii=False).encode("utf-8")) + 1
        if cost > budget:
            break
        secret_outputs.append(key)
        budget -= cost
    note = (
        f"result truncated (at most {max_outputs} outputs, {max_bytes} bytes): kept "
        f"{len(outputs)} of {len(result.outputs)} outputs"
    )
    message = f"{result.message}\n{note}".strip() if result.message else note
    bounded = bare.model_copy(
        update={"outputs": outputs, "secret_outputs": secret_outputs, "message": message}
    )
    if _size(bounded) > max_bytes:  # only a pathological message could get here
        bounded = bare.model_copy(update={"message": note})
    return bounded


def fitted_result_message(result: RunResult) -> str:
    """The termination message carrying ``result`` itself, made to fit
    ``MAX_TERMINATION_MESSAGE_BYTES``: fewer outputs (``bound_result``, flagged and noted),
    then none and a shorter message."""

    def fits(message: str) -> bool:
        return len(message.encode("utf-8")) <= MAX_TERMINATION_MESSAGE_BYTES

    message = inline_result_message(result.to_json())
    kept = len(result.outputs)
    while not fits(message) and kept:
        kept //= 2
        message = inline_result_message(bound_result(result, max_outputs=kept).to_json())
    bare = bound_result(result, max_outputs=0)
    chars = len(bare.message)
    while not fits(message) and chars:
        chars //= 2
        message = inline_result_message(
            bare.model_copy(update={"message": bare.message[:chars]}).to_json()
        )
    return message
