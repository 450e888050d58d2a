"""steps.runs: one run at a time, and a run waiting for a free slot."""

from __future__ import annotations

from decision_world import (
    World,
)


def test_only_one_run_at_a_time() -> None:
    world = World()
    world.step()
    first = world.current_job()
    world.edit_spec(config={"x": "1"})
    result = world.step()
    assert result.create_job is None
    assert world.active_jobs() == [first]
    world.finish()
    result = world.step()
    assert result.create_job is not None
    assert world.status["currentUpdate"]["generation"] == 2


def test_no_free_slot_waits() -> None:
    world = World()
    world.slot_available = False
    result = world.step()
    assert result.create_job is None
    assert "free run slot" in world.condition("Reconciling")["message"]
    assert result.requeue_after == 30
    world.slot_available = True
    assert world.step().create_job is not None
