"""steps.deletion: release the finalizer at once, or after a destroy that succeeded."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from decision_world import (
    GIT_SPEC,
    World,
    delete,
    deployed_world,
    rfc3339,
)

from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    FINALIZER,
    RESULT_KEY,
)
from pkobatch.api.run import RunResult, StackRef
from pkobatch.config import Settings


def test_deletion_without_destroy_removes_the_finalizer_at_once() -> None:
    world = deployed_world()
    delete(world)
    result = world.step()
    assert result.finalizer == "remove"
    assert result.create_job is None and result.status is None


def test_deletion_waits_for_a_running_job() -> None:
    world = World()
    world.step()
    delete(world)
    assert world.step().finalizer is None
    world.finish()
    assert world.step().finalizer == "remove"


def test_destroy_on_finalize_destroys_then_releases() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    result = world.step()
    assert result.finalizer is None
    assert result.create_job is not None
    assert result.create_job["metadata"]["labels"]["pkobatch.io/operation"] == "destroy"
    snapshot = json.loads(result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1])
    assert snapshot["projectInfo"] == {"name": "app", "runtime": "python"}
    world.finish()
    result = world.step()
    assert result.finalizer == "remove"
    assert [e.reason for e in result.events] == ["StackCreated", "StackDestroyed"]


def forge(world: World, name: str, **fields: Any) -> None:
    """Someone else writes a succeeded result for run ``name`` (no owner reference)."""
    forged = RunResult(
        operation="destroy",
        state="succeeded",
        reason="Succeeded",
        stack=StackRef(name="app", namespace="team", uid="stack-uid"),
        job_name=name,
        permalink="https://forged.example/",
        **fields,
    )
    world.results[name] = {
        "metadata": {"name": name, "creationTimestamp": rfc3339(world.now + timedelta(hours=1))},
        "data": {RESULT_KEY: forged.to_json()},
    }


def test_a_destroy_on_deletion_releases_the_stack_only_on_a_success_its_run_vouches_for() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.step()
    name = world.current_job()
    # While the destroy runs, a forged success changes nothing.
    forge(world, name)
    result = world.step()
    assert result.finalizer is None and result.finished == []
    assert world.status["currentUpdate"]["name"] == name
    # The real destroy fails; the forgery is still what the ConfigMap holds when it is folded.
    world.finish(state="failed", reason="ProgramError", message="cannot delete bucket")
    forge(world, name)
    result = world.step()
    assert result.finalizer is None
    assert world.status["lastUpdate"]["state"] == "failed"
    assert "is not the result the pod of run" in world.status["lastUpdate"]["message"]
    assert [e.reason for e in result.events] == ["ResultRejected", "StackUpdateFailure"]
    assert world.stack["metadata"]["finalizers"] == [FINALIZER]


def test_a_destroy_whose_job_failed_keeps_the_finalizer_even_with_a_vouched_success() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.step()
    name = world.finish()  # its result says succeeded, and its pod vouches for it ...
    world.fail_job(name, reason="DeadlineExceeded")  # ... but the Job failed
    result = world.step()
    assert result.finalizer is None
    assert world.status["lastUpdate"]["state"] == "failed"
    assert "StackDestroyed" not in [e.reason for e in result.events]


def test_a_destroy_whose_pod_is_gone_is_a_failure_and_retried() -> None:
    world = deployed_world(
        {**GIT_SPEC, "destroyOnFinalize": True}, settings=Settings(retry={"base": "1s"})
    )
    delete(world)
    world.step()
    name = world.finish()
    world.pods.pop(name)  # nothing is left to vouch for its result: never trusted
    result = world.step()
    assert result.finalizer is None and world.status["lastUpdate"]["state"] == "failed"
    assert "is gone" in world.status["lastUpdate"]["message"]
    # Never wedged: the retry destroys, and only then is the Stack released.
    world.advance(result.requeue_after or 1)
    assert world.step().create_job is not None
    world.finish()
    assert world.step().finalizer == "remove"


def test_failed_destroy_keeps_the_finalizer_and_stalls_with_a_way_out() -> None:
    world = deployed_world(
        {**GIT_SPEC, "destroyOnFinalize": True}, settings=Settings(retry={"base": "1s"})
    )
    delete(world)
    world.step()
    for _ in range(4):
        world.finish(state="failed", reason="ProgramError", message="cannot delete bucket")
        result = world.step()
        assert result.finalizer is None
        if result.requeue_after:
            world.advance(result.requeue_after)
            world.step()
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "UpdateFailed"
    assert "cannot delete bucket" in stalled["message"]
    assert ABANDON_ANNOTATION in stalled["message"]
    assert world.step().create_job is None
    world.annotate(ABANDON_ANNOTATION, "true")
    result = world.step()
    assert result.finalizer == "remove"
    assert [e.reason for e in result.events] == ["FinalizerAbandoned"]


def test_destroy_on_finalize_in_a_terminating_namespace_stalls() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.namespace_terminating = True
    result = world.step()
    assert result.create_job is None and result.finalizer is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "NamespaceTerminating"
    assert "kubectl annotate stack app" in stalled["message"]


def test_preview_stack_never_destroys_on_deletion() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True, "preview": True})
    delete(world)
    assert world.step().finalizer == "remove"


def test_a_stack_that_never_completed_a_run_is_destroyed_as_in_pko() -> None:
    # The stack may hold resources from before (PKO, another Stack, a manual `pulumi up`).
    world = World({**GIT_SPEC, "destroyOnFinalize": True}, finalizer=True)
    delete(world)
    result = world.step()
    assert result.finalizer is None
    assert result.create_job is not None
    assert result.create_job["metadata"]["name"].startswith("app-destroy-")
    world.finish()
    assert world.step().finalizer == "remove"


def test_a_stack_deleted_during_its_first_run_is_destroyed_after_it() -> None:
    world = World({**GIT_SPEC, "destroyOnFinalize": True})
    world.step()
    first = world.current_job()
    delete(world)
    assert world.step().create_job is None
    world.finish(first, state="failed", reason="ProgramError")
    result = world.step()
    assert result.create_job is not None and "-destroy-" in result.create_job["metadata"]["name"]


def test_never_deployed_stack_without_destroy_on_finalize_is_released_at_once() -> None:
    world = World(GIT_SPEC, finalizer=True)
    delete(world)
    assert world.step().finalizer == "remove"
