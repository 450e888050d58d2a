"""Pulumi itself and the test programs, no pkobatch code (``test_pulumi_*``,
``test_the_*_test_program_*``): the built Pulumi CLI and the PyPI `pulumi` package run the test
programs offline with a file:// backend through the Automation API: up, preview, refresh
(drift), destroy. And pkobatch's runner workspace sets secret config without a command line
showing it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.sentinels import ArgumentWatch, plant
from pulumi import automation as auto

from pkobatch.runner.cancel import Budget, Cancellation
from pkobatch.runner.pulumi_cli import RunnerWorkspace
from pkobatch.runner.pulumi_start import PulumiStart
from pkobatch.runner.stack_config import ConfigItem, plan_config


def test_pulumi_runs_the_files_test_program_up_preview_refresh_destroy(
    automation_stack: Callable[..., auto.Stack], pulumi_env: Any
) -> None:
    stack = automation_stack(secret_config={"token": "sentinel-7f3a"})
    files = pulumi_env.files_dir

    up = stack.up()

    assert up.summary.result == "succeeded"
    assert up.summary.resource_changes == {"create": 3}
    assert sorted(p.name for p in files.iterdir()) == ["file-0.txt", "file-1.txt"]
    assert (files / "file-0.txt").read_text() == "hello 0"
    assert up.outputs["paths"].value == [str(files / "file-0.txt"), str(files / "file-1.txt")]
    assert up.outputs["token"].secret is True
    assert up.outputs["token"].value == "sentinel-7f3a"
    assert up.outputs["directory"].secret is False
    # The secret is encrypted with the passphrase in the file:// backend's state.
    backend = Path(pulumi_env.backend_url.removeprefix("file://"))
    state_files = [p for p in backend.rglob("*.json") if "stacks" in p.parts]
    assert state_files
    assert not [p for p in backend.rglob("*") if p.is_file() and b"sentinel-7f3a" in p.read_bytes()]

    preview = stack.preview()
    assert preview.change_summary == {auto.OpType.SAME: 3}

    (files / "file-0.txt").write_text("changed behind Pulumi's back")
    refresh = stack.refresh()
    assert refresh.summary.result == "succeeded"
    assert refresh.summary.resource_changes.get("update") == 1

    preview = stack.preview()
    assert preview.change_summary.get(auto.OpType.UPDATE) == 1
    stack.up()
    assert (files / "file-0.txt").read_text() == "hello 0"

    destroy = stack.destroy()
    assert destroy.summary.result == "succeeded"
    assert destroy.summary.resource_changes == {"delete": 3}
    assert list(files.iterdir()) == []


def test_pulumi_refresh_of_the_files_test_program_sees_a_deleted_file(
    automation_stack: Callable[..., auto.Stack], pulumi_env: Any
) -> None:
    stack = automation_stack(config={"files": "1"})
    stack.up()
    (pulumi_env.files_dir / "file-0.txt").unlink()

    refresh = stack.refresh()

    assert refresh.summary.resource_changes.get("delete") == 1
    assert stack.up().summary.resource_changes == {"create": 1, "same": 1}
    assert (pulumi_env.files_dir / "file-0.txt").read_text() == "hello 0"


def test_the_many_outputs_test_program_exports_its_outputs_through_pulumi(
    automation_stack: Callable[..., auto.Stack],
) -> None:
    stack = automation_stack("many-outputs", config={"outputCount": "250"})

    up = stack.up()

    assert len([k for k in up.outputs if k.startswith("out")]) == 250
    assert up.outputs["out249"].value == "value 249"


def test_the_syntax_error_test_program_fails_in_pulumi(
    automation_stack: Callable[..., auto.Stack],
) -> None:
    stack = automation_stack("syntax-error")

    with pytest.raises(auto.errors.CommandError) as raised:
        stack.up()

    assert "SyntaxError" in str(raised.value)


def test_the_runner_sets_secret_config_without_putting_it_on_a_command_line(
    pulumi_env: Any, program_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in pulumi_env.env.items():
        monkeypatch.setenv(name, value)
    secret = plant("config-secret")
    command = PulumiStart(pulumi_env.env).command(Cancellation(Budget.for_grace(30)))
    workspace = RunnerWorkspace(
        work_dir=str(program_dir("files")),
        pulumi_home=str(pulumi_env.home),
        env_vars=pulumi_env.env,
        pulumi_command=command,
    )
    stack = auto.Stack.create("dev", workspace)
    items = {
        "token": ConfigItem(f"{secret}\n", secret=True),  # a trailing newline is kept
        "other": ConfigItem(secret[::-1], secret=True),
        "content": ConfigItem("plain", secret=False),
        "shape": ConfigItem({"a": [1, 2]}, secret=False),
    }

    # What the runner does (runner/execute.py).
    with ArgumentWatch(lambda: {secret: "config-secret"}, interval=0.02) as watch:
        workspace.set_planned_config(stack.name, plan_config(items))

    assert watch.leaks == []
    config = {
        key.removeprefix("pkobatch-test-files:"): (value.value, value.secret)
        for key, value in stack.get_all_config().items()
    }
    assert config["token"] == (f"{secret}\n", True)
    assert config["other"] == (secret[::-1], True)
    assert config["content"] == ("plain", False)
    assert json.loads(config["shape"][0]) == {"a": [1, 2]}
    stack_file = Path(workspace.work_dir) / "Pulumi.dev.yaml"
    assert secret not in stack_file.read_text()


def test_the_runner_sets_string_config_without_json(
    pulumi_env: Any, program_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in pulumi_env.env.items():
        monkeypatch.setenv(name, value)
    command = PulumiStart(pulumi_env.env).command(Cancellation(Budget.for_grace(30)))
    workspace = RunnerWorkspace(
        work_dir=str(program_dir("files")),
        pulumi_home=str(pulumi_env.home),
        env_vars=pulumi_env.env,
        pulumi_command=command,
    )
    stack = auto.Stack.create("dev", workspace)
    items = {
        "region": ConfigItem("eu-west-1", secret=False),
        "a.b[0]": ConfigItem("x=y with spaces", secret=False),
    }
    plan = plan_config(items)
    assert plan.set_all and all("--json" not in arguments for arguments in plan.set_all)

    workspace.set_planned_config(stack.name, plan)

    config = {
        key.removeprefix("pkobatch-test-files:"): (value.value, value.secret)
        for key, value in stack.get_all_config().items()
    }
    # Keys are taken as written (no --path), as with --json.
    assert config["region"] == ("eu-west-1", False)
    assert config["a.b[0]"] == ("x=y with spaces", False)
