"""The first process of a node-agent container: what a container's PID namespace and cgroup
give the kubelet, for a process that runs on the host.

``python -m pkobatch.dev.reaper [--hostname NAME] [--cgroup PROCS_FILE] -- COMMAND...`` runs
COMMAND and:

- with ``--cgroup``, first joins the container's memory cgroup (its ``cgroup.procs`` file;
  ``pkobatch.dev.memory_limit``), so COMMAND and everything it starts are limited;

- is the container's *subreaper* (``PR_SET_CHILD_SUBREAPER``): every process COMMAND starts,
  however deep and even after ``setsid()`` (a process-group kill misses those — a Pulumi
  dynamic provider did outlive its pod), stays its descendant, so it can always find them;
- when COMMAND ends, SIGKILLs every process left, as a container's end does, and exits with
  COMMAND's code (128+N for a signal N);
- passes SIGTERM, SIGINT and SIGHUP on to COMMAND alone, as a container runtime signals a
  container's first process and not its tree (a launcher such as the runner bundle's
  PyInstaller bootloader forwards a signal to its own child, which a signal to the whole
  process group would reach twice), and when its parent (the node agent) dies it kills the
  whole tree first;
- with ``--hostname``, runs everything in a UTS namespace of its own whose hostname is NAME,
  as a pod's hostname is its name (as root, or in a user namespace of its own where the
  kernel allows that; otherwise the host's name stays — HOSTNAME in the environment is set
  by the agent either way). Pulumi records the hostname in its locks, which is how a lock
  is tied to the pod that took it (``pkobatch.runner.locks``).

It is the process the agent waits for and, after the grace period, kills together with its
descendants (``pkobatch.dev.processes.kill_tree``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from pkobatch.dev import processes

_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36
_CLONE_NEWUTS: Final = 0x04000000
_CLONE_NEWUSER: Final = 0x10000000


class _ParentDied(Exception):
    pass


def _own_hostname(libc: ctypes.CDLL, name: str) -> bool:
    """Move into a new UTS namespace named ``name``; False when not permitted. Without root,
    a user namespace of its own (the same uid and gid mapped to themselves) gives the right
    to name it, where the kernel allows unprivileged user namespaces."""
    if libc.unshare(_CLONE_NEWUTS) != 0:
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWUTS) != 0:
            return False
        try:
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        except OSError:
            return False
    encoded = name.encode()
    return bool(libc.sethostname(encoded, len(encoded)) == 0)


def _parent_died(signum: int, frame: object) -> None:
    raise _ParentDied


def run(command: list[str], hostname: str | None, cgroup: str | None = None) -> int:
    if cgroup:
        # Join the container's memory cgroup (pkobatch.dev.memory_limit) before anything
        # starts, so the command and all its descendants are limited.
        Path(cgroup).write_text(str(os.getpid()))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    parent = os.getppid()
    # The agent started this process with a SIGKILL parent-death signal; a catchable one
    # lets it take its descendants along.
    signal.signal(signal.SIGUSR1, _parent_died)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)
    if os.getppid() != parent:
        return 137
    if hostname:
        _own_hostname(libc, hostname)
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, frame: object) -> None:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: handlers are reset by exec, ignored signals are inherited.
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 128
    started.append(child)
    code = 137
    try:
        while True:
            pid, status = os.waitpid(-1, 0)  # reaps orphans as they are handed over
            if pid == child.pid:
                returned = os.waitstatus_to_exitcode(status)
                code = 128 - returned if returned < 0 else returned
                break
    except _ParentDied:
        pass
    _end_descendants()
    return code


def _end_descendants() -> None:
    """SIGKILL and reap every process left, until none is: one that was being started, or
    whose parent was still exiting, arrives late — never block on one that lives."""
    while True:
        processes.kill_descendants(os.getpid())
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    hostname: str | None = None
    cgroup: str | None = None
    while argv[:1] in (["--hostname"], ["--cgroup"]) and len(argv) > 1:
        if argv[0] == "--hostname":
            hostname = argv[1]
        else:
            cgroup = argv[1]
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(
            "usage: python -m pkobatch.dev.reaper [--hostname NAME] [--cgroup PROCS_FILE] "
            "-- COMMAND...",
            file=sys.stderr,
        )
        return 2
    return run(argv, hostname, cgroup)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
