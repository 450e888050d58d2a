"""`pkobatch up|preview|refresh|destroy|reconcile|cancel|unlock|resume`, following their runs,
through the real controller, real Jobs and the real Pulumi CLI (the node agent runs the run
pods on this host).

The controller runs as a subprocess (`python -m pkobatch.main controller`), watching only
the test's namespace; runs execute `python -m pkobatch.main job run` with this interpreter,
as in `pkobatch dev up`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result
from helpers.controller_harness import caught_up
from helpers.stale_lock import leave_stale_lock, lock_directory_files

from pkobatch.dev import processes
from pkobatch.dev.environment import LOCAL_JOB_COMMAND, controller_argv
from pkobatch.kube.client import CLUSTERROLES, JOBS, ROLEBINDINGS, SECRETS, STACKS, Kube
from pkobatch.runner.embedded import fallback_env_name

ROOT = Path(__file__).resolve().parents[2]
JSON = dict[str, Any]
PASSPHRASE_SECRET = "pulumi-passphrase"


@pytest.fixture
def runner_rbac(kube: Kube, namespace: str) -> None:
    """The runner ServiceAccount's rights in the test namespace, from deploy/kustomize."""
    role = yaml.safe_load((ROOT / "deploy/kustomize/base/runner-clusterrole.yaml").read_text())
    kube.apply(CLUSTERROLES, role, field_manager="pkobatch-tests")
    binding = yaml.safe_load((ROOT / "deploy/kustomize/runner/rolebinding.yaml").read_text())
    for subject in binding["subjects"]:
        subject["namespace"] = namespace
    kube.create(ROLEBINDINGS, binding, namespace)


@dataclass
class Controller:
    process: subprocess.Popen[bytes]
    metrics_port: int


@pytest.fixture
def controller(
    cluster: Any, namespace: str, runner_rbac: None, tmp_path: Path
) -> Iterator[Controller]:
    metrics_port = processes.free_port()
    env = cluster.env(
        PKOBATCH_KUBECONFIG=str(cluster.kubeconfig),
        PKOBATCH_NAMESPACES=namespace,
        PKOBATCH_JOB__COMMAND=LOCAL_JOB_COMMAND,
        PKOBATCH_JOB__SERVICE_ACCOUNT="pkobatch-runner",
        PKOBATCH_METRICS_ADDR=f"127.0.0.1:{metrics_port}",
        PKOBATCH_HEALTH_ADDR="0",
        PKOBATCH_LOG_FORMAT="text",
    )
    process = processes.spawn(
        controller_argv(),
        log=tmp_path / "controller.log",
        env=env,
    )
    try:
        yield Controller(process, metrics_port)
    finally:
        processes.stop(process, grace=10)


@pytest.fixture
def make_stack(
    kube: Kube, namespace: str, git_repo: Callable[..., Any], pulumi_env: Any
) -> Callable[..., JSON]:
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": PASSPHRASE_SECRET},
            "stringData": {"passphrase": pulumi_env.passphrase},
        },
        namespace,
    )

    def make(name: str, program: str = "files", **spec: Any) -> JSON:
        repo = git_repo(program)
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": name, "labels": {"suite": "cli"}},
            "spec": {
                "stack": name,
                "projectRepo": repo.file_url,
                "branch": "main",
                "backend": pulumi_env.backend_url,
                "envRefs": {
                    "PULUMI_CONFIG_PASSPHRASE": {
                        "type": "Secret",
                        "secret": {"name": PASSPHRASE_SECRET, "key": "passphrase"},
                    }
                },
                "config": {"directory": str(pulumi_env.files_dir / name)},
                **spec,
            },
        }
        return kube.create(STACKS, body, namespace)

    return make


def wait_for_first_run(kube: Kube, namespace: str, name: str) -> JSON:
    found: list[JSON] = []

    def done() -> bool:
        stack = kube.get(STACKS, name, namespace)
        found[:] = [stack]
        last = (stack.get("status") or {}).get("lastUpdate") or {}
        return last.get("state") in ("succeeded", "failed") and not (
            (stack.get("status") or {}).get("currentUpdate") or {}
        ).get("name")

    processes.wait_until(done, timeout=300, what=f"the first run of Stack {name}")
    return found[0]


def test_refresh_wait_succeeds_and_prints_the_result(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("web")
    assert (
        wait_for_first_run(kube, namespace, "web")["status"]["lastUpdate"]["state"] == "succeeded"
    )

    result = cli("refresh", "web", "--wait")

    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"refresh succeeded: {namespace}/web (run ")
    annotations = kube.get(STACKS, "web", namespace)["metadata"]["annotations"]
    assert annotations["pkobatch.io/operation-request"].startswith("refresh:")


