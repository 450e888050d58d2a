"""`pkobatch dev up --node real`, `dev load-image`, `dev status` and `dev down` as a user runs
them: a pod of an imported image runs and `status` lists it, a node component that dies
leaves the environment `degraded`, and `down` leaves nothing of the real node behind — no
container, shim, mount, cgroup, socket directory, network namespace or interface — also when
the supervisor was SIGKILLed first, which containerd's shims and their containers outlive."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.dev_env import alive, cmdline, leftovers, pkobatch

from pkobatch.dev.node import NodePaths
from pkobatch.dev.node_network import node_network_names
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import Tools
from pkobatch.kube.client import PODS, Kube

JSON = dict[str, Any]


@pytest.fixture
def state(tmp_path: Path, real_node_tools: Tools) -> Iterator[Path]:
    state = tmp_path / "dev"
    yield state
    pkobatch("dev", "down", "--state-dir", str(state), check=False)


def processes_naming(text: str) -> list[int]:
    pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    return [pid for pid in pids if alive(pid) and text in cmdline(pid)]


def dev_status(state: Path) -> JSON:
    result = pkobatch("dev", "status", "--state-dir", str(state), "-o", "json", check=False)
    status: JSON = json.loads(result.stdout)
    return status


NOTHING_LEFT: dict[str, object] = {
    "network namespace": False,
    "host interface": False,
    "runtime directory": False,
    "cgroups": [],
    "mounts": [],
    "shims": [],
}
"""What ``what_is_left`` finds once the real node is gone."""


def what_is_left(state: Path) -> dict[str, object]:
    paths = NodePaths(state)
    netns, interface = node_network_names(state)
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{paths.cgroup_name}")]
    roots = (str(paths.directory), str(paths.runtime_dir))
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(roots)
    ]
    return {
        "network namespace": Path("/run/netns", netns).exists(),
        "host interface": Path("/sys/class/net", interface).exists(),
        "runtime directory": paths.runtime_dir.exists(),
        "cgroups": cgroups,
        "mounts": mounts,
        "shims": processes_naming(str(paths.runtime_dir)),
    }


@pytest.mark.parametrize("killed", [False, True], ids=["down", "down-after-supervisor-killed"])
def test_down_leaves_nothing_of_the_real_node(
    state: Path, busybox_archive: Path, killed: bool
) -> None:
    pkobatch(
        "dev", "up", "--state-dir", str(state), "--node", "real", "--no-controller",
        "--timeout", "600", timeout=900,
    )  # fmt: skip
    status = dev_status(state)
    assert status["state"] == "running" and status["node"] == "real"
    assert set(status["nodeComponents"]) == {
        "containerd",
        "kubelet",
        "kube-proxy",
        "kube-scheduler",
    }
    loaded = pkobatch("dev", "load-image", "--state-dir", str(state), str(busybox_archive))
    assert "pkobatch-test/busybox:1" in loaded.stdout

    token = uuid.uuid4().hex
    kube = Kube.connect(status["kubeconfig"])
    try:
        container = {
            "name": "main",
            "image": "pkobatch-test/busybox:1",
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", f"sleep 100000; : {token}"],
        }
        kube.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "sleeper"},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
            },
            "default",
        )
        wait_until(
            lambda: kube.get(PODS, "sleeper", "default")["status"].get("phase") == "Running",
            timeout=300,
            what="pod default/sleeper to run",
        )
    finally:
        kube.close()
    wait_until(
        lambda: dev_status(state).get("runningPods") == ["default/sleeper"],
        timeout=60,
        what="dev status to list the running pod",
    )
    running = what_is_left(state)
    assert running["network namespace"] and running["host interface"], running
    assert running["runtime directory"] and running["cgroups"] and running["mounts"], running
    assert running["shims"] and processes_naming(token), running

    if not killed:
        # A node component that dies leaves the environment degraded, naming it.
        os.kill(status["nodeComponents"]["kubelet"], signal.SIGKILL)
        wait_until(
            lambda: "kubelet" in (dev_status(state).get("down") or {}),
            timeout=60,
            what="dev status to report the kubelet down",
        )
        assert dev_status(state)["state"] == "degraded"
    if killed:
        os.kill(status["supervisorPid"], signal.SIGKILL)
        wait_until(lambda: not alive(status["supervisorPid"]), timeout=60, what="the kill")
        # The kubelet and containerd die with their supervisor; the container does not.
        wait_until(
            lambda: not processes_naming(str(state / "node" / "kubelet.yaml")),
            timeout=60,
            what="the kubelet to die with its supervisor",
        )
        assert processes_naming(token), "the container ended with its supervisor"

    pkobatch("dev", "down", "--state-dir", str(state))
    assert what_is_left(state) == NOTHING_LEFT
    assert processes_naming(token) == []
    assert leftovers(state, set()) == []
