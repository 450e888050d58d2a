"""pkobatch.runner.plans: the Secret of a saved plan, and reading it back (pure)."""

from __future__ import annotations

import base64
import json
import random

import pytest

from pkobatch.api.run import JOB_UID_ENV, MAX_PLAN_BYTES, PLAN_KEY, StackRef
from pkobatch.runner.failures import RunFailure, classify_pulumi_error
from pkobatch.runner.plans import plan_from_secret, plan_secret, planned_steps

STACK = StackRef(name="app", namespace="team", uid="stack-uid")
PLAN = {
    "resourcePlans": {
        "urn:b": {"steps": ["same"]},
        "urn:a": {"steps": ["create"]},
        "urn:c": {"steps": ["delete", "create"]},
    }
}


def test_planned_steps_list_only_what_changes() -> None:
    steps, count = planned_steps(PLAN)
    assert [(s.urn, s.op) for s in steps] == [("urn:a", "create"), ("urn:c", "delete,create")]
    assert count == 2


def test_the_plan_secret_is_immutable_owned_by_the_job_and_round_trips() -> None:
    text = json.dumps(PLAN).encode()
    body = plan_secret("job-plan", text, "plan-x", STACK, "job", {JOB_UID_ENV: "job-uid"})
    assert body["kind"] == "Secret" and body["immutable"] is True
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "job", "uid": "job-uid"}
    ]
    assert plan_from_secret(body, "job-plan") == text


def test_a_plan_without_its_jobs_uid_is_not_written_ownerless() -> None:
    with pytest.raises(RunFailure, match=JOB_UID_ENV):
        plan_secret("job-plan", b"{}", "plan-x", STACK, "job", {})


def test_a_plan_too_large_for_a_secret_fails_the_preview_clearly() -> None:
    noise = random.Random(0).randbytes(MAX_PLAN_BYTES + 1024)  # does not compress
    with pytest.raises(RunFailure, match="more than a Secret can hold"):
        plan_secret("p", noise, "plan-x", STACK, "job", {JOB_UID_ENV: "u"})


def test_an_unreadable_plan_secret_is_a_plan_mismatch() -> None:
    with pytest.raises(RunFailure) as raised:
        plan_from_secret({"data": {PLAN_KEY: base64.b64encode(b"not gzip").decode()}}, "p")
    assert raised.value.reason == "PlanMismatch"
    with pytest.raises(RunFailure):
        plan_from_secret({"data": {}}, "p")


URN = "urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::settings"


def diagnostics(error: str) -> str:
    return f"Diagnostics:\n  kubernetes:core/v1:ConfigMap (settings):\n    error: {error}\n"


# Each way Pulumi's engine (pkg/resource/deploy, v3.259.0) refuses what a saved plan does not
# allow, with the error class the Automation API may give the failed command.
@pytest.mark.parametrize(
    ("kind", "stdout", "stderr"),
    [
        (
            "CommandError",
            diagnostics(
                f"resource {URN} violates plan: properties changed: "
                "++metadata[{map[annotations:{map[tag:{&{{a}}}]}]}!={map[annotations:"
                "{map[tag:{&{{b}}}]}]}]"
            ),
            "",
        ),
        ("CommandError", diagnostics(f"resource {URN} violates plan: provider changed"), ""),
        ("CommandError", diagnostics("resource violates plan: properties changed: ~~x[{1}]"), ""),
        (
            "CommandError",
            diagnostics("replace is not allowed by the plan: this resource is constrained to same"),
            "",
        ),
        (
            "CommandError",
            diagnostics(
                "create is not allowed by the plan: no more steps were expected for this resource"
            ),
            "",
        ),
        (
            "CommandError",
            diagnostics(
                "update is not allowed by the plan: no steps were expected for this resource"
            ),
            "",
        ),
        (
            "CommandError",
            diagnostics(f"expected resource operations for {URN} but none were seen"),
            "",
        ),
        ("CommandError", diagnostics(f"no plan for resource {URN}"), ""),
        ("CommandError", "", f"error: resource {URN} violates plan: parent changed"),
        # The program failed too (its resource registration was refused): the plan decides.
        (
            "RuntimeError",
            diagnostics(f"resource {URN} violates plan: protect changed (expected false)")
            + "    error: Program failed with an unhandled exception:\n",
            "",
        ),
    ],
)
def test_every_refusal_of_a_saved_plan_is_a_plan_mismatch(
    kind: str, stdout: str, stderr: str
) -> None:
    failure = classify_pulumi_error(kind, stdout, stderr)
    assert failure.reason == "PlanMismatch"
    assert failure.message.startswith("the stack or the program no longer matches")
    assert (stdout + stderr).split("error: ")[1].splitlines()[0] in failure.message