def test_a_failing_program_exits_1_with_reason_and_message(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("broken", program="syntax-error")
    wait_for_first_run(kube, namespace, "broken")

    result = cli("preview", "broken", "--wait", "-o", "json")

    assert result.exit_code == 1, result.output
    outcome = json.loads(result.stdout)
    assert outcome["result"] == "failed"
    assert outcome["reason"] == "ProgramError"
    assert outcome["message"]


def test_destroy_holds_the_stack_until_up(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Controller,
    pulumi_env: Any,
) -> None:
    make_stack("web")
    wait_for_first_run(kube, namespace, "web")
    files = pulumi_env.files_dir / "web"
    assert any(files.iterdir())

    destroyed = cli("destroy", "web", "--yes", "--wait")

    assert destroyed.exit_code == 0, destroyed.output
    assert destroyed.stdout.startswith(f"destroy succeeded: {namespace}/web")
    assert not any(files.iterdir())
    jobs_after_destroy = len(kube.list_objects(JOBS, namespace)[0])
    reconciled = cli("describe", "web")
    assert "Held:" in reconciled.stdout
    processes.wait_until(
        lambda: "DestroyedOnRequest" in cli("get", "web").stdout, timeout=60, what="held"
    )
    # A reconcile of the held Stack (a label is a Stack event, not a request) starts no
    # update (checked through the Jobs).
    kube.merge_patch(STACKS, "web", {"metadata": {"labels": {"poke": "1"}}}, namespace)
    caught_up(kube, namespace, controller.metrics_port)
    assert len(kube.list_objects(JOBS, namespace)[0]) == jobs_after_destroy

    up = cli("up", "web", "--wait")

    assert up.exit_code == 0, up.output
    assert any(files.iterdir())


def test_reconcile_waits_for_ready(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("web")
    wait_for_first_run(kube, namespace, "web")

    result = cli("reconcile", "web")

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("up succeeded: ")


def test_resume_runs_the_stack_at_once_and_follows_the_run(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("web")
    first = wait_for_first_run(kube, namespace, "web")["status"]["lastUpdate"]["name"]
    suspended = cli("suspend", "web")
    assert suspended.exit_code == 0, suspended.output

    # Nothing changed since the first run: only the request makes the controller run it.
    result = cli("resume", "web")

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"up succeeded: {namespace}/web (run ")
    stack = kube.get(STACKS, "web", namespace)
    assert stack["spec"]["suspend"] is False
    assert stack["status"]["lastUpdate"]["name"] != first


def test_cancel_stops_a_running_run(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("slow", program="sleep")
    processes.wait_until(
        lambda: bool(
            (
                (kube.get(STACKS, "slow", namespace).get("status") or {}).get("currentUpdate") or {}
            ).get("name")
        ),
        timeout=120,
        what="the run to start",
    )

    result = cli("cancel", "slow", "--wait", "-o", "json")

    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert (outcome["operation"], outcome["result"]) == ("cancel", "succeeded")
    assert "was cancelled" in outcome["message"]
    last = kube.get(STACKS, "slow", namespace)["status"]["lastUpdate"]
    assert last["state"] == "failed"
    assert "was cancelled" in last["message"]


def test_many_stacks_with_a_summary(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
) -> None:
    make_stack("one")
    make_stack("two")
    wait_for_first_run(kube, namespace, "one")
    wait_for_first_run(kube, namespace, "two")

    result = cli("refresh", "-l", "suite=cli", "--wait", "--concurrency", "2")

    assert result.exit_code == 0, result.output
    rows = [line.split()[1:4] for line in result.stdout.splitlines()]
    assert rows == [
        ["NAME", "OPERATION", "RESULT"],
        ["one", "refresh", "succeeded"],
        ["two", "refresh", "succeeded"],
    ]


def test_unlock_releases_a_stale_lock_and_the_next_up_succeeds(
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    make_stack: Callable[..., JSON],
    controller: Any,
    pulumi_env: Any,
    tmp_path: Path,
) -> None:
    stack = make_stack("web")
    deployed = wait_for_first_run(kube, namespace, "web")["status"]["lastUpdate"]
    assert deployed["state"] == "succeeded"
    # A person's `pulumi up` of the same stack (here: `pkobatch run` of the same spec) is
    # killed mid-update: its lock names no run of this Stack, so no run removes it.
    release = tmp_path / "release-the-killed-up"
    laptop = tmp_path / "laptop.yaml"
    # New content: its update of each file waits for the release, holding the lock.
    config = {**stack["spec"]["config"], "content": "from a laptop", "holdUntil": str(release)}
    spec = {**stack["spec"], "config": config}
    metadata = {"name": "web", "namespace": namespace}
    laptop.write_text(
        json.dumps(
            {"apiVersion": stack["apiVersion"], "kind": "Stack", "metadata": metadata, "spec": spec}
        )
    )
    passphrase = fallback_env_name("PKOBATCH_SECRET", PASSPHRASE_SECRET, "passphrase")
    env = {
        **pulumi_env.env,
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
        passphrase: pulumi_env.passphrase,
    }
    try:
        lock = leave_stale_lock(laptop, env, pulumi_env.backend_url)

        unlocked = cli("unlock", "web", "--yes", "--wait", "-o", "json")
        after_unlock = lock_directory_files(pulumi_env.backend_url)
        status = kube.get(STACKS, "web", namespace)["status"]
        up = cli("up", "web", "--wait", "-o", "json")
    finally:
        release.touch()  # ends any process of the killed update that outlived it

    assert unlocked.exit_code == 0, unlocked.output
    outcome = json.loads(unlocked.stdout)
    assert (outcome["operation"], outcome["result"]) == ("unlock", "succeeded")
    assert outcome["run"].startswith("web-unlock-")
    assert not lock.exists() and after_unlock == []
    # The unlock answered its request; lastUpdate still tells the last update.
    assert status["operationRequest"]["state"] == "Succeeded"
    assert status["operationRequest"]["jobName"] == outcome["run"]
    assert status["operationRequest"]["message"].startswith("stack web unlocked")
    assert status["lastUpdate"] == deployed
    assert up.exit_code == 0, up.output
    done = json.loads(up.stdout)
    assert (done["operation"], done["result"]) == ("up", "succeeded")
    last = kube.get(STACKS, "web", namespace)["status"]["lastUpdate"]
    assert last["name"] == done["run"] and last["state"] == "succeeded"
