"""Helpers for tests of the ``pkobatch dev`` commands: run them as a user does, and find
what an environment left behind (processes naming its state directory, listeners on its
ports)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


def pkobatch(
    *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``pkobatch *args`` in a subprocess (``PKOBATCH_DEV_STATE`` unset: tests pass
    ``--state-dir``; rich tables as wide as they need, so lines never wrap)."""
    result = subprocess.run(
        [sys.executable, "-m", "pkobatch.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PKOBATCH_DEV_STATE": "", "COLUMNS": "400"},
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


def row(out: str, name: str, value: str) -> bool:
    """A rich table row ``name │ value`` in a command's output."""
    return re.search(rf"{re.escape(name)}\s*│\s*{re.escape(value)}\s*│", out) is not None
