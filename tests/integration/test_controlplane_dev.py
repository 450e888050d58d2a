"""`pkobatch dev up|status|down` as a user runs them: real processes, real ports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import JOBS, Kube

pytestmark = pytest.mark.integration


def pkobatch(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pkobatch.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PKOBATCH_DEV_STATE": ""},
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.glob("*") if fd_dir.exists() else []:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listeners() -> dict[str, int]:
    """Listening TCP sockets: inode -> port."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def listening_ports(pids: list[int]) -> set[int]:
    inodes = set().union(*(socket_inodes(pid) for pid in pids))
    return {port for inode, port in listeners().items() if inode in inodes}


def port_owners(ports: set[int]) -> set[int]:
    held = {inode for inode, port in listeners().items() if port in ports}
    return {
        int(proc.name)
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and held & socket_inodes(int(proc.name))
    }


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def leftovers(state: Path, ports: set[int]) -> list[str]:
    """Processes of the environment still alive: those naming its state directory (all the
    control-plane components and the supervisor do) and the listeners on its former ports
    that are (other tests may reuse a freed port, so a listener counts only if it is ours)."""
    candidates = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    ours = {pid for pid in candidates if alive(pid) and str(state) in cmdline(pid)}
    ours |= {pid for pid in port_owners(ports) if str(state) in cmdline(pid)}
    return sorted(f"{pid}: {cmdline(pid)}" for pid in ours)


def environment_pids(status: dict[str, Any]) -> list[int]:
    """The supervisor and the control plane; the controller too while it runs (it exits on
    its own when it cannot start, and the test must not depend on that)."""
    pids = [status["supervisorPid"], *status["components"].values()]
    controller = status["controller"].get("pid")
    if controller and alive(controller):
        pids.append(controller)
    return pids


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


def test_dev_up_runs_jobs_and_down_leaves_nothing_behind(state: Path) -> None:
    status = start(state)
    pids = environment_pids(status)
    ports = listening_ports(pids)
    assert all(alive(pid) for pid in pids)
    assert int(status["server"].rsplit(":", 1)[1]) in ports
    assert len(ports) >= 4  # etcd client + peer, kube-apiserver, kube-controller-manager

    kube = Kube.connect(status["kubeconfig"])
    try:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "hello"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "unused",
                                "command": [sys.executable, "-c", "print('dev says hi')"],
                            }
                        ],
                    }
                },
            },
        }
        kube.create(JOBS, job, "default")
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
