"""Cap glibc's malloc arenas, so freed memory is shared by the controller's threads.

glibc gives each thread that allocates under contention an arena of its own, up to eight
per core, and memory freed in an arena is reused only by allocations from that arena. The
controller's workers, watches and senders each decode, build and drop large transient
objects (watch events, finished runs read back out of their packed form, plans), so each
arena keeps its own high-water mark of freed memory and the process's resident memory grows
with the number of busy threads. Two arenas is the usual setting for threaded Python
services (``MALLOC_ARENA_MAX=2``); small objects are Python's own allocator's and are not
affected.

Set before the threads start. ``MALLOC_ARENA_MAX`` in the environment, read by glibc
itself, takes priority; other C libraries (musl) have no arenas to cap and are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Final

# mallopt's parameter number for the arena cap (glibc's malloc.h).
M_ARENA_MAX: Final = -8
CONTROLLER_ARENAS: Final = 2

log = logging.getLogger(__name__)


def cap_malloc_arenas(arenas: int = CONTROLLER_ARENAS) -> bool:
    """Cap glibc's arenas at ``arenas``; False where the environment already sets the cap
    or the C library has no ``mallopt``."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:
        log.warning("could not cap malloc arenas at %d", arenas)
        return False
    return True
