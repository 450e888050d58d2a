"""The runner's commands: `pkobatch job run` input checking, the result as the terminal
shows it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from pkobatch.api.run import RunResult, StackRef
from pkobatch.cli.local_run import render_result, run_command
from pkobatch.runner.command import job_group
from pkobatch.runner.job_run import summary_line


def result(**fields: object) -> RunResult:
    base: dict[str, object] = {
        "operation": "up",
        "state": "failed",
        "reason": "ProgramError",
        "stack": StackRef(name="web", namespace="prod"),
        "job_name": "web-up-1",
    }
    return RunResult.model_validate({**base, **fields})


def test_an_unreadable_snapshot_is_a_usage_error() -> None:
    outcome = CliRunner().invoke(job_group, ["run", "--snapshot", '{"operation": "up"}'])
    assert outcome.exit_code == 2
    assert "not a valid RunSnapshot" in outcome.output


def test_run_reports_missing_values_as_a_usage_error(tmp_path: Path) -> None:
    manifest = tmp_path / "stack.yaml"
    manifest.write_text(
        "kind: Stack\nmetadata: {name: s}\nspec:\n  stack: dev\n  secretsRef:\n"
        "    k: {type: Secret, secret: {name: app, key: k}}\n"
    )
    outcome = CliRunner().invoke(run_command, ["-f", str(manifest)])
    assert outcome.exit_code == 2
    assert "--secret app/k=" in outcome.output


def test_secret_outputs_show_as_secret_not_as_markup() -> None:
    console = Console(record=True, width=120)
    render_result(
        result(
            state="succeeded",
            reason="Succeeded",
            outputs={"token": "[secret]", "n": {"a": [1]}},
            changes={"same": 3},
            message="[bold]not markup[/bold]",
        ),
        console,
    )
    text = console.export_text()
    assert "[secret]" in text
    assert '{"a": [1]}' in text
    assert "[bold]not markup[/bold]" in text
    assert "same 3" in text


def test_summary_line() -> None:
    line = summary_line(result(changes={"create": 2}, message="first\nsecond"))
    assert line == "result: failed (ProgramError); changes: create=2; first"
    assert summary_line(result(drifted_resources=0, reason="Succeeded", state="succeeded")) == (
        "result: succeeded (Succeeded); drifted: 0"
    )
