"""PulumiStart: `pulumi version` begins when a run starts and is checked when the run needs
the CLI, as the Automation API's own PulumiCommand checks it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pulumi.automation.errors import InvalidVersionError

from pkobatch.runner.cancel import Budget, Cancellation
from pkobatch.runner.failures import RunFailure, pulumi_command_failure, stopping_at
from pkobatch.runner.pulumi_start import PULUMI_CLI, PulumiStart


def cli_env(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose only `pulumi` is ``script``."""
    directory = tmp_path / "bin"
    directory.mkdir()
    cli = directory / PULUMI_CLI
    cli.write_text(f"#!/bin/sh\n{script}\n")
    cli.chmod(0o755)
    return {"PATH": f"{directory}{os.pathsep}/usr/bin:/bin"}


def cancellation() -> Cancellation:
    return Cancellation(Budget.for_grace(30))


def test_the_version_runs_from_the_start_and_the_command_carries_it(tmp_path: Path) -> None:
    started = tmp_path / "started"
    # Written aside and renamed, so the test never reads the file half-written.
    env = cli_env(
        tmp_path, f'echo "$1" > {started}.tmp && mv {started}.tmp {started}\necho v3.259.0'
    )
    pulumi = PulumiStart(env)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.read_text().strip() == "version"  # before anything asked for it
        command = pulumi.command(cancellation())
    finally:
        pulumi.close()
    assert str(command.version) == "3.259.0"
    assert command.command == PULUMI_CLI


def test_a_missing_cli_fails_the_run_saying_what_the_image_lacks(tmp_path: Path) -> None:
    pulumi = PulumiStart({"PATH": str(tmp_path)})
    with pytest.raises(RunFailure) as raised:
        pulumi.command(cancellation())
    pulumi.close()
    assert raised.value.reason == "JobFailed"
    assert "pulumi CLI is not on PATH" in raised.value.message


def test_a_failing_version_command_fails_the_run_with_its_output(tmp_path: Path) -> None:
    pulumi = PulumiStart(cli_env(tmp_path, "echo 'cannot read PULUMI_HOME' >&2; exit 4"))
    with pytest.raises(RunFailure) as raised:
        pulumi.command(cancellation())
    pulumi.close()
    assert raised.value.reason == "JobFailed"
    assert "exit status 4" in raised.value.message
    assert "cannot read PULUMI_HOME" in raised.value.message


def test_a_cli_older_than_the_sdk_supports_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK", raising=False)
    pulumi = PulumiStart(cli_env(tmp_path, "echo v3.0.0"))
    with pytest.raises(InvalidVersionError):
        pulumi.command(cancellation())
    pulumi.close()


def test_a_run_that_never_needs_pulumi_waits_for_what_it_started(tmp_path: Path) -> None:
    finished = tmp_path / "finished"
    pulumi = PulumiStart(cli_env(tmp_path, f"sleep 0.2; touch {finished}; echo v3.259.0"))
    pulumi.close()
    assert finished.exists()


def test_an_automation_api_command_error_becomes_its_classified_failure() -> None:
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import create_command_error

    error = create_command_error(
        CommandResult(stdout="", stderr="error: no stack named 'dev' found", code=255)
    )
    failure = pulumi_command_failure(error)
    assert failure is not None
    assert failure.reason == "StackNotFound"
    assert "no stack named 'dev' found" in failure.message
    assert pulumi_command_failure(ValueError("a bug")) is None


def test_failures_inside_a_step_are_marked_as_stopped_there_and_other_errors_pass() -> None:
    from pulumi.automation._cmd import CommandResult
    from pulumi.automation.errors import create_command_error

    locked = create_command_error(
        CommandResult(
            stdout="",
            stderr="error: [409] Conflict: Another update is currently in progress.",
            code=255,
        )
    )
    with pytest.raises(RunFailure) as raised, stopping_at("stackInitialization"):
        raise locked
    assert (raised.value.reason, raised.value.step) == ("UpdateConflict", "stackInitialization")
    with pytest.raises(RunFailure) as raised, stopping_at("outputRetrieval"):
        raise RunFailure("SourceUnavailable", "refused", "gitAuthentication")
    # The innermost step is where it stopped.
    assert raised.value.step == "gitAuthentication"
    with pytest.raises(KeyError), stopping_at("outputRetrieval"):
        raise KeyError("a bug")


def test_job_run_loads_no_pulumi_sdk_before_the_run_needs_it() -> None:
    # What the overlap relies on: the command's modules, and telling an SDK error from a bug
    # before the SDK is there, leave the SDK unloaded.
    script = (
        "import sys\n"
        "import pkobatch.runner.command\n"
        "from pkobatch.runner.failures import pulumi_command_failure\n"
        "assert pulumi_command_failure(ValueError('early')) is None\n"
        "print(sorted(m for m in sys.modules if m == 'pulumi' or m.startswith('pulumi.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
