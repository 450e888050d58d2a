"""Stale Pulumi locks: a lock left by a run of this Stack that provably no longer runs.

A run that is killed hard (SIGKILL, OOM) cannot release the lock a DIY backend (``file://``,
``s3://``, ...) keeps while an update runs, and every later run fails on it. What proves that
a lock is stale:

- Pulumi records in the lock the creator's hostname and pid and prints them when it refuses
  to run (``<lock URL>: created by <user>@<host> (pid <pid>) at <time>``);
- in Kubernetes a pod's hostname is its name, and a Job's pods are named
  ``<job>-<5 characters>`` (the Job controller's ``generateName``, cut to 58 characters);
- the controller puts into each run's snapshot the names of this Stack's Jobs that had
  *finished* when the run was created (``endedRuns``). A Job gets its ``Complete`` or
  ``Failed`` condition only once none of its pods runs any more, so a lock whose host is a pod
  of one of them was left by a process that is gone.

Only when *every* lock on the stack is such a lock does the runner remove them, and only
those files; a lock from anywhere else — a live run, a person's ``pulumi up`` on a laptop,
a Stack on another cluster — is never touched, and the run fails with ``UpdateConflict``
naming it. Removal is precise only where the runner can address the lock file itself, the
``file://`` backend; for other DIY backends the run reports the stale lock and how to release
it (``pulumi cancel`` removes *every* lock of the stack, a live one's too, so the runner runs
it only when a person asks for it: ``pkobatch unlock``, the ``unlock`` operation). Pulumi
Cloud keeps update leases, not lock files; its conflicts say nothing about the holder and are
never cleared here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlparse

# Pulumi's diy backend: "\n  %v: created by %v@%v (pid %v) at %v" per lock.
_LOCK_LINE: Final = re.compile(
    r"^\s*(?P<url>\S+): created by (?P<user>.*)@(?P<host>[^@\s]*) "
    r"\(pid (?P<pid>-?\d+)\) at (?P<at>\S+)\s*$",
    re.MULTILINE,
)
_LOCKED: Final = "the stack is currently locked by"
# The Job controller names pods with generateName "<job>-": at most 58 characters of it,
# then 5 random ones (Kubernetes' utilrand alphabet).
_GENERATED_PREFIX_LENGTH: Final = 58
_POD_SUFFIX: Final = re.compile(r"[bcdfghjklmnpqrstvwxz2456789]{5}")
_LOCK_DIR: Final = "/.pulumi/locks/"


@dataclass(frozen=True)
class Lock:
    url: str
    user: str
    host: str
    pid: int
    created: str

    def describe(self) -> str:
        return f"{self.url} (created by {self.user}@{self.host}, pid {self.pid}, at {self.created})"


def parse_locks(output: str) -> list[Lock]:
    """The locks a refused Pulumi command listed; empty when it was not refused for locks."""
    if _LOCKED not in output:
        return []
    return [
        Lock(m["url"], m["user"], m["host"], int(m["pid"]), m["at"])
        for m in _LOCK_LINE.finditer(output)
    ]


def ended_run_of(host: str, ended_runs: Iterable[str]) -> str | None:
    """The ended Job whose pod had hostname ``host``, if any."""
    for job in ended_runs:
        prefix = f"{job}-"[:_GENERATED_PREFIX_LENGTH]
        if host.startswith(prefix) and _POD_SUFFIX.fullmatch(host[len(prefix) :]):
            return job
    return None


@dataclass(frozen=True)
class StaleLock:
    lock: Lock
    job: str

    def describe(self) -> str:
        return (
            f"Pulumi lock {self.lock.url} left by pod {self.lock.host} of run {self.job}, "
            "which has finished"
        )


def stale_locks(locks: list[Lock], ended_runs: Iterable[str]) -> list[StaleLock] | None:
    """Every lock with the ended run that left it, or None when any lock is not provably
    stale (then none may be touched)."""
    ended = list(ended_runs)
    found: list[StaleLock] = []
    for lock in locks:
        job = ended_run_of(lock.host, ended)
        if job is None:
            return None
        found.append(StaleLock(lock, job))
    return found or None


def lock_file(lock: Lock) -> Path | None:
    """The local file of a ``file://`` backend's lock; None for any other backend."""
    parsed = urlparse(lock.url)
    if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        return None
    path = unquote(parsed.path)
    if _LOCK_DIR not in path or not path.endswith(".json"):
        return None
    return Path(path)


def attributes_file(lock_path: Path) -> Path:
    """The file in which the ``file://`` backend (gocloud's fileblob) keeps a lock file's
    attributes, beside it; a stale lock is removed with it."""
    return lock_path.with_name(f"{lock_path.name}.attrs")


def not_live_message(locks: list[Lock], ended_runs: Iterable[str]) -> str:
    """Why no lock was removed: the locks not left by an ended run of this Stack."""
    ended = list(ended_runs)
    others = [lock.describe() for lock in locks if ended_run_of(lock.host, ended) is None]
    return (
        "not removing the stack's lock: it was not left by a finished run of this Stack, so "
        "its holder may still run: " + "; ".join(others)
    )
