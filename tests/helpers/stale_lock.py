"""A stale Pulumi lock on a ``file://`` backend, left the way a real one is: a ``pulumi up``
killed mid-update with no chance to clean up (SIGKILL, as the OOM killer or a lost laptop
does).

``leave_stale_lock`` starts ``pkobatch run`` (the runner on this machine, the real Pulumi CLI)
of a Stack manifest whose program holds its update open (the ``files`` program's
``holdUntil``), waits until the update holds the stack's lock, then kills Pulumi's session
(the CLI, its plugins) and the run's process group. The lock names this host and a pid that
is gone: no run of a Stack left it, so a Stack's next run never removes it by itself
(``pkobatch.runner.locks``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pkobatch.dev.processes import wait_until

LOCK_TIMEOUT = 300.0


def backend_locks(backend_url: str) -> list[Path]:
    """The lock files of a ``file://`` backend (not their ``.attrs`` companions)."""
    root = Path(backend_url.removeprefix("file://")) / ".pulumi" / "locks"
    return sorted(p for p in root.rglob("*.json") if p.is_file())


def lock_directory_files(backend_url: str) -> list[Path]:
    """Every file under the backend's lock directory, ``.attrs`` companions included."""
    root = Path(backend_url.removeprefix("file://")) / ".pulumi" / "locks"
    return sorted(p for p in root.rglob("*") if p.is_file())


def held_lock(backend_url: str, seconds: float = 3.0) -> Path | None:
    """The one lock held for at least ``seconds``: an update's, not a quick command's."""
    before = backend_locks(backend_url)
    if len(before) != 1:
        return None
    time.sleep(seconds)
    return before[0] if backend_locks(backend_url) == before else None


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``: Pulumi and its plugins, which run in process
    groups of their own."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # Fields after the command's ")": state, ppid, pgrp, session, ...
            session = int((proc / "stat").read_text().rpartition(")")[2].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if session == sid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def leave_stale_lock(manifest: Path, env: Mapping[str, str], backend_url: str) -> Path:
    """Run ``manifest`` with ``pkobatch run`` until its update holds the lock, kill it
    without cleanup, and return the lock file it left."""
    run = subprocess.Popen(
        [sys.executable, "-m", "pkobatch.main", "run", "-f", str(manifest), "-o", "json"],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def held() -> bool:
            assert run.poll() is None, "the run ended before its update took the stack lock"
            return held_lock(backend_url) is not None

        wait_until(held, timeout=LOCK_TIMEOUT, what="the update to hold the stack lock")
        (lock,) = backend_locks(backend_url)
        # The runner starts Pulumi in a session of its own, which the lock's pid leads.
        kill_session(int(json.loads(lock.read_text())["pid"]))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    assert lock.exists(), "the killed update's lock is gone"
    return lock
