"""steps.operation_requests: operation requests, cancel and unlock, and the hold after a
requested destroy."""

from __future__ import annotations

import copy
import json

from decision_world import (
    GIT_SPEC,
    SHA2,
    World,
    deployed_world,
)

from pkobatch.api.constants import (
    OPERATION_LABEL,
    OPERATION_REQUEST_ANNOTATION,
)
from pkobatch.controller.decision import Decision, SourceHead


def request(world: World, value: str) -> Decision:
    world.annotate(OPERATION_REQUEST_ANNOTATION, value)
    return world.step()


def test_requested_refresh_runs_once_and_is_acknowledged() -> None:
    world = deployed_world()
    result = request(world, "refresh:t1")
    assert result.create_job is not None
    name = result.create_job["metadata"]["name"]
    assert "-refresh-" in name
    assert world.status["operationRequest"] == {
        "request": "refresh:t1",
        "operation": "refresh",
        "state": "Running",
        "jobName": name,
        "message": f"run {name} started",
    }
    assert world.condition("Ready")["status"] == "True"  # a refresh is not an update
    world.finish(message="refreshed")
    world.step()
    assert world.status["operationRequest"]["state"] == "Succeeded"
    assert world.status["lastUpdate"]["type"] == "up"
    assert world.step().create_job is None


def test_request_while_running_is_pending_then_runs() -> None:
    world = World()
    world.step()
    result = request(world, "preview:t1")
    assert result.create_job is None
    assert world.status["operationRequest"]["state"] == "Pending"
    world.finish()
    result = world.step()
    assert result.create_job is not None
    assert world.status["operationRequest"]["state"] == "Running"


def test_invalid_request_is_rejected_once() -> None:
    world = deployed_world()
    result = request(world, "explode:now")
    assert world.status["operationRequest"]["state"] == "Rejected"
    assert [e.reason for e in result.events] == ["OperationRequestRejected"]
    assert world.step().events == []


def test_preview_stack_rejects_up_and_destroy() -> None:
    world = deployed_world({**GIT_SPEC, "preview": True})
    request(world, "destroy:t1")
    assert world.status["operationRequest"]["state"] == "Rejected"
    assert "spec.preview" in world.status["operationRequest"]["message"]


def test_cancel_deletes_the_running_job_and_records_a_failure() -> None:
    world = World()
    world.step()
    name = world.current_job()
    result = request(world, "cancel:t1")
    assert [(d.name, d.foreground) for d in result.delete_jobs] == [(name, True)]
    last = world.status["lastUpdate"]
    assert last["state"] == "failed" and last["name"] == name and "cancelled" in last["message"]
    assert world.status["operationRequest"]["state"] == "Succeeded"
    assert "currentUpdate" not in world.status
    # The Job is still stopping: nothing new starts until it is gone.
    world.advance(60)
    assert world.step().create_job is None
    del world.jobs[name]
    assert world.step().create_job is not None  # the normal retry policy applies


def test_cancel_with_nothing_running_is_rejected() -> None:
    world = deployed_world()
    request(world, "cancel:t1")
    assert world.status["operationRequest"]["state"] == "Rejected"


def test_requested_destroy_holds_the_stack_until_up_is_requested() -> None:
    world = deployed_world()
    result = request(world, "destroy:t1")
    assert result.create_job is not None
    world.finish()
    world.step()
    assert world.status["lastUpdate"]["type"] == "destroy"
    assert world.status["outputs"] == {}
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "DestroyedOnRequest"
    world.source = SourceHead(commit=SHA2)
    world.advance(3600)
    assert world.step().create_job is None  # held: no automatic up, even on a new commit
    result = request(world, "up:t2")
    assert result.create_job is not None
    world.finish()
    world.step()
    assert world.condition("Ready")["status"] == "True"


def test_requested_destroy_hold_ends_with_a_spec_change() -> None:
    world = deployed_world()
    request(world, "destroy:t1")
    world.finish()
    world.step()
    world.edit_spec(config={"a": "b"})
    assert world.step().create_job is not None


def test_unlock_runs_pulumi_cancel_and_answers_only_the_request() -> None:
    world = deployed_world()
    deployed = copy.deepcopy(world.status["lastUpdate"])
    result = request(world, "unlock:t1")
    assert result.create_job is not None
    job = result.create_job
    name = job["metadata"]["name"]
    assert "-unlock-" in name and job["metadata"]["labels"][OPERATION_LABEL] == "unlock"
    snapshot = json.loads(job["spec"]["template"]["spec"]["containers"][0]["args"][1])
    assert snapshot["operation"] == "unlock"
    assert world.status["operationRequest"]["state"] == "Running"
    assert world.status["currentUpdate"]["name"] == name
    assert world.condition("Ready")["status"] == "True"  # an unlock is not an update
    world.finish(message="stack dev unlocked")
    world.step()
    assert world.status["operationRequest"] == {
        "request": "unlock:t1",
        "operation": "unlock",
        "state": "Succeeded",
        "jobName": name,
        "message": "stack dev unlocked",
    }
    assert world.status["lastUpdate"] == deployed
    assert "currentUpdate" not in world.status
    assert world.step().create_job is None


def test_a_failed_unlock_is_no_failed_update() -> None:
    world = deployed_world()
    deployed = copy.deepcopy(world.status["lastUpdate"])
    request(world, "unlock:t1")
    world.finish(state="failed", reason="StackNotFound", message="stack dev does not exist")
    world.step()
    assert world.status["operationRequest"]["state"] == "Failed"
    assert world.status["lastUpdate"] == deployed
    assert world.condition("Ready")["status"] == "True"
    assert world.step().create_job is None  # no retry: the request was answered


def test_unlock_is_rejected_while_a_run_is_in_progress() -> None:
    world = World()
    world.step()
    running = world.current_job()
    result = request(world, "unlock:t1")
    assert result.create_job is None and result.delete_jobs == []
    answer = world.status["operationRequest"]
    assert answer["state"] == "Rejected" and answer["jobName"] == ""
    assert running in answer["message"] and "`pkobatch cancel app`" in answer["message"]
    assert [e.reason for e in result.events] == ["OperationRequestRejected"]
    # Rejected, not queued: once the run has ended, the unlock still does not run.
    world.finish()
    world.step()
    assert world.step().create_job is None
    assert world.status["operationRequest"]["state"] == "Rejected"


def test_unlock_is_rejected_while_a_cancelled_run_still_stops() -> None:
    world = World()
    world.step()
    cancelled = world.current_job()
    request(world, "cancel:t1")
    result = request(world, "unlock:t2")
    assert result.create_job is None
    answer = world.status["operationRequest"]
    assert answer["state"] == "Rejected" and cancelled in answer["message"]
    del world.jobs[cancelled]
    result = request(world, "unlock:t3")
    assert result.create_job is not None
    assert world.status["operationRequest"]["state"] == "Running"


def test_an_unlock_after_a_requested_destroy_keeps_the_hold() -> None:
    world = deployed_world()
    request(world, "destroy:t1")
    world.finish(state="failed", reason="UpdateConflict", message="the stack is locked")
    world.step()
    assert world.condition("Stalled")["reason"] == "DestroyedOnRequest"
    request(world, "unlock:t2")
    world.finish()
    world.step()
    assert world.status["operationRequest"]["state"] == "Succeeded"
    # No automatic up recreates what the user asked to destroy.
    world.advance(3600)
    assert world.step().create_job is None
    assert world.condition("Stalled")["reason"] == "DestroyedOnRequest"
    result = request(world, "destroy:t3")
    assert result.create_job is not None and "-destroy-" in result.create_job["metadata"]["name"]
