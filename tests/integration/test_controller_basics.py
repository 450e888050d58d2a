"""The controller against the real control plane, for what needs no Pulumi run: finalizer,
spec problems, deletion, shared branch polling, and staying idle.

The controller runs as a process under its own ServiceAccount with exactly the RBAC of
deploy/kustomize/base (tests/controller_harness.py): any call it makes outside those rules
fails these tests.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    install_controller_rbac,
    wait_stack,
)

from pkobatch.api.constants import FINALIZER
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import EVENTS, SECRETS, STACKS, Kube

JSON = dict[str, Any]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def controller_rbac(cluster: Any) -> None:
    install_controller_rbac(cluster.kube)


@pytest.fixture
def controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[ControllerProcess]:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, tmp_path / "controller")
    process.start()
    yield process
    process.stop()


def git_secret(kube: Kube, namespace: str, git_server: Any, password: str | None = None) -> None:
    data = {
        "username": git_server.username,
        "password": password if password is not None else git_server.password,
    }
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "git"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
        namespace,
    )


def git_spec(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "stack": "dev",
        "projectRepo": url,
        "branch": "main",
        "gitAuth": {
            "basicAuth": {
                "userName": {"type": "Secret", "secret": {"name": "git", "key": "username"}},
                "password": {"type": "Secret", "secret": {"name": "git", "key": "password"}},
            }
        },
        **extra,
    }


def test_invalid_spec_is_stalled_and_deletion_releases_the_finalizer(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    cross_namespace = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "other"}}
    apply_stack(kube, namespace, "broken", {"stack": "dev", "envRefs": {"X": cross_namespace}})
    stack = wait_stack(
        kube,
        namespace,
        "broken",
        lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
        timeout=60,
    )
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert "cross-namespace" in condition(stack, "Stalled")["message"]
    assert condition(stack, "Ready")["status"] == "False"
    assert stack["status"]["observedGeneration"] == stack["metadata"]["generation"]
    events, _ = kube.list_objects(EVENTS, namespace)
    reasons = {e["reason"] for e in events if e["regarding"]["name"] == "broken"}
    assert "StackConfigInvalid" in reasons
    kube.delete(STACKS, "broken", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "broken", namespace) is None,
        timeout=60,
        what="the Stack to be deleted",
    )


def test_unreadable_branch_is_stalled_source_unavailable(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo()
    git_secret(kube, namespace, git_server, password="wrong-password")
    apply_stack(kube, namespace, "denied", git_spec(repo.http_url))
    stack = wait_stack(
        kube,
        namespace,
        "denied",
        lambda s: condition(s, "Stalled").get("reason") == "SourceUnavailable",
        timeout=60,
    )
    message = condition(stack, "Stalled")["message"]
    assert "main" in message and "wrong-password" not in message
    assert "currentUpdate" not in stack["status"]


def test_two_hundred_stacks_on_one_branch_share_one_ls_remote_per_interval(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo()
    git_secret(kube, namespace, git_server)
    count = 200
    for index in range(count):
        # Suspended: they poll the branch but start no run.
        apply_stack(kube, namespace, f"s{index:03d}", git_spec(repo.http_url, suspend=True))
    wait_until(
        lambda: (
            sum(
                1
                for s in kube.list_objects(STACKS, namespace)[0]
                if (s.get("status") or {}).get("observedGeneration") == 1
            )
            == count
        ),
        timeout=180,
        what="every Stack to be reconciled",
    )
    interval = 2.0
    before = controller.metric("pkobatch_git_ls_remote_total")
    started = time.monotonic()
    time.sleep(10)
    calls = controller.metric("pkobatch_git_ls_remote_total") - before
    elapsed = time.monotonic() - started
    assert 1 <= calls <= elapsed / interval + 1, (calls, elapsed)
    assert controller.metric("pkobatch_git_ls_remote_total", result="error") == 0


def test_idle_stacks_cause_no_writes(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    for index in range(5):
        apply_stack(kube, namespace, f"idle{index}", {"stack": "dev", "suspend": True})
    for index in range(5):
        wait_stack(
            kube,
            namespace,
            f"idle{index}",
            lambda s: condition(s, "Ready").get("reason") == "Suspended",
            timeout=60,
        )
    writes = ("POST", "PUT", "PATCH", "DELETE")
    time.sleep(2)
    before = sum(controller.metric("rest_client_requests_total", method=m) for m in writes)
    # Wake every Stack: a label change is a Stack event, not a spec change.
    for index in range(5):
        kube.merge_patch(STACKS, f"idle{index}", {"metadata": {"labels": {"poke": "1"}}}, namespace)
    time.sleep(5)
    after = sum(controller.metric("rest_client_requests_total", method=m) for m in writes)
    assert after == before


def test_alias_dialect_notes_read_well_and_come_once_per_generation(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    spec = {
        "stack": "dev",
        "projectRepo": "http://127.0.0.1:9/absent.git",
        "branch": "main",
        "envSecrets": [{"name": "cloud-credentials"}],
    }
    apply_stack(kube, namespace, "aliased", spec)

    def notes() -> list[JSON]:
        events, _ = kube.list_objects(EVENTS, namespace)
        return [
            e for e in events if e["reason"] == "SpecNotes" and e["regarding"]["name"] == "aliased"
        ]

    wait_until(lambda: bool(notes()), timeout=60, what="the SpecNotes Event")
    (note,) = notes()
    assert note["note"] == (
        "spec.envSecrets entries of the form {name: <secret>} (spec.envSecrets[].name) were "
        "read as Secret names; prefer the canonical form, a list of names: "
        "spec.envSecrets: [<secret>]"
    )
    kube.delete(STACKS, "aliased", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "aliased", namespace) is None,
        timeout=60,
        what="the Stack to be deleted",
    )
    # Deletion raises the generation, but the spec is the same: no second note.
    time.sleep(3)
    (note,) = notes()
    assert (note.get("series") or {}).get("count", 1) == 1
    assert note.get("deprecatedCount", 1) == 1
