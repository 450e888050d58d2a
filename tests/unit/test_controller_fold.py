"""pkobatch.controller.fold: outcomes of finished runs and PKO's lastUpdate bookkeeping."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pkobatch.api.constants import EVENT_CREATED, RESULT_KEY
from pkobatch.api.messages import MAX_MESSAGE_CHARS
from pkobatch.api.objects import JSON
from pkobatch.api.run import (
    Run,
    RunResult,
    StackRef,
    digest_in_message,
    result_digest,
    result_digest_line,
)
from pkobatch.api.status import OperationRequest, StatusObject
from pkobatch.api.timestamps import parse_time
from pkobatch.controller.cache_transforms import cache_result
from pkobatch.controller.fold import (
    EVENT_PLAN_SAVED,
    fold_run,
    folded_last_update,
    folded_outputs,
    metric_result,
    sanitize_output_key,
)
from pkobatch.controller.outcome import RESULT_DIGEST_KEY, Outcome, job_outcome, read_result

NOW = datetime(2026, 2, 1, 8, 0, tzinfo=UTC)
RUN = Run("up", "sync", 2, "", "c1", "after::c1")
JOB: dict[str, Any] = {
    "metadata": {"name": "app-up-1", "uid": "job-uid"},
    "spec": {"activeDeadlineSeconds": 600},
    "status": {},
}


def result(**changes: Any) -> RunResult:
    values: dict[str, Any] = {
        "operation": "up",
        "state": "succeeded",
        "reason": "Succeeded",
        "stack": StackRef(name="app", namespace="ns", uid="stack-uid"),
        "job_name": "app-up-1",
        "commit": "c1",
        **changes,
    }
    return RunResult(**values)


def configmap(run_result: RunResult | str, owner_uid: str = "job-uid") -> dict[str, Any]:
    text = run_result if isinstance(run_result, str) else run_result.to_json()
    return {
        "metadata": {
            "name": "app-up-1",
            "ownerReferences": [{"kind": "Job", "name": "app-up-1", "uid": owner_uid}],
        },
        "data": {RESULT_KEY: text},
    }


def finished(kind: str, **fields: Any) -> dict[str, Any]:
    condition = {"type": kind, "status": "True", "lastTransitionTime": "2026-02-01T07:59:00Z"}
    return {**JOB, "status": {"conditions": [{**condition, **fields}]}}


def pod(message: str | None, owner_uid: str = "job-uid", container: str = "pulumi") -> JSON:
    """A pod of the Job whose run container ended with ``message`` (None: no message)."""
    terminated: JSON = {"exitCode": 0, "reason": "Completed"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {
            "name": "app-up-1-abcde",
            "ownerReferences": [
                {"kind": "Job", "name": "app-up-1", "uid": owner_uid, "controller": True}
            ],
        },
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
        },
    }


def vouching(cm: JSON) -> list[JSON]:
    """The run's pod, having reported the digest of ``cm``'s result.json as the runner does."""
    return [pod(result_digest_line(cm["data"][RESULT_KEY]))]


def test_running_job_has_no_outcome_whatever_configmap_exists() -> None:
    assert job_outcome(JOB, None, "stack-uid", NOW) is None
    cm = configmap(result())
    assert job_outcome(JOB, cm, "stack-uid", NOW, vouching(cm)) is None


def test_a_result_the_runs_pod_vouches_for_is_folded() -> None:
    cm = configmap(result(outputs={"url": "https://app"}))
    outcome = job_outcome(finished("Complete"), cm, "stack-uid", NOW, vouching(cm))
    assert outcome is not None and outcome.succeeded and outcome.result is not None
    assert outcome.result.outputs == {"url": "https://app"}
    assert outcome.finished_at == datetime(2026, 2, 1, 7, 59, tzinfo=UTC)
    assert outcome.result_event is None
    # As the controller's cache holds it: the digest of the whole result.json beside it.
    cached = cache_result({"kind": "ConfigMap", **cm})
    assert cached[RESULT_DIGEST_KEY] == result_digest(cm["data"][RESULT_KEY])
    from_cache = job_outcome(finished("Complete"), cached, "stack-uid", NOW, vouching(cm))
    assert from_cache is not None and from_cache.succeeded


FORGED = result(outputs={"forged": "by someone else"}, permalink="https://forged.example/")


@pytest.mark.parametrize(
    ("pods", "problem"),
    [
        # The run's pod vouched for what it wrote; this is something else.
        (vouching(configmap(result())), "is not the result the pod of run app-up-1 wrote"),
        # The pod ended without vouching for anything (no message, or not a digest line).
        ([pod(None)], "reported no result digest"),
        ([pod("Error: the runner crashed")], "reported no result digest"),
        ([pod(result_digest_line(FORGED.to_json()), container="sidecar")], "no result digest"),
        # No pod of this Job is left: nothing vouches for anything (fail closed).
        ([], "is gone"),
        ([pod(result_digest_line(FORGED.to_json()), owner_uid="other-job")], "is gone"),
    ],
)
def test_a_result_its_pod_does_not_vouch_for_is_rejected_with_a_warning(
    pods: list[JSON], problem: str
) -> None:
    forged = configmap(FORGED)
    outcome = job_outcome(finished("Complete"), forged, "stack-uid", NOW, pods)
    assert outcome is not None and outcome.state == "failed" and outcome.result is None
    assert outcome.reason == "JobFailed" and problem in outcome.message
    assert "without a result the controller can trust" in outcome.message
    event = outcome.result_event
    assert event is not None and (event.type, event.reason) == ("Warning", "ResultRejected")
    assert "ConfigMap app-up-1" in event.message and problem in event.message
    # What the ConfigMap says is never repeated.
    assert "forged" not in event.message + outcome.message
    folded = fold_run({}, [], RUN, "app-up-1", outcome, now=NOW, generation=2)
    assert ("Warning", "ResultRejected") in [(e.type, e.reason) for e in folded.events]
    assert folded.status["lastUpdate"]["state"] == "failed"
    assert "outputs" not in folded.status and folded.status["lastUpdate"]["permalink"] == ""


@pytest.mark.parametrize(
    ("cm", "problem"),
    [
        (configmap(result(), owner_uid="other"), "not owned by Job"),
        (configmap("{not json"), "not a result this controller understands"),
        (configmap(result().to_json().replace("run-result/v1", "run-result/v9")), "runner image"),
        (configmap(result(job_name="app-up-2")), "written for another run"),
        (configmap(result(stack=StackRef(name="app", namespace="ns", uid="x"))), "another run"),
    ],
)
def test_results_that_are_not_this_runs_are_rejected(cm: dict[str, Any], problem: str) -> None:
    found, message = read_result(cm, JOB, "stack-uid")
    assert found is None and problem in message
    outcome = job_outcome(finished("Complete"), cm, "stack-uid", NOW, vouching(cm))
    assert outcome is not None and outcome.state == "failed" and problem in outcome.message
    assert outcome.result_event is not None and outcome.result_event.reason == "ResultRejected"


def test_an_unowned_result_counts_only_if_written_after_the_job_was_created() -> None:
    job = {**finished("Complete"), "metadata": {**JOB["metadata"]}}
    job["metadata"]["creationTimestamp"] = "2026-02-01T07:50:00Z"
    unowned = configmap(result())
    del unowned["metadata"]["ownerReferences"]
    unowned["metadata"]["creationTimestamp"] = "2026-02-01T07:58:00Z"
    found, problem = read_result(unowned, job, "stack-uid")
    assert found is not None and problem == ""
    # A left-over of an earlier Job of the same name is older than this Job.
    unowned["metadata"]["creationTimestamp"] = "2026-02-01T07:49:59Z"
    found, problem = read_result(unowned, job, "stack-uid")
    assert found is None and "not owned by Job" in problem


def test_failed_result_keeps_the_runners_reason() -> None:
    cm = configmap(result(state="failed", reason="UpdateConflict", message="locked"))
    failed = finished("Failed", reason="BackoffLimitExceeded")
    outcome = job_outcome(failed, cm, "stack-uid", NOW, vouching(cm))
    assert outcome is not None
    assert (outcome.reason, outcome.message) == ("UpdateConflict", "locked")
    assert metric_result(outcome) == "conflict"


def test_a_success_counts_only_from_a_job_that_completed() -> None:
    # Even vouched for by its pod: the runner exits non-zero after a failure, so a Job that
    # failed did not succeed (here the Job controller's deadline came first).
    cm = configmap(result())
    failed = finished("Failed", reason="DeadlineExceeded")
    outcome = job_outcome(failed, cm, "stack-uid", NOW, vouching(cm))
    assert outcome is not None and outcome.state == "failed" and outcome.result is None
    assert outcome.reason == "DeadlineExceeded"
    assert "its result says the operation succeeded, but Job app-up-1 failed" in outcome.message
    destroy = configmap(result(operation="destroy"))
    crashed = finished("Failed", reason="BackoffLimitExceeded", message="exit code 3")
    outcome = job_outcome(crashed, destroy, "stack-uid", NOW, vouching(destroy))
    assert outcome is not None and not outcome.succeeded and outcome.reason == "JobFailed"


def test_a_result_deleted_before_folding_is_reported_and_the_run_failed() -> None:
    cm = configmap(result())
    outcome = job_outcome(finished("Complete"), None, "stack-uid", NOW, vouching(cm))
    assert outcome is not None and outcome.state == "failed"
    assert "deleted before the controller folded it" in outcome.message
    event = outcome.result_event
    assert event is not None and (event.type, event.reason) == ("Warning", "ResultDeleted")
    # A run that wrote nothing says so, without an Event.
    silent = job_outcome(finished("Complete"), None, "stack-uid", NOW, [pod(None)])
    assert silent is not None and silent.result_event is None
    assert "completed without writing its result ConfigMap" in silent.message


def test_the_digest_line_is_read_back_exactly() -> None:
    line = result_digest_line('{"a": 1}')
    assert digest_in_message(line) == result_digest('{"a": 1}')
    assert result_digest('{"a": 1}').startswith("sha256:")
    assert digest_in_message(f"log line\n{line}") == ""
    assert digest_in_message("sha256:" + "0" * 64) == ""


def test_deadline_and_disruption_are_told_apart() -> None:
    deadline = job_outcome(finished("Failed", reason="DeadlineExceeded"), None, "u", NOW)
    assert deadline is not None and deadline.reason == "DeadlineExceeded"
    assert "600s" in deadline.message and metric_result(deadline) == "timeout"
    evicted = job_outcome(
        finished(
            "Failed",
            reason="PodFailurePolicy",
            message="Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0",
        ),
        None,
        "u",
        NOW,
    )
    assert evicted is not None and evicted.reason == "Interrupted"
    crashed = job_outcome(
        finished("Failed", reason="PodFailurePolicy", message="Container pulumi exit code 137"),
        None,
        "u",
        NOW,
    )
    assert crashed is not None and crashed.reason == "JobFailed"


def outcome(state: str = "succeeded", **changes: Any) -> Outcome:
    run_result = result(
        state=state, reason="Succeeded" if state == "succeeded" else "ProgramError", **changes
    )
    return Outcome(run_result.state, run_result.reason, run_result.message, NOW, run_result)


def test_first_failure_of_a_spec_counts_zero_and_repeats_count_up() -> None:
    first = folded_last_update(None, RUN, "j1", outcome("failed"))
    assert first["failures"] == 0 and first["state"] == "failed"
    second = folded_last_update(first, RUN, "j2", outcome("failed"))
    assert second["failures"] == 1
    other_generation = folded_last_update(
        second, Run("up", "sync", 3, "", "c1", "t"), "j3", outcome("failed")
    )
    assert other_generation["failures"] == 0
    # PKO counts by generation and reconcile request only: a new commit counts on.
    other_commit = folded_last_update(second, RUN, "j4", outcome("failed", commit="c2"))
    assert other_commit["failures"] == 2
    assert other_commit["lastAttemptedCommit"] == "c2"


def test_last_update_message_is_bounded() -> None:
    folded = folded_last_update(None, RUN, "j1", outcome("failed", message="x" * 100_000))
    assert len(folded["message"]) <= MAX_MESSAGE_CHARS


def test_success_resets_and_records_the_commit() -> None:
    failed = folded_last_update(None, RUN, "j1", outcome("failed"))
    ok = folded_last_update(failed, RUN, "j2", outcome(permalink="https://app.pulumi.com/x"))
    assert ok == {
        "generation": 2,
        "reconcileRequest": "",
        "name": "j2",
        "type": "up",
        "state": "succeeded",
        "message": "",
        "lastAttemptedCommit": "c1",
        "lastSuccessfulCommit": "c1",
        "permalink": "https://app.pulumi.com/x",
        "lastResyncTime": "2026-02-01T08:00:00Z",
        "failures": 0,
        "reason": "Succeeded",
    }
    after = folded_last_update(ok, RUN, "j3", outcome("failed", commit="c1"))
    assert after["failures"] == 1 and after["lastSuccessfulCommit"] == "c1"
    assert after["reason"] == "ProgramError"


def test_outputs_follow_up_and_destroy_only() -> None:
    previous = {"old": 1}
    up = outcome(outputs={"a/b": 1, "pw": "x"}, secret_outputs=["pw"])
    assert folded_outputs(previous, RUN, up) == {"a_b": 1, "pw": "[secret]"}
    preview = Run("preview", "sync", 2, "", "c1", "t")
    assert folded_outputs(previous, preview, up) == previous
    assert folded_outputs(previous, RUN, outcome("failed")) == previous
    destroy = Run("destroy", "sync", 2, "", "c1", "t")
    assert folded_outputs(previous, destroy, outcome(operation="destroy")) == {}


def test_helpers() -> None:
    assert sanitize_output_key("my key:x") == "my_key_x"
    assert parse_time("2026-02-01T08:00:00Z") == NOW
    assert parse_time("garbage") is None


def test_fold_run_records_a_drift_check_without_touching_last_update() -> None:
    check = Run("refresh", "drift", 2, "", "c1", "drift:2026-02-01T07:00:00Z")
    status: StatusObject = {
        "currentUpdate": {"name": "app-refresh-1"},
        "lastUpdate": {"name": "app-up-1", "state": "succeeded"},
    }
    folded = fold_run(
        status,
        [],
        check,
        "app-refresh-1",
        outcome(operation="refresh", drifted_resources=2),
        now=NOW,
        generation=2,
    )
    assert "currentUpdate" not in folded.status and "currentUpdate" in status
    assert folded.status["lastUpdate"] == status["lastUpdate"]
    drift = folded.status["lastDriftCheck"]
    assert (drift["scheduledTime"], drift["driftedResources"]) == ("2026-02-01T07:00:00Z", 2)
    assert [(c.type, c.status, c.reason) for c in folded.conditions] == [
        ("Drifted", "True", "DriftDetected")
    ]
    assert [e.reason for e in folded.events] == ["DriftDetected", EVENT_CREATED]


def test_fold_run_answers_only_the_request_that_started_the_run() -> None:
    run = Run("refresh", "request", 2, "", "c1", "request:refresh:t1", request="refresh:t1")
    mine: OperationRequest = {"request": "refresh:t1", "state": "Running", "jobName": "j"}
    answered = fold_run({"operationRequest": mine}, [], run, "j", outcome(), now=NOW, generation=2)
    assert answered.status["operationRequest"]["state"] == "Succeeded"
    newer: OperationRequest = {"request": "up:t2", "state": "Pending"}
    kept = fold_run({"operationRequest": newer}, [], run, "j", outcome(), now=NOW, generation=2)
    assert kept.status["operationRequest"] == newer


def test_fold_run_records_a_saved_plan_and_says_it_awaits_approval() -> None:
    preview = Run("preview", "approval", 2, "", "c1", "target1:0#new commit c1")
    folded = fold_run(
        {"approval": {"state": "Previewing", "target": "target1", "trigger": "new commit c1"}},
        [],
        preview,
        "app-preview-1",
        outcome(operation="preview", plan_id="plan-1", changes={"create": 2, "same": 1}),
        now=NOW,
        generation=2,
    )
    record = folded.status["approval"]
    assert (record["state"], record["planID"], record["summary"]) == (
        "Pending",
        "plan-1",
        "2 to create",
    )
    assert (record["trigger"], record["previewJob"]) == ("new commit c1", "app-preview-1")
    assert [(e.reason, e.message) for e in folded.events] == [
        (EVENT_PLAN_SAVED, "plan plan-1 awaits approval: 2 to create"),
        (EVENT_CREATED, "preview app-preview-1 succeeded"),
    ]
    assert "lastUpdate" not in folded.status


def test_fold_run_records_whether_the_update_applied_its_plan() -> None:
    apply = Run("up", "sync", 2, "", "c1", "approved:plan-1", plan="plan-1")
    pending = {"state": "Approved", "planID": "plan-1", "previewJob": "app-preview-1"}
    applied = fold_run(
        {"approval": pending}, [], apply, "app-up-1", outcome(), now=NOW, generation=2
    )
    assert applied.status["approval"]["state"] == "Applied"
    assert applied.status["lastUpdate"]["state"] == "succeeded"
    failed = fold_run(
        {"approval": pending}, [], apply, "app-up-1", outcome("failed"), now=NOW, generation=2
    )
    assert failed.status["approval"]["state"] == "Failed"
    other = fold_run(
        {"approval": {**pending, "planID": "plan-2"}},
        [],
        apply,
        "app-up-1",
        outcome(),
        now=NOW,
        generation=2,
    )
    assert other.status["approval"]["planID"] == "plan-2"
    assert other.status["approval"]["state"] == "Approved"


@pytest.mark.parametrize(
    ("reason", "failed_step", "event_reason"),
    [
        ("ProgramError", None, "StackUpdateFailure"),
        ("UpdateConflict", None, "StackUpdateConflictDetected"),
        # A conflict is reported as one whatever step met it.
        ("UpdateConflict", "stackInitialization", "StackUpdateConflictDetected"),
        ("SourceUnavailable", "gitAuthentication", "StackGitAuthenticationFailure"),
        ("SourceUnavailable", None, "StackUpdateFailure"),
        ("InvalidAccessToken", "stackInitialization", "StackInitializationFailure"),
        ("StackNotFound", "stackInitialization", "StackInitializationFailure"),
        ("ProgramError", "outputRetrieval", "StackOutputRetrievalFailure"),
    ],
)
def test_a_failed_run_is_reported_with_the_event_reason_pko_gives_the_same_failure(
    reason: str, failed_step: str | None, event_reason: str
) -> None:
    failed = result(state="failed", reason=reason, failed_step=failed_step, message="boom")
    folded = fold_run(
        {},
        [],
        RUN,
        "app-up-1",
        Outcome("failed", reason, "boom", NOW, failed),
        now=NOW,
        generation=2,
    )
    assert [(e.type, e.reason, e.message) for e in folded.events] == [
        ("Warning", event_reason, "up app-up-1 failed: boom")
    ]


def test_a_failure_without_a_result_is_an_update_failure() -> None:
    lost = Outcome("failed", "JobFailed", "its pod was lost", NOW)
    folded = fold_run({}, [], RUN, "app-up-1", lost, now=NOW, generation=2)
    assert [e.reason for e in folded.events] == ["StackUpdateFailure"]


def test_the_result_keeps_the_step_a_run_stopped_at() -> None:
    failed = result(state="failed", reason="SourceUnavailable", failed_step="gitAuthentication")
    assert '"failedStep":"gitAuthentication"' in failed.to_json()
    assert RunResult.model_validate_json(failed.to_json()).failed_step == "gitAuthentication"
    assert "failedStep" not in result().to_json()
