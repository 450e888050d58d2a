"""The rights a run's features need, checked before any operation (pkobatch.runner.rights)."""

from __future__ import annotations

from typing import Any

import pytest

from pkobatch.api.run import RunSnapshot
from pkobatch.api.stack.spec import StackSpec
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.rights import Right, check_rights, needed_rights

EXPORT = {"configMap": {"name": "app-outputs"}, "secret": {"name": "app-secrets"}}


def snapshot(operation: str = "up", **fields: Any) -> RunSnapshot:
    return RunSnapshot.model_validate(
        {
            "operation": operation,
            "stack": {"name": "app", "namespace": "team"},
            "jobName": f"app-{operation}-1",
            "spec": {"stack": "dev"},
            **fields,
        }
    )


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", **fields})


def described(rights: list[Right]) -> list[str]:
    return [right.describe() for right in rights]


def test_a_stack_without_exports_or_approval_needs_no_rights() -> None:
    assert needed_rights(snapshot(), spec()) == []


def test_exports_need_writing_on_up_and_deleting_on_destroy_but_nothing_in_a_drift_check() -> None:
    exporting = spec(exportOutputs=EXPORT)
    assert described(needed_rights(snapshot(), exporting)) == [
        f"{verb} {resource} in namespace team"
        for resource in ("configmaps", "secrets")
        for verb in ("create", "get", "update")
    ]
    assert described(needed_rights(snapshot("destroy"), exporting)) == [
        "get configmaps in namespace team",
        "delete configmaps in namespace team",
        "get secrets in namespace team",
        "delete secrets in namespace team",
    ]
    assert needed_rights(snapshot("refresh", driftCheck=True), exporting) == []


def test_a_saved_plan_needs_creating_and_an_approved_one_reading_its_secret() -> None:
    preview = snapshot("preview", savePlan={"secret": "app-plan"})
    assert described(needed_rights(preview, spec())) == ["create secrets in namespace team"]
    approved = snapshot(applyPlan={"secret": "app-plan", "id": "p1"})
    assert described(needed_rights(approved, spec())) == ["get secrets in namespace team"]


class Review:
    def __init__(self, denied: set[tuple[str, str]]) -> None:
        self.denied = denied
        self.asked: list[Right] = []

    def allowed(self, right: Right) -> bool:
        self.asked.append(right)
        return (right.verb, right.resource) not in self.denied


def test_a_missing_right_fails_the_run_naming_verb_resource_and_namespace() -> None:
    rights = needed_rights(snapshot(), spec(exportOutputs={"secret": {"name": "s"}}))
    review = Review({("create", "secrets"), ("update", "secrets")})
    with pytest.raises(RunFailure) as failure:
        check_rights(rights, review)
    assert failure.value.reason == "MissingPermission"
    assert "create secrets in namespace team (for spec.exportOutputs)" in failure.value.message
    assert "update secrets in namespace team" in failure.value.message
    assert "get secrets" not in failure.value.message
    check_rights(rights, Review(set()))  # all granted: no failure
    check_rights(rights, None)  # no cluster (`pkobatch run`): nothing to ask
