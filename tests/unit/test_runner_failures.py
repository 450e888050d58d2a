"""Classifying failed Pulumi commands and quoting what went wrong, briefly."""

from __future__ import annotations

import pytest

from pkobatch.api.constants import RESULT_REASONS
from pkobatch.api.messages import MAX_MESSAGE_CHARS, bound_message
from pkobatch.runner.failures import classify_pulumi_error, pulumi_error_message
from pkobatch.runner.redact import Redactor

# Real output of `pulumi up` (3.259.0) for a program with a SyntaxError, run inline.
PROGRAM_ERROR_STDOUT = """Updating (bad):

    pulumi:pulumi:Stack rtprog-bad running error: Program failed with an unhandled exception:
    pulumi:pulumi:Stack rtprog-bad **failed** 2 errors
Diagnostics:
  pulumi:pulumi:Stack (rtprog-bad):
    error: Program failed with an unhandled exception:
      File "__main__.py", line 2
        def broken(:
                   ^
    SyntaxError: invalid syntax
    error: an unhandled error occurred: Program failed with an unhandled exception:
      File "__main__.py", line 2
        def broken(:
                   ^
    SyntaxError: invalid syntax

Resources:
    1 unchanged
    1 errored

Duration: 1s
"""
LOCKED_STDERR = (
    "error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) "
    "to end or delete the lock file with `pulumi cancel`."
)


def test_a_program_error_quotes_the_python_error_once() -> None:
    failure = classify_pulumi_error("RuntimeError", PROGRAM_ERROR_STDOUT, "")
    assert failure.reason == "ProgramError"
    assert "SyntaxError: invalid syntax" in failure.message
    assert failure.message.count("SyntaxError") == 1
    assert "Duration" not in failure.message
    assert failure.message.startswith("pulumi:pulumi:Stack (rtprog-bad): error: Program failed")


@pytest.mark.parametrize(
    ("kind", "stdout", "stderr", "reason"),
    [
        ("StackNotFoundError", "", "error: no stack named 'dev' found", "StackNotFound"),
        ("ConcurrentUpdateError", "", LOCKED_STDERR, "UpdateConflict"),
        (
            "CommandError",
            "",
            "[409] Conflict: Another update is currently in progress.",
            "UpdateConflict",
        ),
        ("CommandError", "", "error: invalid access token", "InvalidAccessToken"),
        (
            "CommandError",
            "",
            "error: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions",
            "InvalidAccessToken",
        ),
        (
            "CommandError",
            "",
            "error: constructing secrets manager: passphrase must be set with "
            "PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE",
            "InvalidSpec",
        ),
        ("CompilationError", "error: x", "", "ProgramError"),
        ("CommandError", "error: creating resource: quota exceeded", "", "ProgramError"),
    ],
)
def test_classification(kind: str, stdout: str, stderr: str, reason: str) -> None:
    failure = classify_pulumi_error(kind, stdout, stderr)
    assert failure.reason == reason
    assert failure.reason in RESULT_REASONS


def test_conflict_message_says_how_to_release_the_lock() -> None:
    failure = classify_pulumi_error("ConcurrentUpdateError", "", LOCKED_STDERR)
    assert "pulumi cancel" in failure.message
    assert LOCKED_STDERR in failure.message


def test_stderr_is_quoted_when_there_are_no_diagnostics() -> None:
    assert pulumi_error_message("Updating (dev):\n", "error: update failed") == (
        "error: update failed"
    )


def test_output_tail_is_quoted_when_nothing_else_is_there() -> None:
    stdout = "\n".join(f"line {i}" for i in range(100))
    message = pulumi_error_message(stdout, "")
    assert message.endswith("line 99") and "line 79" not in message


def test_warnings_are_not_quoted_as_errors() -> None:
    stdout = (
        "Diagnostics:\n  pulumi:pulumi:Stack (p-dev):\n    warning: something odd\n"
        "    more about the warning\n    error: real problem\n\nResources:\n"
    )
    assert pulumi_error_message(stdout, "") == "pulumi:pulumi:Stack (p-dev): error: real problem"


def test_bound_message_keeps_both_ends_within_the_limit() -> None:
    text = "START " + "x" * 10_000 + " END"
    bounded = bound_message(text)
    assert len(bounded) <= MAX_MESSAGE_CHARS
    assert bounded.startswith("START") and bounded.endswith("END")
    assert "characters omitted" in bounded
    assert bound_message("short") == "short"


def test_a_long_message_is_left_whole_for_the_runner_to_scrub_before_cutting() -> None:
    secret = "a-secret-value-near-the-cut"
    redactor = Redactor([secret])
    head = (MAX_MESSAGE_CHARS - 64) // 4  # about where bound_message cuts the start
    for position in range(head - len(secret) - 40, head + 40, 7):
        error = "e" * position + secret + "f" * 20_000
        failure = classify_pulumi_error(
            "CommandError", f"Diagnostics:\n  s:\n    error: {error}\n", ""
        )
        assert secret in failure.message
        message = bound_message(redactor.scrub(failure.message)).replace("[secret]", "\0")
        pieces = {secret[i : i + 6] for i in range(len(secret) - 5)}
        assert not any(piece in message for piece in pieces), position
