"""``cap_malloc_arenas``: counted with glibc's own ``malloc_stats`` in a fresh process whose
threads each allocate at the same time (on this machine's glibc)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import ctypes, sys, threading
from pkobatch.runtime.malloc_arenas import cap_malloc_arenas
capped = cap_malloc_arenas() if sys.argv[1] == "cap" else None
barrier = threading.Barrier(6)
def work():
    barrier.wait()
    blocks = [bytearray(100_000) for _ in range(20)]  # below the mmap threshold: arenas
    barrier.wait()
    del blocks
threads = [threading.Thread(target=work) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()
print(capped)
"""


def arenas_and_result(mode: str, **env: str) -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=True,
    )
    arenas = sum(1 for line in done.stderr.splitlines() if line.startswith("Arena "))
    return arenas, done.stdout.strip()


def test_six_busy_threads_share_two_arenas_once_capped() -> None:
    uncapped, _ = arenas_and_result("leave")
    capped, result = arenas_and_result("cap")
    assert uncapped > 2
    assert (capped, result) == (2, "True")


def test_the_environment_variable_wins() -> None:
    arenas, result = arenas_and_result("cap", MALLOC_ARENA_MAX="3")
    assert (arenas, result) == (3, "False")
