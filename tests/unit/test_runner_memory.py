"""How the runner tells that the kernel's OOM killer ended part of its run
(pkobatch.runner.memory), from cgroup files as v1 and v2 kernels write them."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pkobatch.api.run import RunSnapshot
from pkobatch.runner.cancel import Budget, Cancellation
from pkobatch.runner.execute import execute
from pkobatch.runner.memory import (
    ContainerMemory,
    describe_bytes,
    memory_limit_bytes,
    oom_kill_count,
    out_of_memory_failure,
)
from pkobatch.runner.redact import Redactor
from pkobatch.runner.run_log import RunLog

V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
V2_EVENTS = "low 0\nhigh 0\nmax 31\noom 3\noom_kill 3\noom_group_kill 0\n"
V1_UNLIMITED = "9223372036854771712\n"


def test_the_oom_kill_count_is_read_from_either_cgroup_version() -> None:
    assert oom_kill_count(V1_OOM_CONTROL) == 2
    assert oom_kill_count(V2_EVENTS) == 3
    # Kernels before 4.13 do not count kills.
    assert oom_kill_count("oom_kill_disable 0\nunder_oom 0\n") == 0


def test_a_limit_is_read_and_no_limit_is_none() -> None:
    assert memory_limit_bytes("67108864\n") == 64 * 2**20
    assert memory_limit_bytes("max\n") is None
    assert memory_limit_bytes(V1_UNLIMITED) is None
    assert describe_bytes(64 * 2**20) == "64Mi"
    assert describe_bytes(100_000_000) == "100000000 bytes"


def test_a_kill_since_the_run_started_is_an_oom_failure_naming_the_limit() -> None:
    assert out_of_memory_failure(2, 2, 64 * 2**20) is None
    failure = out_of_memory_failure(2, 3, 64 * 2**20)
    assert failure is not None and failure.reason == "OOMKilled"
    assert "killed a process of the run's container" in failure.message
    assert "its memory limit of 64Mi (OOMKilled)" in failure.message
    assert "raise spec.workspaceTemplate.spec.resources.limits.memory" in failure.message
    unlimited = out_of_memory_failure(0, 2, None)
    assert unlimited is not None and "killed 2 processes" in unlimited.message
    assert "more than the memory it may use" in unlimited.message


def cgroup_root(tmp_path: Path, *, v2: bool) -> tuple[Path, Path]:
    """A /sys/fs/cgroup and a /proc/self/cgroup as a container sees them: its own group
    mounted at the root, /proc naming the host's path."""
    root = tmp_path / "cgroup"
    own = tmp_path / "self-cgroup"
    if v2:
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpu memory pids\n")
        (root / "memory.events").write_text(V2_EVENTS)
        (root / "memory.max").write_text("67108864\n")
        own.write_text("0::/kubepods/burstable/pod1/c0ffee\n")
    else:
        (root / "memory").mkdir(parents=True)
        (root / "memory" / "memory.oom_control").write_text(V1_OOM_CONTROL)
        (root / "memory" / "memory.limit_in_bytes").write_text("67108864\n")
        own.write_text(
            "12:pids:/kubepods/pod1/c0ffee\n11:memory:/kubepods/pod1/c0ffee\n"
            "1:name=systemd:/kubepods/pod1/c0ffee\n0::/\n"
        )
    return root, own


@pytest.mark.parametrize("v2", [False, True])
def test_a_containers_memory_cgroup_is_found_in_either_version(tmp_path: Path, v2: bool) -> None:
    root, own = cgroup_root(tmp_path, v2=v2)
    memory = ContainerMemory.find(root, own)
    assert memory is not None
    assert memory.oom_kills() == (3 if v2 else 2)
    assert memory.limit_bytes() == 64 * 2**20


def test_a_host_process_finds_its_group_under_its_path(tmp_path: Path) -> None:
    root, own = cgroup_root(tmp_path, v2=False)
    group = root / "memory" / "kubepods" / "pod1" / "c0ffee"
    group.mkdir(parents=True)
    (group / "memory.oom_control").write_text("oom_kill 7\n")
    memory = ContainerMemory.find(root, own)
    assert memory is not None and memory.oom_kills() == 7


def test_without_a_memory_cgroup_there_is_nothing_to_read(tmp_path: Path) -> None:
    assert ContainerMemory.find(tmp_path / "none", tmp_path / "no-self-cgroup") is None


@dataclass(frozen=True)
class KilledDuringTheRun(ContainerMemory):
    """A cgroup whose OOM kill count rises after it was first read, as when the kernel
    kills Pulumi mid-run."""

    reads: list[int] = field(default_factory=list)

    def oom_kills(self) -> int:
        self.reads.append(0)
        return len(self.reads) - 1


def run(memory: ContainerMemory) -> tuple[str, str]:
    snapshot = RunSnapshot.model_validate(
        {
            "operation": "up",
            "stack": {"name": "s", "namespace": "ns"},
            "jobName": "s-up-1",
            "spec": {"stack": ""},  # fails before any Pulumi command: InvalidSpec
        }
    )
    result = execute(
        snapshot,
        {},
        RunLog(io.StringIO(), Redactor()),
        Cancellation(Budget.for_grace(30)),
        memory=memory,
    )
    return result.reason, result.message


def test_a_failed_run_after_an_oom_kill_is_reported_as_oom_killed(tmp_path: Path) -> None:
    root, own = cgroup_root(tmp_path, v2=True)
    found = ContainerMemory.find(root, own)
    assert found is not None
    reason, message = run(KilledDuringTheRun(found.events, found.limit))
    assert reason == "OOMKilled"
    assert message.startswith("the run ran out of memory")
    assert "its memory limit of 64Mi" in message
    # What the run itself reported follows.
    assert "the Stack's spec is invalid" in message
    # Without a kill the failure keeps its own reason.
    assert run(found)[0] == "InvalidSpec"
