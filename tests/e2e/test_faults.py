"""Faults on the real control plane, with the controller under its own RBAC (issue 11).

Each test injects one fault into real runs — the controller SIGKILLed, the kube-apiserver
restarted, the runner SIGKILLed, the result ConfigMap deleted before the controller folds
it, 300 Stacks at once — and then asserts the one end state every fault must reach: every
Stack ends Ready, or with a failed ``lastUpdate`` whose message names the cause; none stays
Reconciling (``controller_harness.settled``). Waits are generous; nothing is timed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    last_update,
    ready,
    settled,
    stack_jobs,
    stack_spec,
    wait_events,
    wait_stack,
)

from pkobatch.api.constants import STACK_LABEL
from pkobatch.dev.node_agent import POD_MARKER_VARIABLE
from pkobatch.dev.processes import marked, wait_until
from pkobatch.kube.client import CONFIGMAPS, CORE_EVENTS, JOBS, PODS, STACKS, Kube

# Longer than any wait below, so a wait's own error (which Stacks, in which state) is reported.
pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
STUB_RUN = Path(__file__).resolve().parents[2] / "bench" / "fanout.py"
SETTLE_TIMEOUT = 900.0


def wait_settled(
    kube: Kube, namespace: str, names: list[str], timeout: float = SETTLE_TIMEOUT
) -> dict[str, JSON]:
    """Every named Stack, once all are ``settled``; the error lists those that are not."""
    found: dict[str, JSON] = {}

    def check() -> bool:
        stacks, _ = kube.list_objects(STACKS, namespace)
        found.clear()
        found.update({s["metadata"]["name"]: s for s in stacks})
        return all(name in found and settled(found[name]) for name in names)

    try:
        wait_until(check, timeout=timeout, interval=2.0, what=f"{len(names)} Stacks to settle")
    except TimeoutError as exc:
        waiting = [n for n in names if n not in found or not settled(found[n])]
        sample = {n: (found.get(n) or {}).get("status") for n in waiting[:3]}
        raise AssertionError(f"{exc}; not settled: {waiting[:20]}; e.g. {sample}") from exc
    return {name: found[name] for name in names}


def running(stack: JSON) -> bool:
    return bool(((stack.get("status") or {}).get("currentUpdate") or {}).get("name"))


def files_spec(repo: Any, pulumi_env: Any, name: str, **config: str) -> JSON:
    """Stack ``name`` of the test program: its own Pulumi stack and directory."""
    spec = stack_spec(repo, pulumi_env, stack=name)
    spec["config"] = {"directory": str(pulumi_env.files_dir / name), **config}
    return spec


def test_controller_sigkill_mid_run_adopts_the_run_and_catches_up(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(
        kube, namespace, "running", files_spec(repo, pulumi_env, "running", sleepSeconds="15")
    )
    wait_stack(kube, namespace, "running", running)
    adopted = stack_jobs(kube, namespace, "running")
    assert len(adopted) == 1

    controller.kill()
    # While no controller runs: the run goes on, and a new Stack arrives.
    apply_stack(kube, namespace, "arrived", files_spec(repo, pulumi_env, "arrived"))
    controller.start()

    stacks = wait_settled(kube, namespace, ["running", "arrived"])
    assert all(ready(s) for s in stacks.values()), {n: last_update(s) for n, s in stacks.items()}
    jobs = stack_jobs(kube, namespace, "running")
    assert [j["metadata"]["uid"] for j in jobs] == [adopted[0]["metadata"]["uid"]]
    assert last_update(stacks["running"])["name"] == adopted[0]["metadata"]["name"]
    assert len(stack_jobs(kube, namespace, "arrived")) == 1
    assert stacks["running"]["status"]["outputs"]["token"] == "[secret]"


def test_kube_apiserver_restart_mid_run_loses_nothing(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", files_spec(repo, pulumi_env, "app", sleepSeconds="20"))
    wait_stack(kube, namespace, "app", running)

    # A crash, not a shutdown: every watch and connection breaks at once; 10 s of outage.
    cluster.control_plane.restart_component("kube-apiserver", kill=True, down_seconds=10)
    # The controller's watches must have come back: a Stack created now runs too.
    apply_stack(kube, namespace, "after", files_spec(repo, pulumi_env, "after"))

    stacks = wait_settled(kube, namespace, ["app", "after"])
    assert ready(stacks["after"]), last_update(stacks["after"])
    # The run may have lost its result to the outage; then the retry makes the Stack Ready.
    assert ready(stacks["app"]), last_update(stacks["app"])
    assert stacks["app"]["status"]["outputs"]["token"] == "[secret]"


def test_result_configmap_deleted_before_folding_is_a_failed_run_then_a_retry(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", files_spec(repo, pulumi_env, "app", sleepSeconds="10"))
    stack = wait_stack(kube, namespace, "app", running)
    first = stack["status"]["currentUpdate"]["name"]
    # No controller: the result cannot be folded before it is deleted.
    controller.kill()
    wait_until(
        lambda: kube.get_or_none(CONFIGMAPS, first, namespace) is not None,
        timeout=300,
        what=f"the result ConfigMap of {first}",
    )
    kube.delete(CONFIGMAPS, first, namespace)
    controller.start()

    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == first)
    assert last_update(stack)["state"] == "failed"
    # The run's pod vouched for a result that is gone: reported, and the run counts as failed.
    assert "deleted before the controller folded it" in last_update(stack)["message"]
    wait_events(kube, namespace, lambda e: e["reason"] == "ResultDeleted" and first in e["note"])
    stack = wait_settled(kube, namespace, ["app"])["app"]
    assert ready(stack), last_update(stack)
    assert last_update(stack)["name"] != first
    assert len(stack_jobs(kube, namespace, "app")) == 2


def pulumi_locks(pulumi_env: Any) -> list[Path]:
    locks = Path(pulumi_env.backend_url.removeprefix("file://")) / ".pulumi" / "locks"
    return [path for path in locks.rglob("*.json") if path.is_file()]


def test_runner_sigkill_mid_update_ends_ready_after_the_retry_clears_its_lock(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(
        kube, namespace, "app", files_spec(repo, pulumi_env, "app", files="1", sleepSeconds="60")
    )
    stack = wait_stack(kube, namespace, "app", running)
    first = stack["status"]["currentUpdate"]["name"]
    pods: list[JSON] = []

    def creating() -> bool:
        pods[:] = kube.list_objects(PODS, namespace, label_selector=f"job-name={first}")[0]
        if not pods:
            return False
        log = cluster.log_dir / namespace / f"{pods[0]['metadata']['name']}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return "creating" in text and "file-0" in text

    # The update is creating its sleeping resource: it holds the stack's lock.
    wait_until(creating, timeout=300, what="the update to create its resource")
    assert pulumi_locks(pulumi_env)
    pid = cluster.agent.process_id(namespace, pods[0]["metadata"]["name"])
    assert pid is not None
    # As the OOM killer or a node crash does: the whole container, no grace.
    os.killpg(pid, signal.SIGKILL)

    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == first)
    assert last_update(stack)["state"] == "failed"
    assert f"run {first} failed without a result" in last_update(stack)["message"]
    stack = wait_settled(kube, namespace, ["app"])["app"]
    # Nothing of the killed container outlives it, not even its Pulumi provider, which had
    # left the container's process tree (setsid) and was reparented to init with its reaper.
    assert marked(POD_MARKER_VARIABLE, pods[0]["metadata"]["uid"]) == []
    # The killed update left its lock; the retry removes it (its Job is finished) and runs.
    assert ready(stack), last_update(stack)
    assert pulumi_locks(pulumi_env) == []
    wait_until(
        lambda: any(
            e["reason"] == "StaleLockRemoved" and first in e["message"]
            for e in kube.list_objects(CORE_EVENTS, namespace)[0]
        ),
        timeout=60,
        what="the StaleLockRemoved Event",
    )


def test_300_stacks_at_once_all_ready_without_retries(
    cluster: Any,
    kube: Kube,
    namespace: str,
    controller_rbac: None,
    git_repo: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """The run is the benchmark's stand-in program (bench/fanout.py write-result): it writes a
    valid result and exits, so the whole controller path runs — Job, pod through the Job
    controller and the node agent (at most 8 at once), result, fold, status — at the cost of
    a short Python process per Stack instead of a Pulumi update."""
    count = 300
    repo = git_repo()  # one repository and branch for all: one ls-remote per poll
    bind_runner(kube, namespace)
    controller = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={
            "PKOBATCH_JOB__COMMAND": f"{sys.executable},{STUB_RUN},write-result",
            "PKOBATCH_MAX_ACTIVE_JOBS": str(count),
        },
    )
    controller.start()
    try:
        names = [f"s{index:03d}" for index in range(count)]
        for name in names:
            apply_stack(
                kube,
                namespace,
                name,
                {"stack": name, "projectRepo": repo.file_url, "branch": "main"},
            )
        stacks = wait_settled(kube, namespace, names, timeout=1500)
    finally:
        controller.stop()
    not_ready = {n: last_update(s) for n, s in stacks.items() if not ready(s)}
    assert not_ready == {}
    assert {last_update(s)["failures"] for s in stacks.values()} == {0}
    assert {last_update(s)["lastSuccessfulCommit"] for s in stacks.values()} == {repo.commit}
    jobs, _ = kube.list_objects(JOBS, namespace)
    per_stack = Counter(job["metadata"]["labels"][STACK_LABEL] for job in jobs)
    assert per_stack == Counter(names)
