"""Programs' status.artifact: written only when it differs, and served as the tarball whose
digest it records (a real HTTP server on loopback)."""

from __future__ import annotations

import copy
import hashlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from pkobatch.api.program import program_tarball
from pkobatch.config import ProgramServerSettings
from pkobatch.controller.act import Actor
from pkobatch.controller.program_artifacts import (
    ProgramArtifacts,
    artifact_base_url,
    program_status,
)
from pkobatch.controller.stores import ProgramKey, program_and_stacks_naming_it
from pkobatch.dev.processes import free_port
from pkobatch.runtime.interfaces import ObjectKey
from pkobatch.runtime.store import Store

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
BASE = "http://pkobatch-controller.pkobatch-system.svc:80"
PROGRAM: dict[str, Any] = {
    "apiVersion": "pulumi.com/v1",
    "kind": "Program",
    "metadata": {"name": "web", "namespace": "team", "generation": 2, "resourceVersion": "7"},
    "program": {"variables": {"greeting": "hello"}, "outputs": {"greeting": "${greeting}"}},
}


def with_status(program: dict[str, Any], status: Any) -> dict[str, Any]:
    return {**copy.deepcopy(program), "status": status}


class RecordingActor:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    def record_program_status(self, namespace: str, name: str, status: Any) -> None:
        self.writes.append((namespace, name, status))


def test_the_base_url_is_the_services_dns_name_in_the_controllers_namespace() -> None:
    settings = ProgramServerSettings(service="pko-files", service_port=8080)
    assert artifact_base_url(settings, "ops") == "http://pko-files.ops.svc:8080"
    elsewhere = ProgramServerSettings(service_namespace="shared")
    assert artifact_base_url(elsewhere, "ops") == "http://pkobatch-controller.shared.svc:80"


def test_a_program_without_status_gets_artifact_and_observed_generation() -> None:
    status = program_status(PROGRAM, BASE, NOW)
    assert status is not None
    assert status["observedGeneration"] == 2
    tarball = program_tarball(PROGRAM)
    assert status["artifact"] == {
        "digest": "sha256:" + hashlib.sha256(tarball).hexdigest(),
        "lastUpdateTime": "2026-03-04T05:06:07Z",
        "path": "programs/team/web/2.tar.gz",
        "revision": "2",
        "size": len(tarball),
        "url": f"{BASE}/programs/team/web/2",
    }


def test_a_current_status_is_not_written_again_later() -> None:
    written = program_status(PROGRAM, BASE, NOW)
    later = NOW + timedelta(hours=10)
    assert program_status(with_status(PROGRAM, written), BASE, later) is None


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["metadata"].update(generation=3), id="new generation"),
        pytest.param(lambda p: p["status"]["artifact"].update(digest="sha256:0"), id="digest"),
        pytest.param(lambda p: p["status"].pop("observedGeneration"), id="no observedGeneration"),
    ],
)
def test_a_stale_status_is_written(change: Any) -> None:
    program = with_status(PROGRAM, program_status(PROGRAM, BASE, NOW))
    change(program)
    status = program_status(program, BASE, NOW + timedelta(minutes=1))
    assert status is not None
    assert status["artifact"]["lastUpdateTime"] == "2026-03-04T05:07:07Z"


def test_a_moved_service_rewrites_the_url() -> None:
    program = with_status(PROGRAM, program_status(PROGRAM, BASE, NOW))
    status = program_status(program, "http://other.ops.svc:80", NOW)
    assert status is not None and status["artifact"]["url"].startswith("http://other.ops.svc")


def test_an_invalid_program_gets_no_status() -> None:
    assert program_status({**PROGRAM, "program": {"runtime": "python"}}, BASE, NOW) is None


def test_a_programs_event_wakes_the_program_and_the_stacks_naming_it() -> None:
    stacks = Store()
    stacks.upsert(
        {"metadata": {"namespace": "team", "name": "a"}, "spec": {"programRef": {"name": "web"}}}
    )
    stacks.upsert({"metadata": {"namespace": "team", "name": "b"}, "spec": {"projectRepo": "x"}})
    keys = list(program_and_stacks_naming_it(stacks)(PROGRAM))
    assert keys == [ProgramKey("team", "web"), ObjectKey("team", "a")]
    assert ProgramKey("team", "web") != ObjectKey("team", "web")


@pytest.fixture
def served() -> Iterator[tuple[ProgramArtifacts, Store, RecordingActor, int]]:
    programs = Store()
    actor = RecordingActor()
    port = free_port()
    artifacts = ProgramArtifacts(
        cast(Actor, actor),
        programs,
        ProgramServerSettings(addr=f"127.0.0.1:{port}"),
        "pkobatch-system",
        lambda: NOW,
    )
    artifacts.serve_only(lambda namespace: namespace != "unselected")
    artifacts.start()
    try:
        yield artifacts, programs, actor, port
    finally:
        artifacts.stop()


def get(port: int, path: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers["Content-Type"]


def test_reconcile_writes_once_and_the_served_tarball_has_the_recorded_digest(
    served: tuple[ProgramArtifacts, Store, RecordingActor, int],
) -> None:
    artifacts, programs, actor, port = served
    programs.upsert(copy.deepcopy(PROGRAM))
    artifacts.reconcile(ProgramKey("team", "web"))
    ((namespace, name, status),) = actor.writes
    assert (namespace, name) == ("team", "web")
    programs.upsert(with_status(PROGRAM, status))
    artifacts.reconcile(ProgramKey("team", "web"))
    assert len(actor.writes) == 1, "a current status is not written again"
    url = status["artifact"]["url"]
    assert url == f"{BASE}/programs/team/web/2"
    code, body, content_type = get(port, url.removeprefix(BASE))
    assert (code, content_type) == (200, "application/gzip")
    assert "sha256:" + hashlib.sha256(body).hexdigest() == status["artifact"]["digest"]
    assert len(body) == status["artifact"]["size"]


def test_only_the_current_generation_of_a_selected_programs_namespace_is_served(
    served: tuple[ProgramArtifacts, Store, RecordingActor, int],
) -> None:
    artifacts, programs, actor, port = served
    hidden = copy.deepcopy(PROGRAM)
    hidden["metadata"]["namespace"] = "unselected"
    programs.upsert(copy.deepcopy(PROGRAM))
    programs.upsert(hidden)
    assert get(port, "/programs/team/web/2")[0] == 200
    code, body, _ = get(port, "/programs/team/web/1")
    assert code == 404 and b"at generation 2, not 1" in body
    assert get(port, "/programs/unselected/web/2")[0] == 404
    assert get(port, "/programs/team/missing/2")[0] == 404
    assert get(port, "/programs/team/web")[0] == 404
    assert get(port, "/programs/team/web/2/extra")[0] == 404
    assert get(port, "/metrics")[0] == 404
    artifacts.reconcile(ProgramKey("team", "gone"))
    assert actor.writes == [], "a Program that is gone needs no status"
