"""Whether the kernel's out-of-memory killer ended part of a run: its container's memory cgroup.

The kernel kills the largest process of a memory cgroup that goes over its limit. In a run's
container that is usually the Pulumi CLI or one of its plugins, not the runner: the runner
survives, sees a failed command, and the kubelet would only report a normal failure. So the
runner counts the cgroup's OOM kills when it starts and again when a run fails
(``ContainerMemory``): a count that rose makes the failure ``OOMKilled``, with the limit
(``out_of_memory_failure``). Both cgroup versions are read: v2's ``memory.events`` and
``memory.max``, v1's ``memory.oom_control`` and ``memory.limit_in_bytes``. When the runner
itself is the process killed, it writes no result and the controller reads the reason from
the pod's status (``pkobatch.controller.pod_causes.pod_cause``).

The container's own cgroup is mounted at ``/sys/fs/cgroup`` (v2) or
``/sys/fs/cgroup/memory`` (v1) in a container; a host process (the node agent's) finds it
under its path in ``/proc/self/cgroup``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkobatch.runner.failures import RunFailure

_CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
_V1_MEMORY: Final = "memory"
# cgroup v1 reports "no limit" as the largest page-aligned signed 64-bit number.
_V1_UNLIMITED: Final = 2**62
_MEBIBYTE: Final = 2**20
_RESOURCES_FIELD: Final = "spec.workspaceTemplate.spec.resources.limits.memory"


def oom_kill_count(events: str) -> int:
    """The ``oom_kill`` count of a ``memory.events`` (v2) or ``memory.oom_control`` (v1)
    file's text; 0 when it has none (a kernel older than 4.13)."""
    for line in events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def memory_limit_bytes(text: str) -> int | None:
    """The limit in a ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) file's text;
    None when there is none."""
    value = text.strip()
    if not value.isdigit() or int(value) >= _V1_UNLIMITED:
        return None
    return int(value)


def describe_bytes(size: int) -> str:
    """``size`` as a Kubernetes quantity a user would write (``64Mi``), or in bytes."""
    return f"{size // _MEBIBYTE}Mi" if size % _MEBIBYTE == 0 else f"{size} bytes"


def out_of_memory_failure(
    kills_at_start: int, kills_now: int, limit: int | None
) -> RunFailure | None:
    """``OOMKilled`` when the kernel killed a process of the run's container since the run
    started; None otherwise."""
    if kills_now <= kills_at_start:
        return None
    within = f"its memory limit of {describe_bytes(limit)}" if limit else "the memory it may use"
    killed = kills_now - kills_at_start
    processes = "a process" if killed == 1 else f"{killed} processes"
    return RunFailure(
        "OOMKilled",
        f"the run ran out of memory: the kernel killed {processes} of the run's container "
        f"(Pulumi, its language host or a provider) that needed more than {within} "
        f"(OOMKilled); raise {_RESOURCES_FIELD}",
    )


@dataclass(frozen=True)
class ContainerMemory:
    """The memory cgroup files of the runner's container."""

    events: Path
    limit: Path

    @classmethod
    def find(
        cls, root: Path = _CGROUP_ROOT, own: Path = Path("/proc/self/cgroup")
    ) -> ContainerMemory | None:
        """The runner's memory cgroup; None where there is none to read."""
        try:
            lines = own.read_text().splitlines()
        except OSError:
            lines = []
        candidates: list[ContainerMemory] = []
        for line in lines:
            _, controllers, path = line.split(":", 2)
            relative = path.lstrip("/")
            if controllers == "" and (root / "cgroup.controllers").is_file():
                places = [root / relative, root]
                candidates += [cls(p / "memory.events", p / "memory.max") for p in places]
            elif _V1_MEMORY in controllers.split(","):
                places = [root / _V1_MEMORY / relative, root / _V1_MEMORY]
                candidates += [
                    cls(p / "memory.oom_control", p / "memory.limit_in_bytes") for p in places
                ]
        return next((c for c in candidates if c.events.is_file()), None)

    def oom_kills(self) -> int:
        try:
            return oom_kill_count(self.events.read_text())
        except OSError:
            return 0

    def limit_bytes(self) -> int | None:
        with contextlib.suppress(OSError):
            return memory_limit_bytes(self.limit.read_text())
        return None
