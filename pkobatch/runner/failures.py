"""Why a run failed: a reason from the closed set in ``ResultReason`` plus a short message.

Everything here is pure. The runner raises ``RunFailure`` where it knows the reason itself
(git, spec, dependencies) and turns a failed Pulumi command into one with
``classify_pulumi_error`` from the Automation API's error class name and the command's
output. The message is what users read in ``status.lastUpdate.message``: the error lines
Pulumi printed (its "Diagnostics" section and stderr), not its progress display. It is not
cut here: the runner scrubs secret values from it first and then bounds it
(``pkobatch.runner.execute``), since a secret cut in two would no longer be recognised.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Final

from pkobatch.api.constants import FailedStep, ResultReason


class RunFailure(Exception):
    """A run ended without success for a known reason; ``step`` when the step at which it
    stopped has a PKO Event reason of its own (the result's ``failedStep``)."""

    def __init__(self, reason: ResultReason, message: str, step: FailedStep | None = None) -> None:
        super().__init__(message)
        self.reason: ResultReason = reason
        self.message = message
        self.step: FailedStep | None = step

    def at_step(self, step: FailedStep) -> RunFailure:
        """This failure, stopped at ``step`` unless it already names where it stopped."""
        return RunFailure(self.reason, self.message, self.step or step)


_TOKEN_PATTERNS: Final = re.compile(
    r"invalid access token|PULUMI_ACCESS_TOKEN must be set|\[401\]|401 Unauthorized",
    re.IGNORECASE,
)
_CONFLICT_PATTERNS: Final = re.compile(
    r"\[409\] Conflict|Another update is currently in progress|the stack is currently locked by"
)
_SPEC_PATTERNS: Final = re.compile(
    r"passphrase must be set|incorrect passphrase|could not parse --json|invalid --json object key"
    r"|unsupported secrets provider|environments are not supported",
    re.IGNORECASE,
)
# Every error with which Pulumi's engine (pkg/resource/deploy of v3.259.0) refuses what the
# saved plan of `up --plan` does not allow: a resource's inputs, options or outputs
# ("resource <urn> violates plan: ...", "resource violates plan: ..."), an operation ("<op>
# is not allowed by the plan: ..."), a planned operation that never came, a resource the
# plan does not know.
_PLAN_PATTERNS: Final = re.compile(
    r"violates plan|is not allowed by the plan"
    r"|expected resource operations for \S+ but none were seen|no plan for resource"
)
_REPEATED: Final = "an unhandled error occurred: "
_PROGRAM_KINDS: Final = frozenset({"CompilationError", "RuntimeError", "InlineSourceRuntimeError"})
# A failed Pulumi command's (stdout, stderr), attached to its error (pkobatch.runner.pulumi_cli).
OUTPUT_ATTRIBUTE: Final = "pkobatch_output"
# Checked in sys.modules only: recognising the SDK's errors must not import the SDK.
_SDK_ERRORS_MODULE: Final = "pulumi.automation.errors"


def classify_pulumi_error(kind: str, stdout: str, stderr: str) -> RunFailure:
    """The failure for a Pulumi command that exited non-zero.

    ``kind`` is the Automation API's error class name (``StackNotFoundError``,
    ``ConcurrentUpdateError``, ``CompilationError``, ``RuntimeError``, ``CommandError``).
    """
    message = pulumi_error_message(stdout, stderr)
    text = f"{stderr}\n{stdout}"
    if kind == "StackNotFoundError":
        return RunFailure("StackNotFound", message)
    if kind == "ConcurrentUpdateError" or _CONFLICT_PATTERNS.search(text):
        return RunFailure(
            "UpdateConflict",
            "the stack is locked by another update; if none is running, release the lock "
            f"with `pkobatch unlock` (which runs `pulumi cancel`)\n{message}",
        )
    if _PLAN_PATTERNS.search(text):
        return RunFailure(
            "PlanMismatch",
            "the stack or the program no longer matches the approved plan; nothing the plan "
            f"did not allow was applied, and a new plan is made for review\n{message}",
        )
    if kind in _PROGRAM_KINDS:
        return RunFailure("ProgramError", message)
    if _TOKEN_PATTERNS.search(text):
        return RunFailure("InvalidAccessToken", message)
    if _SPEC_PATTERNS.search(text):
        return RunFailure("InvalidSpec", message)
    return RunFailure("ProgramError", message)


def _diagnostic_errors(stdout: str) -> list[str]:
    """The error entries of Pulumi's "Diagnostics:" section, dedented, without repeats."""
    lines = stdout.splitlines()
    try:
        start = lines.index("Diagnostics:") + 1
    except ValueError:
        return []
    entries: list[list[str]] = []
    current: list[str] | None = None  # None: inside a warning/info entry, or none yet
    resource = ""
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section ("Outputs:", "Resources:", ...)
        if line.startswith("  ") and not line.startswith("   ") and line.rstrip().endswith(":"):
            resource, current = line.strip(), None
            continue
        text = line[4:] if line.startswith("    ") else line.strip()
        if text.startswith("error:"):
            current = [f"{resource} {text}".strip()]
            entries.append(current)
        elif re.match(r"^(warning|info|debug):", text):
            current = None
        elif current is not None and text.strip():
            current.append(text)
    errors: list[str] = []
    seen: set[str] = set()
    for entry in entries:
        # The engine repeats a program's error as "an unhandled error occurred: <error>".
        key = "\n".join(entry).split("error: ", 1)[-1].removeprefix(_REPEATED)
        if key not in seen:
            seen.add(key)
            errors.append("\n".join(entry))
    return errors


def pulumi_error_message(stdout: str, stderr: str) -> str:
    """The part of a failed command's output that says what went wrong."""
    parts = _diagnostic_errors(stdout)
    err = "\n".join(line.strip() for line in stderr.splitlines() if line.strip())
    if err and err not in parts:
        parts.append(err)
    if not parts:
        tail = [line.strip() for line in stdout.splitlines() if line.strip()][-20:]
        parts = ["\n".join(tail)] if tail else ["the Pulumi command failed without output"]
    return "\n".join(parts)


def command_output(error: BaseException) -> tuple[str, str]:
    """(stdout, stderr) of the Pulumi command that raised ``error`` ("" when unknown)."""
    output = getattr(error, OUTPUT_ATTRIBUTE, None)
    if isinstance(output, tuple) and len(output) == 2:
        return str(output[0]), str(output[1])
    return "", str(error)


def pulumi_command_failure(error: BaseException) -> RunFailure | None:
    """The failure for a Pulumi command that exited non-zero (the Automation API's
    ``CommandError``); None for any other error. An error raised before the SDK was loaded
    cannot be one of its errors, so it is not loaded for this."""
    errors = sys.modules.get(_SDK_ERRORS_MODULE)
    if errors is None or not isinstance(error, errors.CommandError):
        return None
    return classify_pulumi_error(type(error).__name__, *command_output(error))


@contextlib.contextmanager
def stopping_at(step: FailedStep) -> Iterator[None]:
    """Failures inside (the runner's, or a Pulumi command's) are marked as stopped at
    ``step``; any other error goes on as it is."""
    try:
        yield
    except RunFailure as failure:
        raise failure.at_step(step) from None
    except Exception as error:
        command_failure = pulumi_command_failure(error)
        if command_failure is None:
            raise
        raise command_failure.at_step(step) from None
