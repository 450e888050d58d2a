"""``pkobatch.dev.processes.spawn``: a child dies with its owner, no fork handler of the owner
runs in it, and a missing program is a ``FileNotFoundError`` as with ``Popen``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.dev_env import alive

from pkobatch.dev import processes
from pkobatch.dev.processes import wait_until

OWNER = """
import os, sys, time
from pathlib import Path
from pkobatch.dev import processes
os.register_at_fork(after_in_child=lambda: os.write(2, b"fork handler ran\\n"))
child = processes.spawn(["sleep", "300"], log=Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_child_dies_with_its_owner_and_runs_none_of_its_fork_handlers(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert alive(child)
        os.kill(owner.pid, signal.SIGKILL)  # no Python cleanup runs in the owner
        owner.wait(timeout=30)
        wait_until(lambda: not alive(child), timeout=30, what="the child to die with its owner")
    finally:
        if owner.poll() is None:
            owner.kill()
    # grpcio's fork handlers once aborted a child before its exec (processes' docstring);
    # a handler runs in the child before its output goes to the log.
    assert owner.stderr is not None
    assert "fork handler ran" not in owner.stderr.read() + log.read_text()


def test_a_missing_program_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        processes.spawn(["no-such-program-here"], log=tmp_path / "log")
    with pytest.raises(FileNotFoundError):
        processes.spawn(["./missing"], log=tmp_path / "log", cwd=tmp_path)
