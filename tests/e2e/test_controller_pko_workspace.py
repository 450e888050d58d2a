"""PKO's workspace behaviours end to end (issue 27): real control plane, the controller under
its own RBAC, the real runner and Pulumi CLI.

- PKO's dynamic environment (PKO #937): an init container of
  ``spec.workspaceTemplate.spec.podTemplate``, as in PKO's own test manifest, appends
  ``PULUMI_CONFIG_PASSPHRASE=...`` to ``$PULUMI_ENV`` on the ``share`` volume; the run uses
  that passphrase, which appears nowhere (a sentinel);
- the CLI version check, with a real old Pulumi CLI (``scripts/tools.sh pulumi_old``,
  v3.197.0 as in PKO's test, before ``config set-all --json``) first on the run's PATH: the
  node agent gives pods of ``cluster.pulumi_old_image`` that PATH, and a controller whose
  runner image is that image runs them there (the runner itself, not an injected bundle:
  only the CLI matters here). Structured config stalls the Stack as ``PulumiVersionTooLow``
  after exactly one run, with PKO's minimum v3.202.0 in the message; string config reaches
  Ready, deployed by the old CLI;
- a CLI between that minimum and today's (``scripts/tools.sh pulumi_mid``, v3.203.0, the first
  the module proxy serves with ``--json``), first on the PATH of ``cluster.pulumi_mid_image``
  pods: string config reaches Ready, deployed by that CLI, and so does structured config.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    create_secret,
    last_update,
    pulumi_env_writer,
    ready,
    stack_jobs,
    stack_spec,
    wait_stack,
    wait_version_too_low,
)
from helpers.sentinels import plant

from pkobatch.api.constants import RUN_CONTAINER_NAME
from pkobatch.dev.tools import versions
from pkobatch.kube.client import Kube


def _export_with(pulumi_env: Any, passphrase: str) -> subprocess.CompletedProcess[str]:
    """``pulumi stack export --show-secrets`` of the test program's stack: it decrypts the
    state's secrets, so it succeeds only with the passphrase the stack was created with."""
    env = {**os.environ, **pulumi_env.env, "PULUMI_CONFIG_PASSPHRASE": passphrase}
    return subprocess.run(
        [
            "pulumi",
            "stack",
            "export",
            "--show-secrets",
            "--stack",
            "organization/pkobatch-test-files/dev",
        ],
        env=env,
        cwd=pulumi_env.home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_init_container_writing_pulumi_env_gives_the_run_its_passphrase(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
) -> None:
    passphrase = plant("dynamic-env-passphrase")
    create_secret(kube, namespace, "vault", {"passphrase": passphrase})
    spec = stack_spec(git_repo(), pulumi_env)
    del spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]  # only the dynamic environment has it
    spec["workspaceTemplate"] = {
        "spec": {
            "podTemplate": {"spec": {"initContainers": [pulumi_env_writer("busybox", "vault")]}}
        }
    }
    apply_stack(kube, namespace, "dynamic-env", spec)

    stack = wait_stack(kube, namespace, "dynamic-env", ready, timeout=600)

    assert last_update(stack)["state"] == "succeeded"
    [job] = stack_jobs(kube, namespace, "dynamic-env")
    pod = job["spec"]["template"]["spec"]
    assert {"name": "share", "emptyDir": {}} in pod["volumes"]
    exported = _export_with(pulumi_env, passphrase)
    assert exported.returncode == 0, exported.stderr[-2000:]
    wrong = _export_with(pulumi_env, pulumi_env.passphrase)
    assert wrong.returncode != 0
    assert "passphrase" in wrong.stderr.lower()


def _runner_image_controller(
    cluster: Any, namespace: str, directory: Path, image: str
) -> Iterator[ControllerProcess]:
    """The controller with ``image`` as its runner image."""
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, directory, env={"PKOBATCH_JOB__IMAGE": image})
    process.start()
    yield process
    process.stop()


@pytest.fixture
def old_cli_controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None, pulumi_old_bin: Path
) -> Iterator[ControllerProcess]:
    yield from _runner_image_controller(
        cluster, namespace, tmp_path / "controller", cluster.pulumi_old_image
    )


@pytest.fixture
def mid_cli_controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None, pulumi_mid_bin: Path
) -> Iterator[ControllerProcess]:
    yield from _runner_image_controller(
        cluster, namespace, tmp_path / "controller", cluster.pulumi_mid_image
    )


def _deployed_by(pulumi_env: Any) -> str:
    """The CLI version in the test program's stack state (its deployment manifest)."""
    exported = _export_with(pulumi_env, pulumi_env.passphrase)
    assert exported.returncode == 0, exported.stderr[-2000:]
    version: str = json.loads(exported.stdout)["deployment"]["manifest"]["version"]
    return version


def _first_on_path(cluster: Any, namespace: str) -> list[str]:
    """The first PATH entry of each run container the node agent started in ``namespace``."""
    launches = cluster.agent.launches(namespace)
    return [
        launch.path.split(os.pathsep)[0]
        for launch in launches
        if launch.container == RUN_CONTAINER_NAME
    ]


def test_an_old_cli_stalls_structured_config_after_one_run_and_runs_string_config(
    cluster: Any,
    kube: Kube,
    namespace: str,
    old_cli_controller: ControllerProcess,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    pulumi_old_bin: Path,
) -> None:
    old_image = {"spec": {"image": cluster.pulumi_old_image}}
    strings = stack_spec(git_repo(), pulumi_env, workspaceTemplate=old_image)
    apply_stack(kube, namespace, "strings", strings)
    structured = stack_spec(git_repo(), pulumi_env, workspaceTemplate=old_image)
    structured["config"]["files"] = 1  # an integer: structured config
    apply_stack(kube, namespace, "structured", structured)

    old = versions()["PULUMI_OLD_VERSION"]
    wait_version_too_low(kube, namespace, "structured", old)
    stack = wait_stack(kube, namespace, "strings", ready, timeout=600)
    assert last_update(stack)["state"] == "succeeded"
    assert _deployed_by(pulumi_env) == f"v{old}"
    # What the node agent started: every run with the old CLI first on PATH.
    assert _first_on_path(cluster, namespace) == [str(pulumi_old_bin)] * 2
    old_cli_controller.caught_up()
    assert len(stack_jobs(kube, namespace, "structured")) == 1


def test_a_cli_between_json_config_and_todays_runs_string_then_structured_config(
    cluster: Any,
    kube: Kube,
    namespace: str,
    mid_cli_controller: ControllerProcess,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    pulumi_mid_bin: Path,
) -> None:
    mid = f"v{versions()['PULUMI_MID_VERSION']}"
    spec = stack_spec(
        git_repo(), pulumi_env, workspaceTemplate={"spec": {"image": cluster.pulumi_mid_image}}
    )
    apply_stack(kube, namespace, "app", spec)

    stack = wait_stack(kube, namespace, "app", ready, timeout=600)
    assert last_update(stack)["state"] == "succeeded"
    assert _deployed_by(pulumi_env) == mid

    # The same CLI is new enough for structured config: no PulumiVersionTooLow.
    spec["config"]["files"] = 1
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", ready, timeout=600)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["generation"] == 2
    assert condition(stack, "Stalled") == {}
    assert _deployed_by(pulumi_env) == mid
    assert _first_on_path(cluster, namespace) == [str(pulumi_mid_bin)] * 2
