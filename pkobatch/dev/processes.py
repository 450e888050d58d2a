"""Child processes that never outlive their owner.

Every child runs in its own process group (so a stop reaches the grandchildren it spawned),
is registered for an ``atexit`` sweep, and asks the kernel to SIGKILL it when the thread
that started it dies (``PR_SET_PDEATHSIG``) — which also covers an owner killed with
SIGKILL, where no Python cleanup runs. Because the death signal follows the *thread*, start
children only from threads that live at least as long as the child.

The death signal is set by util-linux's ``setpriv --pdeathsig``, which then execs the
program in its place; ``spawn`` returns once that exec has happened, so an owner killed
right after it still takes the child along. Setting it from a ``preexec_fn`` instead makes
Python fork rather than vfork, and a forked child runs the fork handlers of every library
loaded in the owner:
grpcio's (loaded with Pulumi's SDK) once aborted a child before its exec (SIGABRT, a
kube-apiserver restarted by a test "exiting" with -6). Without ``setpriv`` the
``preexec_fn`` is the fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

_PR_SET_PDEATHSIG: Final = 1
_libc: Any = None
with contextlib.suppress(OSError):
    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None

_live: dict[int, subprocess.Popen[bytes]] = {}
_live_lock = threading.Lock()


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1 (chosen by the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_SETPRIV: Final = shutil.which("setpriv")


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def prepare() -> None:
        # Runs in the child between fork and exec: only async-signal-safe work here.
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return prepare


def find_program(program: str, search_path: str | None, cwd: Path | str | None) -> str | None:
    """The executable exec would run for ``program``: a bare name looked up on
    ``search_path``, a path taken relative to ``cwd``; None if there is none."""
    if os.sep in program and cwd is not None:
        program = os.path.join(cwd, program)
    return shutil.which(program, path=search_path)


def _dying_with_parent(
    argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path | str | None
) -> tuple[list[str], Callable[[], None] | None]:
    """The command line and ``preexec_fn`` that start ``argv`` with its death signal set."""
    if _SETPRIV is None:
        return list(argv), _die_with_parent(os.getpid())
    search = (env if env is not None else os.environ).get("PATH")
    if find_program(argv[0], search, cwd) is None:
        # As Popen would raise it, not as setpriv's exit status 127 in the log.
        raise FileNotFoundError(2, "No such executable", argv[0])
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv], None


def spawn(
    argv: Sequence[str],
    *,
    log: Path | IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout+stderr going to ``log``."""
    command, preexec = _dying_with_parent(argv, env, cwd)
    handle: IO[bytes] | int
    close_after = False
    if isinstance(log, Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("ab")
        close_after = True
    else:
        handle = log if log is not None else subprocess.DEVNULL
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
    finally:
        if close_after and not isinstance(handle, int):
            handle.close()
    if preexec is None:
        _wait_for_exec(process.pid)
    with _live_lock:
        _live[process.pid] = process
    return process


def _wait_for_exec(pid: int, timeout: float = 10.0) -> None:
    """Return once ``setpriv`` has set the death signal and exec'd the program (the process
    no longer runs ``setpriv``), so an owner killed right after ``spawn`` still takes the
    child with it; before that, nothing would."""
    assert _SETPRIV is not None
    setpriv = os.path.realpath(_SETPRIV)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{pid}/exe") != setpriv:
                return
        except OSError:
            return  # already gone: its exit status tells the caller
        time.sleep(0.001)


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; the exit code."""
    if process.poll() is None:
        signal_group(process, signal.SIGTERM)
        # A stopped (SIGSTOP) process handles SIGTERM only once it runs again.
        signal_group(process, signal.SIGCONT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    # The leader may be gone while a grandchild still holds the group: kill what is left.
    signal_group(process, signal.SIGKILL)
    code = process.wait()
    forget(process)
    return code


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


def _kill_until_none(find: Callable[[], list[int]], rounds: int) -> None:
    """SIGKILL what ``find`` lists, again until it lists nothing (one may have forked while
    the others were killed)."""
    for _ in range(rounds):
        found = find()
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def kill_descendants(pid: int, *, rounds: int = 50) -> None:
    """SIGKILL every process below ``pid``, until none is left. Processes that called
    ``setsid()`` are found too: the walk follows parents, not process groups."""
    _kill_until_none(lambda: descendants(pid), rounds)


def marked(variable: str, value: str) -> list[int]:
    """Every live process whose environment has ``variable=value``: children inherit it, so
    it finds what left its tree (a process whose subreaper was killed is reparented to
    init, out of reach of ``descendants``)."""
    entry_bytes = f"{variable}={value}".encode()
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if entry_bytes in environ:
            found.append(int(entry.name))
    return found


def kill_marked(variable: str, value: str, *, rounds: int = 50) -> None:
    """SIGKILL every process ``marked`` with ``variable=value``, until none is left."""
    _kill_until_none(lambda: marked(variable, value), rounds)


def kill_tree(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL ``process``, its process group and everything below it; the exit code."""
    if process.poll() is None:
        # Descendants first: once the leader is gone, its orphans leave its tree.
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGSTOP)
        kill_descendants(process.pid)
    return stop(process, grace=0)


def forget(process: subprocess.Popen[bytes]) -> None:
    with _live_lock:
        _live.pop(process.pid, None)


def kill_all() -> None:
    """SIGKILL every process group still registered (the last-resort sweep)."""
    with _live_lock:
        processes = list(_live.values())
        _live.clear()
    for process in processes:
        signal_group(process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


atexit.register(kill_all)


def exit_on_termination_signals() -> None:
    """Turn SIGTERM and SIGHUP into ``SystemExit`` so ``finally`` blocks, fixtures' teardown
    and ``atexit`` run (their default action ends the process without any of them).
    Only from the main thread; handlers someone else installed are kept."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, handler)


def wait_until(
    check: Callable[[], bool], *, timeout: float, interval: float = 0.2, what: str
) -> None:
    """Poll ``check`` until it returns true; ``TimeoutError`` naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
