"""pkobatch.controller.decide: the skeleton — the finalizer, a pass that changes nothing, a bug
while deciding, and a finished Job of the name a step would create (refold)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from decision_world import (
    SHA1,
    World,
    delete,
    deployed_world,
)

from pkobatch.api.messages import MAX_MESSAGE_CHARS


def test_new_stack_gets_the_finalizer_and_its_first_run() -> None:
    world = World(finalizer=False)
    result = world.step()
    assert result.finalizer == "add"
    assert result.create_job is not None
    name = result.create_job["metadata"]["name"]
    assert name.startswith("app-up-")
    assert world.status["currentUpdate"] == {
        "generation": 1,
        "reconcileRequest": "",
        "name": name,
        "commit": SHA1,
    }
    assert world.status["observedGeneration"] == 1
    assert world.condition("Ready")["status"] == "False"
    assert world.condition("Reconciling")["reason"] == "StackProcessing"
    assert [e.reason for e in result.events] == ["StackUpdateDetected"]
    assert "initial stack update" in result.events[0].message


def test_an_idle_stack_decides_no_change_at_all() -> None:
    world = deployed_world()
    world.advance(3600)
    before = copy.deepcopy(world.stack)
    result = world.step()
    assert world.stack == before
    assert result.create_job is None and not result.events and result.finalizer is None
    assert result.requeue_after is None


def test_a_bug_while_deciding_stalls_that_stack_with_the_error_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = deployed_world()
    world.edit_spec(config={"x": "1"})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OverflowError("date value out of range " + "x" * 100_000)

    monkeypatch.setattr("pkobatch.controller.steps.sync.sync_decision", broken)
    result = world.step()
    assert "OverflowError" in result.error and result.create_job is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "ReconcileError"
    assert "OverflowError: date value out of range" in stalled["message"]
    assert len(stalled["message"]) <= MAX_MESSAGE_CHARS
    assert world.condition("Ready")["status"] == "False"
    assert world.status["observedGeneration"] == 2
    assert world.status["lastUpdate"]["state"] == "succeeded"
    assert [e.reason for e in result.events] == ["ReconcileError"]
    assert len(result.events[0].message) <= MAX_MESSAGE_CHARS
    assert result.requeue_after is None
    assert world.step().events == []  # no Event storm on later passes
    monkeypatch.undo()
    world.edit_spec(config={"x": "2"})
    assert world.step().create_job is not None


def test_finished_job_whose_fold_was_lost_is_folded_not_rerun() -> None:
    world = World()
    world.step()
    name = world.current_job()
    world.finish(outputs={"k": "v"})
    world.stack["status"] = {}  # lost: currentUpdate and everything else
    # Its pod, which vouches for its result, is read for the current run only: it becomes
    # the current run again, and is folded by the next reconcile.
    result = world.step()
    assert result.create_job is None and result.finished == []
    assert world.status["currentUpdate"]["name"] == name
    assert result.requeue_after == 1
    result = world.step()
    assert result.create_job is None
    assert world.status["lastUpdate"]["name"] == name
    assert world.status["outputs"] == {"k": "v"}
    assert world.condition("Ready")["status"] == "True"


def test_deleted_stack_without_finalizer_needs_nothing() -> None:
    world = World(finalizer=False)
    delete(world)
    result = world.step()
    assert result.status is None and result.finalizer is None and result.create_job is None
