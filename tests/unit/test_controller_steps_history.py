"""steps.history: old Jobs and orphaned result ConfigMaps are deleted."""

from __future__ import annotations

from decision_world import (
    World,
    deployed_world,
    rfc3339,
)

from pkobatch.api.constants import (
    RECONCILE_REQUEST_ANNOTATION,
)
from pkobatch.config import Settings


def test_history_keeps_the_newest_jobs() -> None:
    world = World(settings=Settings(job={"history_limit": 2}))
    for index in range(4):
        world.annotate(RECONCILE_REQUEST_ANNOTATION, f"r{index}")
        world.step()
        world.finish()
        world.advance(1)
    world.step()
    kept = sorted(world.jobs.values(), key=lambda j: j["metadata"]["creationTimestamp"])
    assert [j["metadata"]["uid"] for j in kept] == ["job-uid-3", "job-uid-4"]


def test_orphaned_result_configmaps_are_deleted_when_old() -> None:
    world = deployed_world()
    world.results["gone-up-123"] = {
        "metadata": {"name": "gone-up-123", "creationTimestamp": rfc3339(world.now)}
    }
    assert world.step().delete_results == []
    world.advance(601)
    assert world.step().delete_results == ["gone-up-123"]
