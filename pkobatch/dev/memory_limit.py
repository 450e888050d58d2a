"""A container's memory limit for the node agent's processes: a memory cgroup per container,
as the kubelet gives each container one.

``MemoryCgroup.create(name, limit)`` makes ``pkobatch-dev/<name>`` in the host's memory
cgroup hierarchy — cgroup v2 (``memory.max``; ``memory.oom.group`` so that an out-of-memory
kill ends the whole container, as the kubelet sets it on v2) or v1 (``memory.limit_in_bytes``)
— and the container's first process joins it (``pkobatch.dev.reaper --cgroup``) before it
starts the command, so every descendant is limited. ``oom_killed()`` reads the kernel's
``oom_kill`` count; on v1, where the kernel kills one process only, the agent then ends the
container's whole tree itself, and reports ``OOMKilled`` with exit code 137 either way.

Where no writable memory hierarchy exists (an ordinary user, a machine without the memory
controller), ``create`` returns None and the limit is not enforced; the agent logs that.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkobatch.runner.memory import oom_kill_count

_V2_ROOT: Final = Path("/sys/fs/cgroup")
_V1_ROOT: Final = Path("/sys/fs/cgroup/memory")
_PARENT: Final = "pkobatch-dev"


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int

    @classmethod
    def create(cls, name: str, limit: int) -> MemoryCgroup | None:
        """A new cgroup limited to ``limit`` bytes; None when cgroups cannot be written."""
        v2 = (_V2_ROOT / "cgroup.controllers").is_file()
        root = _V2_ROOT if v2 else _V1_ROOT
        if not v2 and not (root / "memory.limit_in_bytes").is_file():
            return None
        parent = root / _PARENT
        try:
            parent.mkdir(exist_ok=True)
            if v2:
                # Child cgroups of pkobatch-dev get the memory controller.
                (root / "cgroup.subtree_control").write_text("+memory")
                (parent / "cgroup.subtree_control").write_text("+memory")
            path = parent / name
            path.mkdir()
        except OSError:
            return None
        group = cls(path, 2 if v2 else 1)
        try:
            if v2:
                (path / "memory.max").write_text(str(limit))
                (path / "memory.swap.max").write_text("0")
                (path / "memory.oom.group").write_text("1")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            group.remove()
            return None
        return group

    @property
    def procs(self) -> Path:
        """The file a process writes its pid into to join the cgroup."""
        return self.path / "cgroup.procs"

    def oom_killed(self) -> bool:
        """Whether the kernel has killed a process of this cgroup for lack of memory."""
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            return oom_kill_count((self.path / events).read_text()) > 0
        except OSError:
            return False

    def remove(self) -> None:
        """Remove the cgroup (its processes must have ended)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()
