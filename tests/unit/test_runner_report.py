"""Result writing and snapshot reading: retries on transient API errors only (and, for a
snapshot, on a ConfigMap not created yet), the result's owner, and the Job's deadline.

A real API server cannot be made to fail with a 503 or lose a response on demand, so these
few edge cases use a narrow stand-in for ``Kube`` that records calls; the real writes are
covered in tests/e2e/test_runner_job.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pkobatch.api.run import RunResult, StackRef, snapshot_sha256, split_snapshot
from pkobatch.kube.client import (
    AlreadyExists,
    Forbidden,
    KubeError,
    NotFound,
    Resource,
    Unreachable,
)
from pkobatch.runner.report import (
    ResultNotWritten,
    ResultWriter,
    SnapshotUnreadable,
    job_deadline,
    read_snapshot,
)


class ScriptedKube:
    """Raises the scripted errors, in order, then behaves."""

    def __init__(self, errors: list[KubeError]) -> None:
        self.errors = errors
        self.calls: list[str] = []
        self.replaced: dict[str, Any] | None = None

    def _step(self, call: str) -> None:
        self.calls.append(call)
        if self.errors:
            raise self.errors.pop(0)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._step(f"get {res.plural}")
        return {"metadata": {"name": name, "uid": "job-uid", "resourceVersion": "7", "labels": {}}}

    def create(self, res: Resource, body: dict[str, Any], namespace: str | None = None) -> Any:
        self._step(f"create {res.plural}")
        return body

    def replace(self, res: Resource, body: dict[str, Any], namespace: str | None = None) -> Any:
        self._step(f"replace {res.plural}")
        self.replaced = body
        return body

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


def writer(kube: ScriptedKube) -> ResultWriter:
    return ResultWriter(lambda: kube, "ns", "s-up-1", sleep=lambda _: None)  # type: ignore[arg-type, return-value]


def test_transient_errors_are_retried() -> None:
    kube = ScriptedKube([Unreachable(0, "Unreachable", "x"), KubeError(503, "Unavailable", "y")])
    writer(kube).write(result())
    assert kube.calls == ["create configmaps"] * 3


def test_a_lost_create_response_becomes_an_update() -> None:
    kube = ScriptedKube([AlreadyExists(409, "AlreadyExists", "exists")])
    writer(kube).write(result())
    assert kube.calls == ["create configmaps", "get configmaps", "replace configmaps"]
    assert kube.replaced is not None
    assert kube.replaced["metadata"]["resourceVersion"] == "7"


def test_forbidden_is_not_retried() -> None:
    kube = ScriptedKube([Forbidden(403, "Forbidden", "no")])
    with pytest.raises(ResultNotWritten, match="Forbidden"):
        writer(kube).write(result())
    assert kube.calls == ["create configmaps"]


def test_retries_are_bounded() -> None:
    kube = ScriptedKube([KubeError(500, "InternalError", "x")] * 50)
    with pytest.raises(ResultNotWritten):
        writer(kube).load_job()
    assert 1 < len(kube.calls) <= 6


def test_the_result_write_outlasts_a_minutes_long_outage_within_its_time() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    kube = ScriptedKube([Unreachable(0, "Unreachable", "down")] * 30)
    w = ResultWriter(lambda: kube, "ns", "s-up-1", sleep=sleep, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    w.write(result(), time_limit=300)
    assert len(kube.calls) == 31 and 180 < now[0] <= 300
    kube = ScriptedKube([Unreachable(0, "Unreachable", "down")] * 100)
    w = ResultWriter(lambda: kube, "ns", "s-up-1", sleep=sleep, clock=lambda: now[0])  # type: ignore[arg-type, return-value]
    with pytest.raises(ResultNotWritten, match="down"):
        w.write(result(), time_limit=60)


def test_the_job_gives_owner_and_labels() -> None:
    kube = ScriptedKube([])
    w = writer(kube)
    w.load_job()
    w.write(result())
    assert kube.calls == ["get jobs", "create configmaps"]


def test_job_deadline() -> None:
    job = {"spec": {"activeDeadlineSeconds": 600}, "status": {"startTime": "2026-01-01T10:00:00Z"}}
    assert job_deadline(job) == datetime(2026, 1, 1, 10, 10, tzinfo=UTC)
    assert job_deadline({"spec": {}, "status": {}}) is None


def test_the_pods_job_uid_owns_the_result_when_the_job_cannot_be_read() -> None:
    kube = ScriptedKube([Forbidden(403, "Forbidden", "no get on jobs")])
    w = ResultWriter(lambda: kube, "ns", "s-up-1", job_uid="uid-from-label", sleep=lambda _: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ResultNotWritten):
        w.load_job()
    created: list[dict[str, Any]] = []
    kube.create = lambda res, body, namespace=None: created.append(body)  # type: ignore[method-assign]
    w.write(result())
    [owner] = created[0]["metadata"]["ownerReferences"]
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
    with pytest.raises(SnapshotUnreadable, match="Forbidden"):
        read(kube, ["ns/p0"], "0")
    assert len(kube.calls) == 1


def test_snapshot_parts_are_cut_between_characters() -> None:
    text = "aé€😀" * 40
    for size in range(4, 12):
        parts = split_snapshot(text, part_bytes=size)
        assert "".join(parts) == text
        assert all(0 < len(part.encode()) <= size for part in parts)
