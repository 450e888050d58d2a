"""Fixtures for end-to-end tests with the real Pulumi CLI.

``automation_stack(program="files", config=None, secret_config=None, stack="dev")`` ->
``pulumi.automation.Stack``: a fresh copy of the test program run by the Automation API with
the offline environment of ``pulumi_env`` (set on this process too, so the Automation API
finds the built CLI on PATH). The program's ``__main__.py`` runs as an inline program, as
the runner does: no ``pulumi-language-python`` host is needed. ``config`` values are plain,
``secret_config`` values are secret; ``directory`` defaults to ``pulumi_env.files_dir``.
"""

from __future__ import annotations

import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto


@pytest.fixture
def automation_stack(
    pulumi_env: Any, program_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., auto.Stack]:
    for name, value in pulumi_env.env.items():
        monkeypatch.setenv(name, value)

    def make(
        program: str = "files",
        *,
        config: dict[str, str] | None = None,
        secret_config: dict[str, str] | None = None,
        stack: str = "dev",
    ) -> auto.Stack:
        work_dir = program_dir(program)
        main = work_dir / "__main__.py"

        def run_program() -> None:
            runpy.run_path(str(main), run_name="__main__")

        workspace = auto.LocalWorkspace(
            work_dir=str(work_dir),
            program=run_program,
            pulumi_home=str(pulumi_env.home),
            env_vars=pulumi_env.env,
        )
        created = auto.Stack.create(stack, workspace)
        values = {"directory": str(pulumi_env.files_dir), **(config or {})}
        created.set_all_config(
            {k: auto.ConfigValue(v) for k, v in values.items()}
            | {k: auto.ConfigValue(v, secret=True) for k, v in (secret_config or {}).items()}
        )
        return created

    return make
