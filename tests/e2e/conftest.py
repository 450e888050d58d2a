"""Fixtures for end-to-end tests with the real Pulumi CLI.

``automation_stack(program="files", config=None, secret_config=None, stack="dev")`` ->
``pulumi.automation.Stack``: a fresh copy of the test program run by the Automation API with
the offline environment of ``pulumi_env`` (set on this process too, so the Automation API
finds the built CLI on PATH). The program's ``__main__.py`` runs as an inline program, as
the runner does: no ``pulumi-language-python`` host is needed. ``config`` values are plain,
``secret_config`` values are secret; ``directory`` defaults to ``pulumi_env.files_dir``.

The real controller (tests/helpers/controller_harness.py):

``controller_rbac`` (session): the controller's and runner's RBAC from deploy/kustomize/base.
``controller`` -> ``ControllerProcess`` running for the test's namespace under its own
ServiceAccount (the runner role bound in the namespace); stopped after the test.
``secrets`` -> the Secrets ``stack_spec`` names, as created: ``git`` (``username``,
``password``: the git server's) and ``pulumi`` (``passphrase``, and ``token``: a sentinel).
``cli(*args)`` -> click ``Result``: a ``pkobatch`` user command against the test's cluster and
namespace (``--timeout 5m``).
"""

from __future__ import annotations

import runpy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers.controller_harness import (
    ControllerProcess,
    bind_runner,
    create_secret,
    install_controller_rbac,
)
from helpers.sentinels import plant
from pulumi import automation as auto

from pkobatch.cli.reference import user_group
from pkobatch.kube.client import Kube

JSON = dict[str, Any]


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


@pytest.fixture(scope="session")
def controller_rbac(cluster: Any) -> None:
    install_controller_rbac(cluster.kube)


@pytest.fixture
def controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None, pulumi_bin: Path
) -> Iterator[ControllerProcess]:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, tmp_path / "controller")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def secrets(kube: Kube, namespace: str, git_server: Any, pulumi_env: Any) -> JSON:
    """The Secrets the Stacks name: git credentials and the Pulumi passphrase."""
    values = {
        "git": {"username": git_server.username, "password": git_server.password},
        "pulumi": {"passphrase": pulumi_env.passphrase, "token": plant("pulumi-token")},
    }
    for name, data in values.items():
        create_secret(kube, namespace, name, data)
    return values


@pytest.fixture
def cli(cluster: Any, namespace: str) -> Callable[..., Result]:
    def run(*args: str) -> Result:
        return CliRunner().invoke(
            user_group(),
            [*args, "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "--timeout", "5m"],
        )

    return run
