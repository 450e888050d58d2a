"""`pkobatch dev up|status|down` as a user runs them: real processes, real ports."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import apply_stack, condition, wait_stack
from helpers.dev_env import alive, cmdline, environment_pids, leftovers, listening_ports, pkobatch

from pkobatch.dev.processes import wait_until
from pkobatch.dev.supervisor import read_status
from pkobatch.kube.client import CONFIGMAPS, JOBS, Kube


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "dev"
    yield state
    # Whatever a test left running.
    pkobatch("dev", "down", "--state-dir", str(state), check=False)


def start(state: Path) -> dict[str, Any]:
    pkobatch("dev", "up", "--state-dir", str(state))
    status = json.loads(pkobatch("dev", "status", "--state-dir", str(state), "-o", "json").stdout)
    assert status["state"] == "running"
    return status


def hello_job(name: str, greeting: str, *, sleep: float = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "unused",
                            "command": [
                                sys.executable,
                                "-c",
                                f"import time; time.sleep({sleep}); print({greeting!r})",
                            ],
                        }
                    ],
                }
            },
        },
    }


def test_dev_up_runs_jobs_and_down_leaves_nothing_behind(state: Path) -> None:
    status = start(state)
    pids = environment_pids(status)
    ports = listening_ports(pids)
    assert all(alive(pid) for pid in pids)
    assert int(status["server"].rsplit(":", 1)[1]) in ports
    assert len(ports) >= 4  # etcd client + peer, kube-apiserver, kube-controller-manager

    kube = Kube.connect(status["kubeconfig"])
    try:
        kube.create(JOBS, hello_job("hello", "dev says hi"), "default")
        wait_until(
            lambda: (kube.get(JOBS, "hello", "default").get("status") or {}).get("succeeded") == 1,
            timeout=120,
            what="the Job to succeed",
        )
    finally:
        kube.close()
    (log,) = (state / "logs" / "default").glob("hello-*.log")
    assert log.read_text() == "dev says hi\n"

    assert "stopped" in pkobatch("dev", "down", "--state-dir", str(state)).stdout

    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=60, what="processes to end")
    assert leftovers(state, ports) == []
    assert pkobatch("dev", "status", "--state-dir", str(state), check=False).returncode == 1
    assert "no dev environment" in pkobatch("dev", "down", "--state-dir", str(state)).stdout


def test_killing_the_supervisor_takes_everything_down(state: Path) -> None:
    status = start(state)
    pids = environment_pids(status)
    ports = listening_ports(pids)

    os.kill(status["supervisorPid"], signal.SIGKILL)

    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=60, what="processes to end")
    assert leftovers(state, ports) == []
    assert pkobatch("dev", "status", "--state-dir", str(state), check=False).returncode == 1


def test_up_twice_is_refused(state: Path) -> None:
    start(state)

    second = pkobatch("dev", "up", "--state-dir", str(state), check=False)

    assert second.returncode == 1
    assert "already running" in second.stderr


def status_of(state: Path) -> dict[str, Any]:
    result = pkobatch("dev", "status", "--state-dir", str(state), "-o", "json", check=False)
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


@pytest.mark.parametrize("component", ["etcd", "kube-apiserver"])
def test_a_crashed_component_is_restarted_by_the_supervisor(state: Path, component: str) -> None:
    status = start(state)
    crashed = status["components"][component]
    kube = Kube.connect(status["kubeconfig"])
    try:
        kube.create(
            CONFIGMAPS,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "before-crash"}},
            "default",
        )

        os.kill(crashed, signal.SIGKILL)

        def restarted() -> bool:
            current = status_of(state)
            return (current.get("restarts") or {}).get(component) == 1 and current[
                "state"
            ] == "running"

        wait_until(restarted, timeout=180, what=f"the supervisor to restart {component}")
        current = status_of(state)
        assert current["components"][component] != crashed
        assert alive(current["components"][component])
        table = pkobatch("dev", "status", "--state-dir", str(state)).stdout
        assert "restarted 1x" in table
        # Same data, same address: the old client still works and the cluster runs Jobs.
        wait_until(
            lambda: kube.get_or_none(CONFIGMAPS, "before-crash", "default") is not None,
            timeout=60,
            what="the API server to answer again",
        )
        kube.create(JOBS, hello_job("after-crash", "up again"), "default")
        wait_until(
            lambda: (
                (kube.get(JOBS, "after-crash", "default").get("status") or {}).get("succeeded") == 1
            ),
            timeout=120,
            what="a Job to succeed after the restart",
        )
    finally:
        kube.close()


def test_down_completes_while_the_api_server_does_not_answer(state: Path) -> None:
    status = start(state)
    pids = environment_pids(status)
    ports = listening_ports(pids)
    supervisor_pid = status["supervisorPid"]
    kube = Kube.connect(status["kubeconfig"])
    try:
        kube.create(JOBS, hello_job("long", "never printed", sleep=600), "default")
        wait_until(
            lambda: bool(json.loads((state / "status.json").read_text()).get("runningPods")),
            timeout=120,
            what="the pod to run",
        )
    finally:
        kube.close()
    pod_processes = [
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and "--hostname long-" in cmdline(int(proc.name))
    ]
    assert pod_processes
    # Stopped, not crashed: SIGSTOP keeps it from answering or being restarted, so every
    # call the teardown makes (the pod's final status, its release) goes unanswered.
    os.kill(status["components"]["kube-apiserver"], signal.SIGSTOP)

    assert "stopped" in pkobatch("dev", "down", "--state-dir", str(state)).stdout

    wait_until(
        lambda: not any(alive(pid) for pid in pids + pod_processes),
        timeout=60,
        what="processes to end",
    )
    assert not alive(supervisor_pid)
    assert leftovers(state, ports) == []
    assert json.loads((state / "status.json").read_text())["state"] == "stopped"
    assert "Traceback" not in (state / "supervisor.log").read_text()


def test_a_killed_controller_is_started_again_and_reconciles(state: Path) -> None:
    """Issue 26, item 8: the supervisor recorded a SIGKILLed controller as `exited` and the
    environment silently stopped reconciling."""
    status = start(state)
    killed = status["controller"]["pid"]

    os.kill(killed, signal.SIGKILL)

    def restarted() -> bool:
        current = read_status(state)
        controller = current["controller"]
        return bool(
            controller.get("restarts") == 1
            and controller["state"] == "running"
            and current["state"] == "running"
        )

    wait_until(restarted, timeout=120, what="the supervisor to start the controller again")
    controller = read_status(state)["controller"]
    assert controller["pid"] != killed and alive(controller["pid"])
    assert controller["lastExit"]["exitCode"] == -signal.SIGKILL
    table = pkobatch("dev", "status", "--state-dir", str(state)).stdout
    assert "restarted 1x" in table and "last exited with code -9" in table
    # The new controller reconciles a Stack created after the kill.
    kube = Kube.connect(status["kubeconfig"])
    try:
        apply_stack(kube, "default", "after-restart", {"stack": "dev", "suspend": True})
        wait_stack(
            kube,
            "default",
            "after-restart",
            lambda s: condition(s, "Ready").get("reason") == "Suspended",
            timeout=120,
            what="the restarted controller to reconcile a new Stack",
        )
    finally:
        kube.close()
