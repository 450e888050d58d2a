"""Result writing and snapshot reading: retries on transient API errors only (and, for a
snapshot, on a ConfigMap not created yet), the result's owner, and the Job's deadline.

A real API server cannot be made to fail with a 503 or lose a response on demand, so these
few edge cases use a narrow stand-in for ``Kube`` that records calls; the real writes are
covered in tests/e2e/test_runner_job.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pkobatch.api.run import (
    TERMINATION_MESSAGE_PATH_ENV,
    RunResult,
    StackRef,
    digest_in_message,
    result_digest,
    result_in_message,
    snapshot_forbidden_in_message,
    snapshot_sha256,
    split_snapshot,
)
from pkobatch.kube.client import (
    AlreadyExists,
    Forbidden,
    Kube,
    KubeError,
    NotFound,
    Resource,
    Unreachable,
)
from pkobatch.runner.command import job_group
from pkobatch.runner.report import (
    ResultNotWritten,
    ResultWriter,
    SnapshotForbidden,
    SnapshotUnreadable,
    job_deadline,
    read_snapshot,
    termination_log_path,
)


class ScriptedKube:
    """Raises the scripted errors, in order, then behaves; ``existing`` is what a ``get`` of
    a ConfigMap returns (one created by someone else, or the run's own)."""

    def __init__(
        self,
        errors: list[KubeError],
        existing: dict[str, Any] | None = None,
        taken: int = 0,
    ) -> None:
        self.errors = errors
        self.existing = existing
        # Creates of a ConfigMap that meet one of its name (someone created it first).
        self.taken = taken
        self.calls: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.deleted_uids: list[str | None] = []

    def _step(self, call: str) -> None:
        self.calls.append(call)
        if self.errors:
            raise self.errors.pop(0)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._step(f"get {res.plural}")
        if res.plural == "configmaps" and self.existing is not None:
            return self.existing
        return {"metadata": {"name": name, "uid": "job-uid", "resourceVersion": "7", "labels": {}}}

    def create(self, res: Resource, body: dict[str, Any], namespace: str | None = None) -> Any:
        self._step(f"create {res.plural}")
        if self.taken:
            self.taken -= 1
            raise AlreadyExists(409, "AlreadyExists", "exists")
        self.created.append(body)
        return body

    def delete(
        self, res: Resource, name: str, namespace: str | None = None, *, uid: str | None = None
    ) -> Any:
        self._step(f"delete {res.plural}")
        self.deleted_uids.append(uid)
        return {}

    def close(self) -> None:
        pass


def result() -> RunResult:
    return RunResult(
        operation="up",
        state="succeeded",
        reason="Succeeded",
        stack=StackRef(name="s", namespace="ns"),
        job_name="s-up-1",
    )


@pytest.fixture
def termination_log(tmp_path: Path) -> Path:
    return tmp_path / "termination-log"


def connect_to(kube: ScriptedKube) -> Callable[[], Any]:
    """``Kube.connect`` for the stand-in."""
    return lambda: kube


def writer(kube: ScriptedKube, termination_log: Path) -> ResultWriter:
    return ResultWriter(
        connect_to(kube), "ns", "s-up-1", termination_log=termination_log, sleep=lambda _: None
    )


def vouches_for(termination_log: Path, body: dict[str, Any]) -> bool:
    """The termination message names the digest of exactly what was created."""
    text = termination_log.read_text() if termination_log.exists() else ""
    return digest_in_message(text) == result_digest(body["data"]["result.json"])


def test_transient_errors_are_retried_and_the_result_vouched_for_last(
    termination_log: Path,
) -> None:
    kube = ScriptedKube([Unreachable(0, "Unreachable", "x"), KubeError(503, "Unavailable", "y")])
    writer(kube, termination_log).write(result())
    assert kube.calls == ["create configmaps"] * 3
    assert kube.created[-1]["immutable"] is True
    assert vouches_for(termination_log, kube.created[-1])


def test_a_lost_create_response_finds_the_runs_own_configmap(termination_log: Path) -> None:
    own = ScriptedKube([])
    writer(own, termination_log).write(result())
    kube = ScriptedKube([], existing=own.created[0], taken=1)
    writer(kube, termination_log).write(result())
    assert kube.calls == ["create configmaps", "get configmaps"]
    assert vouches_for(termination_log, own.created[0])


def test_a_configmap_of_its_name_that_is_not_its_own_is_replaced(termination_log: Path) -> None:
    forged = {
        "metadata": {"name": "s-up-1", "uid": "forged-uid"},
        "data": {"result.json": '{"state": "succeeded"}'},
    }
    kube = ScriptedKube([], existing=forged, taken=1)
    writer(kube, termination_log).write(result())
    assert kube.calls == [
        "create configmaps",
        "get configmaps",
        "delete configmaps",
        "create configmaps",
    ]
    # Only that very object is deleted (a uid precondition), and the run's own vouched for.
    assert kube.deleted_uids == ["forged-uid"]
    assert vouches_for(termination_log, kube.created[-1])
    assert not vouches_for(termination_log, forged)


def test_a_configmap_created_again_each_time_fails_the_write_unvouched(
    termination_log: Path,
) -> None:
    forged = {"metadata": {"uid": "forged-uid"}, "data": {"result.json": "{}"}}
    kube = ScriptedKube([], existing=forged, taken=1000)
    with pytest.raises(ResultNotWritten, match="created again each time"):
        writer(kube, termination_log).write(result())
    assert kube.calls.count("delete configmaps") == 3
    assert not termination_log.exists()


def test_a_run_forbidden_to_write_its_result_sends_it_in_the_termination_message(
    termination_log: Path,
) -> None:
    kube = ScriptedKube([Forbidden(403, "Forbidden", "no")])
    w = writer(kube, termination_log)
    w.write(result())
    assert w.inline and not kube.created
    sent = result_in_message(termination_log.read_text())
    assert RunResult.model_validate_json(sent) == result()


def test_a_result_that_cannot_be_vouched_for_is_not_written(tmp_path: Path) -> None:
    kube = ScriptedKube([])
    missing = tmp_path / "no-such-directory" / "termination-log"
    with pytest.raises(ResultNotWritten, match="PKOBATCH_TERMINATION_MESSAGE_PATH"):
        writer(kube, missing).write(result())


def test_the_termination_message_file_comes_from_the_environment() -> None:
    assert termination_log_path({}) == Path("/dev/termination-log")
    path = {"PKOBATCH_TERMINATION_MESSAGE_PATH": "/pod/termination"}
    assert termination_log_path(path) == Path("/pod/termination")


def test_retries_are_bounded(termination_log: Path) -> None:
    kube = ScriptedKube([KubeError(500, "InternalError", "x")] * 50)
    with pytest.raises(ResultNotWritten):
        writer(kube, termination_log).load_job()
    assert 1 < len(kube.calls) <= 6


def test_the_result_write_outlasts_a_minutes_long_outage_within_its_time(
    termination_log: Path,
) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def timed_writer(kube: ScriptedKube) -> ResultWriter:
        return ResultWriter(
            connect_to(kube),
            "ns",
            "s-up-1",
            termination_log=termination_log,
            sleep=sleep,
            clock=lambda: now[0],
        )

    kube = ScriptedKube([Unreachable(0, "Unreachable", "down")] * 30)
    timed_writer(kube).write(result(), time_limit=300)
    assert len(kube.calls) == 31 and 180 < now[0] <= 300
    kube = ScriptedKube([Unreachable(0, "Unreachable", "down")] * 100)
    with pytest.raises(ResultNotWritten, match="down"):
        timed_writer(kube).write(result(), time_limit=60)


def test_the_job_gives_owner_and_labels(termination_log: Path) -> None:
    kube = ScriptedKube([])
    w = writer(kube, termination_log)
    w.load_job()
    w.write(result())
    assert kube.calls == ["get jobs", "create configmaps"]


def test_job_deadline() -> None:
    job = {"spec": {"activeDeadlineSeconds": 600}, "status": {"startTime": "2026-01-01T10:00:00Z"}}
    assert job_deadline(job) == datetime(2026, 1, 1, 10, 10, tzinfo=UTC)
    assert job_deadline({"spec": {}, "status": {}}) is None


def test_the_pods_job_uid_owns_the_result_when_the_job_cannot_be_read(
    termination_log: Path,
) -> None:
    kube = ScriptedKube([Forbidden(403, "Forbidden", "no get on jobs")])
    w = ResultWriter(
        connect_to(kube),
        "ns",
        "s-up-1",
        termination_log=termination_log,
        job_uid="uid-from-label",
        sleep=lambda _: None,
    )
    with pytest.raises(ResultNotWritten):
        w.load_job()
    w.write(result())
    [owner] = kube.created[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "s-up-1", "uid-from-label")


class SnapshotKube(ScriptedKube):
    def __init__(self, errors: list[KubeError], parts: dict[str, str]) -> None:
        super().__init__(errors)
        self.parts = parts

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._step(f"get {res.plural} {namespace}/{name}")
        return {"data": {"snapshot.json": self.parts[name]}}


def read(kube: SnapshotKube, refs: list[str], digest: str) -> str:
    return read_snapshot(lambda: kube, refs, digest, sleep=lambda _: None)  # type: ignore[arg-type, return-value]


def test_a_snapshot_is_read_in_order_after_its_configmaps_appear() -> None:
    text = '{"a": "é' + "x" * 50 + '"}'
    first, second = split_snapshot(text, part_bytes=8)[:1], split_snapshot(text, part_bytes=8)[1:]
    kube = SnapshotKube(
        [NotFound(404, "NotFound", "not yet"), Unreachable(0, "Unreachable", "x")],
        {"p0": "".join(first), "p1": "".join(second)},
    )
    assert read(kube, ["ns/p0", "ns/p1"], snapshot_sha256(text)) == text
    assert kube.calls == ["get configmaps ns/p0"] * 3 + ["get configmaps ns/p1"]


def test_a_changed_snapshot_is_refused() -> None:
    kube = SnapshotKube([], {"p0": '{"changed": true}'})
    with pytest.raises(SnapshotUnreadable, match="not the one the Job records"):
        read(kube, ["ns/p0"], snapshot_sha256('{"original": true}'))


def test_a_forbidden_snapshot_read_is_not_retried() -> None:
    kube = SnapshotKube([Forbidden(403, "Forbidden", "no")], {})
    with pytest.raises(SnapshotForbidden, match="needs get on configmaps in namespace ns") as e:
        read(kube, ["ns/p0"], "0")
    assert e.value.ref == "ns/p0"
    assert len(kube.calls) == 1


def test_a_run_refused_its_snapshot_names_the_configmap_in_its_termination_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = SnapshotKube([NotFound(404, "NotFound", "not yet"), Forbidden(403, "F", "no")], {})
    monkeypatch.setattr(Kube, "connect", lambda: refused)
    termination_log = tmp_path / "termination-log"
    monkeypatch.setenv(TERMINATION_MESSAGE_PATH_ENV, str(termination_log))
    args = ["run", "--snapshot-configmap", "ns/app-up-1-snapshot-0", "--snapshot-sha256", "0"]
    outcome = CliRunner().invoke(job_group, args)
    assert outcome.exit_code == 2
    assert "the snapshot could not be read" in outcome.output
    assert snapshot_forbidden_in_message(termination_log.read_text()) == "ns/app-up-1-snapshot-0"
    # Any other unreadable snapshot leaves the termination message alone: it is retried.
    termination_log.unlink()
    changed = SnapshotKube([], {"app-up-1-snapshot-0": "{}"})
    monkeypatch.setattr(Kube, "connect", lambda: changed)
    assert CliRunner().invoke(job_group, args).exit_code == 2
    assert not termination_log.exists()


def test_snapshot_parts_are_cut_between_characters() -> None:
    text = "aé€😀" * 40
    for size in range(4, 12):
        parts = split_snapshot(text, part_bytes=size)
        assert "".join(parts) == text
        assert all(0 < len(part.encode()) <= size for part in parts)
