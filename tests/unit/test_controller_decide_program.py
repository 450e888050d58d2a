"""spec.programRef in the decision: a Program's generation is the Stack's source revision."""

from __future__ import annotations

import json
from typing import Any

import yaml
from decision_world import World

from pkobatch.api.run import RunSnapshot
from pkobatch.controller.decision import SourceObject

PROGRAM_SPEC: dict[str, Any] = {"stack": "dev", "programRef": {"name": "web"}}


def program(generation: int, outputs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": "web", "namespace": "team", "generation": generation},
        "program": {
            "resources": {
                "cm": {"type": "kubernetes:core/v1:ConfigMap", "properties": {"data": {"a": "b"}}}
            },
            "outputs": outputs or {"name": "${cm.metadata.name}"},
        },
    }


def snapshot_of(job: dict[str, Any]) -> RunSnapshot:
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    return RunSnapshot.model_validate(json.loads(args[args.index("--snapshot") + 1]))


def world_with(generation: int | None) -> World:
    world = World(PROGRAM_SPEC, head=None)
    world.source = None
    world.source_object = SourceObject(
        "Program", "web", program(generation) if generation is not None else None
    )
    return world


def test_missing_program_waits_reconciling_without_a_failure() -> None:
    world = world_with(None)
    result = world.step()
    assert result.create_job is None
    reconciling = world.condition("Reconciling")
    assert reconciling is not None
    assert reconciling["reason"] == "WaitingForSource"
    assert "Program web does not exist in namespace team" in reconciling["message"]
    assert world.condition("Stalled") is None
    assert "lastUpdate" not in world.status
    world.source_object = SourceObject("Program", "web", program(1))
    assert world.step().create_job is not None


def test_the_run_carries_the_rendered_program_at_its_generation() -> None:
    world = world_with(4)
    result = world.step()
    assert result.create_job is not None
    snapshot = snapshot_of(result.create_job)
    assert snapshot.commit == "4"
    assert snapshot.program is not None
    assert snapshot.program.revision == "4"
    project = yaml.safe_load(snapshot.program.project)
    assert project["name"] == "web" and project["runtime"] == "yaml"
    assert project["resources"]["cm"]["type"] == "kubernetes:core/v1:ConfigMap"


def test_a_program_edit_reruns_the_stack_once() -> None:
    world = world_with(1)
    world.step()
    world.finish()
    world.settle()
    assert world.condition("Ready")["status"] == "True"
    assert world.status["lastUpdate"]["lastSuccessfulCommit"] == "1"
    # Generation 1 -> 10 must not look like an abbreviation of the same revision.
    world.source_object = SourceObject("Program", "web", program(10, {"x": 1}))
    result = world.step()
    assert result.create_job is not None
    assert snapshot_of(result.create_job).program.revision == "10"  # type: ignore[union-attr]
    world.finish()
    world.settle()
    assert world.status["lastUpdate"]["lastSuccessfulCommit"] == "10"
    assert world.step().create_job is None


def test_an_invalid_stored_program_is_reported_on_the_stack() -> None:
    world = world_with(2)
    broken = program(2)
    broken["program"]["runtime"] = "python"
    world.source_object = SourceObject("Program", "web", broken)
    assert world.step().create_job is None
    stalled = world.condition("Stalled")
    assert (
        stalled is not None
        and "Program web is not a valid Pulumi YAML program" in (stalled["message"])
    )
