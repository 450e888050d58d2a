"""spec.fluxSource in the decision: the artifact revision is the Stack's source revision."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from decision_world import World
from pydantic import ValidationError
from test_controller_decide_program import snapshot_of

from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import Settings
from pkobatch.controller.decision import SourceObject
from pkobatch.controller.run_pod import run_container
from pkobatch.controller.steps.runs import run_refusal

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


def named_kind(kind: str, settings: Settings | None = None) -> World:
    spec = copy.deepcopy(FLUX_SPEC)
    spec["fluxSource"]["sourceRef"]["kind"] = kind
    w = World(spec, head=None, settings=settings)
    w.source = None
    return w


def test_a_kind_the_controller_does_not_read_is_spec_invalid_naming_the_setting() -> None:
    w = named_kind("HelmChart")
    result = w.step()
    assert result.create_job is None
    stalled = w.condition("Stalled")
    assert stalled is not None and stalled["reason"] == "SpecInvalid"
    assert "'HelmChart' is not a Flux source kind this controller reads" in stalled["message"]
    assert "(GitRepository, OCIRepository, Bucket)" in stalled["message"]
    assert "PKOBATCH_EXTRA_FLUX_SOURCE_KINDS" in stalled["message"]
    assert run_refusal(w.stack, StackSpec.model_validate(w.stack["spec"]), w.settings, {})


def test_an_added_kind_is_read_like_the_built_in_ones() -> None:
    w = named_kind("HelmChart", Settings(extra_flux_source_kinds=["HelmChart"]))
    chart = repository("1.2.3@sha256:" + "b" * 64)
    chart["kind"] = "HelmChart"
    w.source_object = SourceObject("HelmChart", "repo", chart)
    result = w.step()
    assert result.create_job is not None
    flux = snapshot_of(result.create_job).flux
    assert flux is not None and flux.revision == "1.2.3@sha256:" + "b" * 64


def test_a_kind_the_controller_cannot_list_waits_with_the_api_servers_answer() -> None:
    error = "list failed: 404 NotFound: the server could not find the requested resource"
    w = world(SourceObject("GitRepository", "repo", None, watched=False, error=error))
    result = w.step()
    assert result.create_job is None and result.requeue_after is not None
    reconciling = w.condition("Reconciling")
    assert reconciling is not None and reconciling["reason"] == "WaitingForSource"
    assert (
        "watch of GitRepository (source.toolkit.fluxcd.io/v1) cannot list them"
        in (reconciling["message"])
    )
    assert error in reconciling["message"]
    assert w.condition("Stalled") is None


def test_extra_kinds_must_be_kind_names() -> None:
    with pytest.raises(ValidationError, match="'helmcharts': not a kind name"):
        Settings(extra_flux_source_kinds=["helmcharts"])
    settings = Settings(extra_flux_source_kinds=["HelmChart", "GitRepository"])
    assert settings.flux_source_kinds == ("GitRepository", "OCIRepository", "Bucket", "HelmChart")


def test_a_legacy_artifact_with_only_a_checksum_reaches_the_run_with_it() -> None:
    legacy = repository("main/" + "2" * 40)
    artifact = legacy["status"]["artifact"]
    del artifact["digest"]
    artifact["checksum"] = "b" * 64
    w = world(SourceObject("GitRepository", "repo", legacy))
    result = w.step()
    assert result.create_job is not None
    flux = snapshot_of(result.create_job).flux
    assert flux is not None and (flux.digest, flux.checksum) == ("", "b" * 64)


def run_env(job: dict[str, Any]) -> list[tuple[str, str]]:
    container = run_container(job["spec"]["template"]["spec"])
    return [(e["name"], e.get("value", "")) for e in container.get("env") or []]


def test_the_controllers_untar_limit_reaches_flux_runs_and_a_stacks_own_entry_wins() -> None:
    settings = Settings(job={"flux_max_untar_size_bytes": 1_048_576})
    source = SourceObject("GitRepository", "repo", repository("main@sha1:" + "3" * 40))
    w = World(FLUX_SPEC, settings=settings, head=None)
    w.source, w.source_object = None, source
    job = w.step().create_job
    assert job is not None
    assert ("FLUX_MAX_UNTAR_SIZE_BYTES", "1048576") in run_env(job)

    spec = copy.deepcopy(FLUX_SPEC)
    own = {"name": "FLUX_MAX_UNTAR_SIZE_BYTES", "value": "-1"}
    spec["workspaceTemplate"] = {"spec": {"env": [own]}}
    w = World(spec, settings=settings, head=None)
    w.source, w.source_object = None, source
    job = w.step().create_job
    assert job is not None
    entries = [value for name, value in run_env(job) if name == "FLUX_MAX_UNTAR_SIZE_BYTES"]
    assert entries[-1] == "-1"  # the pod takes the last entry of a name


def test_runs_of_other_sources_get_no_untar_limit() -> None:
    w = World(settings=Settings(job={"flux_max_untar_size_bytes": 1_048_576}))
    job = w.step().create_job
    assert job is not None
    assert "FLUX_MAX_UNTAR_SIZE_BYTES" not in dict(run_env(job))


def test_a_run_of_an_artifact_with_nothing_to_verify_it_against_is_announced() -> None:
    bare = repository("main@sha1:" + "4" * 40)
    del bare["status"]["artifact"]["digest"]
    w = world(SourceObject("GitRepository", "repo", bare))
    result = w.step()
    assert result.create_job is not None
    warnings = [e for e in result.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["ArtifactUnverifiable"]
    assert "neither a digest nor a checksum" in warnings[0].message
    assert "PKOBATCH_ALLOW_UNVERIFIED_ARTIFACTS=true" in warnings[0].message


def test_a_run_of_a_verifiable_artifact_raises_no_warning() -> None:
    w = world(SourceObject("GitRepository", "repo", repository("main@sha1:" + "5" * 40)))
    result = w.step()
    assert result.create_job is not None
    assert [e for e in result.events if e.type == "Warning"] == []
