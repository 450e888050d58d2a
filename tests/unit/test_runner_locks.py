"""Which Pulumi locks a run may remove: only those left by a finished run of its Stack."""

from __future__ import annotations

from pathlib import Path

from pkobatch.runner.locks import (
    Lock,
    attributes_file,
    ended_run_of,
    lock_file,
    parse_locks,
    stale_locks,
)

JOB = "app-up-0123456789"
LOCK_URL = "file:///tmp/backend/.pulumi/locks/organization/files/dev/5b1f.json"


def refusal(*holders: tuple[str, str, int]) -> str:
    lines = [
        f"error: the stack is currently locked by {len(holders)} lock(s). Either wait for the "
        "other process(es) to end or delete the lock file with `pulumi cancel`."
    ]
    for url, host, pid in holders:
        lines.append(f"  {url}: created by root@{host} (pid {pid}) at 2026-11-30T09:00:00Z")
    return "\n".join(lines)


def test_locks_are_read_from_pulumis_refusal() -> None:
    (lock,) = parse_locks(refusal((LOCK_URL, f"{JOB}-x7k2p", 41)))

    assert lock == Lock(LOCK_URL, "root", f"{JOB}-x7k2p", 41, "2026-11-30T09:00:00Z")
    assert parse_locks("error: something else entirely") == []


def test_a_lock_belongs_to_an_ended_run_only_through_its_pod_name() -> None:
    assert ended_run_of(f"{JOB}-x7k2p", [JOB]) == JOB
    assert ended_run_of(f"{JOB}-x7k2", [JOB]) is None
    assert ended_run_of(f"{JOB}-x7k2pp", [JOB]) is None
    assert ended_run_of("laptop", [JOB]) is None
    assert ended_run_of(f"{JOB}-x7k2p", ["other-up-0123456789"]) is None
    # The Job controller cuts generateName to 58 characters.
    long_job = "a" * 45 + "-up-0123456789"
    assert ended_run_of(f"{long_job}-"[:58] + "b2c4d", [long_job]) == long_job


def test_nothing_is_stale_while_any_lock_is_not_an_ended_runs() -> None:
    ours = Lock(LOCK_URL, "root", f"{JOB}-x7k2p", 41, "t")
    laptop = Lock(LOCK_URL.replace("5b1f", "9a9a"), "me", "laptop", 7, "t")

    assert stale_locks([ours, laptop], [JOB]) is None
    assert stale_locks([], [JOB]) is None
    (stale,) = stale_locks([ours], [JOB]) or []
    assert stale.job == JOB
    assert JOB in stale.describe() and ours.host in stale.describe()


def test_only_a_file_backends_lock_file_is_addressable() -> None:
    assert lock_file(Lock(LOCK_URL, "u", "h", 1, "t")) == Path(
        "/tmp/backend/.pulumi/locks/organization/files/dev/5b1f.json"
    )
    s3 = "s3://bucket/.pulumi/locks/organization/files/dev/5b1f.json"
    assert lock_file(Lock(s3, "u", "h", 1, "t")) is None
    assert lock_file(Lock("file:///etc/passwd", "u", "h", 1, "t")) is None


def test_a_lock_files_attributes_are_beside_it() -> None:
    # As Pulumi's file:// backend (gocloud's fileblob) writes them while it holds a lock.
    path = lock_file(Lock(LOCK_URL, "u", "h", 1, "t"))
    assert path is not None
    assert attributes_file(path) == path.parent / "5b1f.json.attrs"
