"""steps.source: waiting for the branch head, and a branch that cannot be read."""

from __future__ import annotations

import copy

from decision_world import (
    SHA1,
    SHA2,
    World,
    deployed_world,
)

from pkobatch.controller.decision import SourceHead


def test_waiting_for_the_first_branch_head() -> None:
    world = World(head=None)
    world.source = SourceHead()
    result = world.step()
    assert result.create_job is None
    assert "waiting for the head of branch main" in world.condition("Reconciling")["message"]


def test_a_known_stack_keeps_its_conditions_while_the_head_is_unknown() -> None:
    world = deployed_world()
    world.source = SourceHead()
    before = copy.deepcopy(world.stack)
    assert world.step().create_job is None
    assert world.stack == before


def test_a_spec_change_waiting_for_a_fresh_head_is_reconciling() -> None:
    world = deployed_world()
    world.edit_spec(config={"x": "1"})
    world.source = SourceHead()  # the poller has no head fetched after the change yet
    result = world.step()
    assert result.create_job is None
    assert world.condition("Ready")["status"] == "False"
    assert "waiting for the head of branch main" in world.condition("Reconciling")["message"]
    world.source = SourceHead(commit=SHA2)
    assert world.step().create_job is not None
    assert world.status["currentUpdate"]["commit"] == SHA2


def test_unreadable_branch_is_stalled_source_unavailable() -> None:
    world = World()
    world.source = SourceHead(error="repository not found")
    result = world.step()
    assert result.create_job is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SourceUnavailable"
    assert "repository not found" in stalled["message"]
    world.source = SourceHead(commit=SHA1)
    assert world.step().create_job is not None
