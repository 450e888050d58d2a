"""The decision with annotations that break their rules, and with prerequisite cycles."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from decision_world import GIT_SPEC, START, World, delete, deployed_world, rfc3339

from pkobatch.api.annotations import MAX_REQUEST_CHARS
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
)
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Decision, Observed
from pkobatch.controller.job_builder import builtin_template


def test_an_abandon_typo_is_refused_once_and_the_destroy_still_runs() -> None:
    for typo in ("no", "0"):
        world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
        world.annotate(ABANDON_ANNOTATION, typo)
        result = world.step()
        refused = world.condition("AnnotationsRefused")
        assert refused is not None and refused["reason"] == "InvalidAnnotation"
        assert f"{ABANDON_ANNOTATION}: {typo!r} is not true or false" in refused["message"]
        assert [e.reason for e in result.events] == ["AnnotationRefused"]
        assert result.events[0].type == "Warning"
        delete(world)
        result = world.step()
        assert (
            result.create_job is not None and "-destroy-" in result.create_job["metadata"]["name"]
        )
        assert result.finalizer is None
        assert "AnnotationRefused" not in [e.reason for e in result.events]
        world.finish()
        result = world.step()
        assert result.finalizer == "remove"
        assert world.stack["metadata"]["finalizers"] == []


def test_abandon_true_releases_at_once_and_a_fixed_typo_clears_the_condition() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    world.annotate(ABANDON_ANNOTATION, "yes")
    world.step()
    assert world.condition("AnnotationsRefused") is not None
    world.annotate(ABANDON_ANNOTATION, "true")
    assert world.step().events == []
    assert world.condition("AnnotationsRefused") is None
    delete(world)
    result = world.step()
    assert result.finalizer == "remove" and result.create_job is None
    assert [e.reason for e in result.events] == ["FinalizerAbandoned"]


def test_an_oversized_operation_request_is_rejected_without_entering_status() -> None:
    world = deployed_world()
    value = "refresh:" + "x" * 250 * 1024
    world.annotate(OPERATION_REQUEST_ANNOTATION, value)
    result = world.step()
    assert result.create_job is None
    answer = world.status["operationRequest"]
    assert answer["state"] == "Rejected"
    assert len(answer["request"]) <= MAX_REQUEST_CHARS
    assert f"over its bound of {MAX_REQUEST_CHARS}" in answer["message"]
    assert OPERATION_REQUEST_ANNOTATION in answer["message"]
    assert len(json.dumps(world.status)) < 8 * 1024
    assert [e.reason for e in result.events] == ["OperationRequestRejected"]
    assert all(len(e.message) <= 4096 for e in result.events)
    assert world.step().events == [] and world.step().create_job is None
    assert world.condition("Ready")["status"] == "True"


def test_an_oversized_reconcile_request_starts_nothing_and_is_never_stored() -> None:
    world = deployed_world()
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "r" * (MAX_REQUEST_CHARS + 1))
    result = world.step()
    assert result.create_job is None
    assert world.status["observedReconcileRequest"] == ""
    refused = world.condition("AnnotationsRefused")
    assert refused is not None and RECONCILE_REQUEST_ANNOTATION in refused["message"]
    assert [e.reason for e in result.events] == ["AnnotationRefused"]
    assert world.step().events == []
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "now")
    result = world.step()
    assert result.create_job is not None
    assert world.status["observedReconcileRequest"] == "now"
    assert world.condition("AnnotationsRefused") is None


def refused_job_decision(world: World, message: str) -> Decision:
    stack, jobs, results = world.observed_objects()
    observed = Observed(stack=stack, jobs=jobs, results=results, now=world.now, source=world.source)
    return decide(replace(observed, job_rejected=message), world.settings, builtin_template())


def test_a_request_whose_job_the_api_server_refuses_is_answered_with_the_servers_words() -> None:
    world = deployed_world()
    world.annotate(OPERATION_REQUEST_ANNOTATION, "refresh:t1")
    refusal = (
        'Job.batch "x" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'
    )
    result = refused_job_decision(world, refusal)
    assert result.create_job is None and result.status is not None
    answer = result.status["operationRequest"]
    assert answer["state"] == "Rejected"
    assert answer["message"].startswith("its run could not start: the API server refused")
    assert refusal in answer["message"] and "Stalled condition" not in answer["message"]


# -- prerequisite cycles ------------------------------------------------------------------


def never_ran(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1, "annotations": {}}, "status": {}}


def succeeded(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": 1, "annotations": {}},
        "status": {
            "lastUpdate": {
                "state": "succeeded",
                "type": "up",
                "generation": 1,
                "reconcileRequest": "",
                "name": f"{name}-up-1",
                "lastResyncTime": rfc3339(START),
            }
        },
    }


def test_a_two_cycle_stalls_naming_it_and_recovers_when_broken() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "base"}]})
    world.prerequisites = {"base": never_ran("base")}
    world.prerequisite_graph = {"base": ["app"]}
    result = world.step()
    assert result.create_job is None
    stalled = world.condition("Stalled")
    assert stalled is not None and stalled["reason"] == "PrerequisiteCycle"
    assert "spec.prerequisites form a cycle: app -> base -> app" in stalled["message"]
    assert world.condition("Reconciling") is None
    assert [e.reason for e in result.events] == ["PrerequisiteCycle"]
    assert result.requeue_after == 30
    assert world.step().events == []

    world.prerequisite_graph = {"base": []}  # base's spec was edited
    world.step()
    assert world.condition("Stalled") is None
    assert world.condition("Reconciling")["reason"] == "PrerequisiteNotSatisfied"
    world.prerequisites = {"base": succeeded("base")}
    assert world.step().create_job is not None


def test_a_stack_needing_itself_stalls_until_its_spec_drops_it() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "app"}]})
    world.prerequisites = {"app": never_ran("app")}
    world.step()
    stalled = world.condition("Stalled")
    assert stalled is not None and stalled["reason"] == "PrerequisiteCycle"
    assert "cycle: app -> app;" in stalled["message"]
    world.edit_spec(prerequisites=[])
    world.prerequisites = {}
    assert world.step().create_job is not None
    assert world.condition("Stalled") is None


def test_a_stack_waiting_on_a_cycle_it_is_not_part_of_is_stalled_too() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "db"}]})
    world.prerequisites = {"db": never_ran("db")}
    world.prerequisite_graph = {"db": ["net"], "net": ["dns"], "dns": ["net"]}
    world.step()
    stalled = world.condition("Stalled")
    assert stalled is not None
    assert "its prerequisites wait on a cycle: net -> dns -> net" in stalled["message"]


def test_a_diamond_of_prerequisites_only_waits() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "left"}, {"name": "right"}]})
    world.prerequisites = {"left": never_ran("left"), "right": succeeded("right")}
    world.prerequisite_graph = {"left": ["bottom"], "right": ["bottom"], "bottom": []}
    world.step()
    assert world.condition("Stalled") is None
    assert world.condition("Reconciling")["reason"] == "PrerequisiteNotSatisfied"


def test_a_prerequisite_with_a_refused_reconcile_request_still_counts_as_succeeded() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "base"}]})
    base = succeeded("base")
    base["metadata"]["annotations"] = {RECONCILE_REQUEST_ANNOTATION: "r" * 1000}
    world.prerequisites = {"base": base}
    assert world.step().create_job is not None


def test_fields_that_cannot_apply_to_a_job_are_named_in_status_while_set() -> None:
    world = deployed_world(
        {
            **GIT_SPEC,
            "workspaceReclaimPolicy": "Delete",
            "workspaceTemplate": {"spec": {"serviceTemplate": {"metadata": {}}}},
        }
    )
    ignored = world.condition("FieldsIgnored")
    assert ignored is not None
    assert (ignored["status"], ignored["reason"]) == ("True", "NotApplicableToJobs")
    assert ignored["message"].startswith("spec.workspaceReclaimPolicy is ignored: ")
    assert "; spec.workspaceTemplate.spec.serviceTemplate is ignored: " in ignored["message"]
    # It does not stop the Stack: it deployed.
    assert world.condition("Ready")["status"] == "True"
    world.edit_spec(workspaceReclaimPolicy=None, workspaceTemplate=None)
    world.step()
    assert world.condition("FieldsIgnored") is None


def test_honoured_template_fields_are_not_reported() -> None:
    world = deployed_world(
        {
            **GIT_SPEC,
            "workspaceTemplate": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"securityProfile": "baseline"},
            },
            "updateTemplate": {"spec": {"ttlAfterCompleted": "1h"}},
        }
    )
    assert world.condition("FieldsIgnored") is None
