"""spec.fluxSource in the plan: the artifact revision is the Stack's source revision."""

from __future__ import annotations

from typing import Any

from test_plan import World  # the unit tier's Stack world
from test_plan_program import snapshot_of

from pkobatch.controller.plan import SourceObject

FLUX_SPEC: dict[str, Any] = {
    "stack": "dev",
    "fluxSource": {
        "sourceRef": {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "GitRepository",
            "name": "repo",
        },
        "dir": "app",
    },
}


def repository(revision: str | None, ready_message: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if revision is not None:
        status["artifact"] = {
            "revision": revision,
            "url": f"http://127.0.0.1/gitrepository/team/repo/{revision}.tar.gz",
            "digest": "sha256:" + "a" * 64,
            "path": "x",
            "lastUpdateTime": "2026-01-01T00:00:00Z",
        }
    if ready_message:
        status["conditions"] = [{"type": "Ready", "status": "False", "message": ready_message}]
    return {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": "repo", "namespace": "team"},
        "status": status,
    }


def world(source: SourceObject | None) -> World:
    w = World(FLUX_SPEC, head=None)
    w.source = None
    w.source_object = source
    return w


def test_waits_without_failing_until_the_source_has_an_artifact() -> None:
    w = world(SourceObject("GitRepository", "repo", None, watched=False))
    first = w.step()
    assert first.create_job is None and first.requeue_after is not None
    assert "watch of GitRepository" in w.condition("Reconciling")["message"]
    w.source_object = SourceObject("GitRepository", "repo", None)
    assert w.step().create_job is None
    assert "GitRepository repo does not exist" in w.condition("Reconciling")["message"]
    w.source_object = SourceObject(
        "GitRepository", "repo", repository(None, "failed to checkout: auth required")
    )
    assert w.step().create_job is None
    reconciling = w.condition("Reconciling")
    assert reconciling["reason"] == "WaitingForSource"
    assert "no artifact yet (failed to checkout: auth required)" in reconciling["message"]
    assert w.condition("Stalled") is None and "lastUpdate" not in w.status
    w.source_object = SourceObject("GitRepository", "repo", repository("main@sha1:" + "1" * 40))
    result = w.step()
    assert result.create_job is not None
    flux = snapshot_of(result.create_job).flux
    assert flux is not None and flux.revision == "main@sha1:" + "1" * 40
    assert flux.digest == "sha256:" + "a" * 64 and flux.url.endswith(".tar.gz")


def test_a_new_artifact_revision_runs_once() -> None:
    first, second = "main@sha1:" + "1" * 40, "main@sha1:" + "2" * 40
    w = world(SourceObject("GitRepository", "repo", repository(first)))
    w.step()
    w.finish()
    w.settle()
    assert w.status["lastUpdate"]["lastSuccessfulCommit"] == first
    assert w.step().create_job is None
    w.source_object = SourceObject("GitRepository", "repo", repository(second))
    assert w.step().create_job is not None
    w.finish()
    w.settle()
    assert w.status["lastUpdate"]["lastSuccessfulCommit"] == second
    assert w.step().create_job is None
