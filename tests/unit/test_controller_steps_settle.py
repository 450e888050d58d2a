"""steps.settle: the current run folded (a result its pod vouches for, a failure without
one, a vanished Job), an orphaned Job adopted, a run that has not started superseded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from decision_world import (
    GIT_SPEC,
    SHA1,
    START,
    World,
    rfc3339,
)

from pkobatch.api.constants import (
    RESULT_KEY,
    RESULT_LABEL,
    STACK_LABEL,
)
from pkobatch.controller.outcome import pod_status_matters
from pkobatch.controller.pod_causes import POD_START_LIMIT


def test_success_folds_into_last_update_outputs_and_ready() -> None:
    world = World()
    world.step()
    name = world.finish(
        outputs={"url": "http://x", "db-pass": "hunter2", "a b": 1}, secret_outputs=["db-pass"]
    )
    result = world.step()
    last = world.status["lastUpdate"]
    assert last["name"] == name
    assert last["type"] == "up"
    assert last["state"] == "succeeded"
    assert last["failures"] == 0
    assert last["lastAttemptedCommit"] == last["lastSuccessfulCommit"] == SHA1
    assert last["lastResyncTime"] == rfc3339(START)
    assert world.status["outputs"] == {"url": "http://x", "db-pass": "[secret]", "a_b": 1}
    assert world.status["projectInfo"] == {"name": "app", "runtime": "python"}
    assert "currentUpdate" not in world.status
    ready = world.condition("Ready")
    assert ready["status"] == "True" and ready["reason"] == "ProcessingCompleted"
    assert world.condition("Reconciling") is None
    assert [e.reason for e in result.events] == ["StackCreated"]
    assert result.finished[0].outcome.succeeded


def test_secret_outputs_are_masked_even_if_the_runner_forgot() -> None:
    world = World()
    world.step()
    world.finish(outputs={"token": "s3cr3t-value"}, secret_outputs=["token"])
    world.step()
    assert "s3cr3t-value" not in json.dumps(world.stack)


def test_deleted_job_becomes_an_interrupted_failure_and_a_retry() -> None:
    world = World()
    world.step()
    name = world.current_job()
    del world.jobs[name]
    result = world.step()
    last = world.status["lastUpdate"]
    assert last["state"] == "failed" and last["name"] == name
    assert "disappeared" in last["message"]
    assert result.finished[0].outcome.reason == "Interrupted"
    assert "currentUpdate" not in world.status
    assert world.condition("Reconciling")["reason"] == "RetryingAfterFailure"
    world.advance(10)
    assert world.step().create_job is not None


@pytest.mark.parametrize(
    ("reason", "message", "expected_reason", "expected_text"),
    [
        (
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
            "DeadlineExceeded",
            "deadline of 3600s",
        ),
        (
            "PodFailurePolicy",
            "Pod team/x has condition DisruptionTarget matching FailJob rule at index 0",
            "Interrupted",
            "interrupted",
        ),
        (
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
            "JobFailed",
            "without a result",
        ),
    ],
)
def test_job_failure_without_result_has_a_reason(
    reason: str, message: str, expected_reason: str, expected_text: str
) -> None:
    world = World()
    world.step()
    world.fail_job(reason=reason, message=message)
    result = world.step()
    assert result.finished[0].outcome.reason == expected_reason
    assert expected_text in world.status["lastUpdate"]["message"]
    assert world.status["lastUpdate"]["state"] == "failed"


SA_MISSING = (
    'Error creating: pods "app-up-x" is forbidden: error looking up service account '
    'team/deployer: serviceaccount "deployer" not found'
)


def test_a_job_that_cannot_create_its_pod_fails_within_seconds_with_the_servers_words() -> None:
    world = World({**GIT_SPEC, "serviceAccountName": "deployer"})
    assert world.step().create_job is not None
    name = world.current_job()
    world.jobs[name]["metadata"]["creationTimestamp"] = rfc3339(world.now)
    world.advance(3)
    assert world.step().requeue_after == 7  # look for FailedCreate once the grace is over
    world.advance(7)
    assert world.step().requeue_after == 20  # none recorded yet: look again later
    world.pod_creation_failures = {name: SA_MISSING}
    result = world.step()
    last = world.status["lastUpdate"]
    assert last["state"] == "failed" and last["name"] == name
    assert 'serviceaccount "deployer" not found' in last["message"]
    assert "spec.serviceAccountName" in last["message"]
    assert [d.name for d in result.delete_jobs] == [name]
    assert name not in world.jobs
    assert world.condition("Reconciling")["reason"] == "RetryingAfterFailure"
    assert result.requeue_after == 10
    assert [e.reason for e in result.events] == ["StackUpdateFailure"]


def test_a_pod_refused_by_pod_security_admission_names_the_security_profile() -> None:
    world = World({**GIT_SPEC, "workspaceTemplate": {"spec": {"securityProfile": "baseline"}}})
    world.step()
    name = world.current_job()
    world.jobs[name]["metadata"]["creationTimestamp"] = rfc3339(world.now)
    world.advance(10)
    world.pod_creation_failures = {
        name: f'Error creating: pods "{name}-x" is forbidden: violates PodSecurity '
        '"restricted:latest": runAsNonRoot != true (pod or container "pulumi" must set '
        "securityContext.runAsNonRoot=true)"
    }
    world.step()
    message = world.status["lastUpdate"]["message"]
    assert 'violates PodSecurity "restricted:latest": runAsNonRoot != true' in message
    assert "spec.workspaceTemplate.spec.securityProfile restricted" in message
    assert "ServiceAccount" not in message and "ResourceQuota" not in message
    assert message.endswith("the run is retried with the normal backoff")


def test_a_job_whose_pod_exists_is_never_failed_for_pod_creation() -> None:
    world = World()
    world.step()
    name = world.current_job()
    world.jobs[name]["status"].update(active=1, ready=1)
    world.pod_creation_failures = {name: "Error creating: quota exceeded (an earlier attempt)"}
    world.advance(600)
    result = world.step()
    assert "lastUpdate" not in world.status and not result.delete_jobs
    assert result.requeue_after is None


def test_a_run_whose_pod_cannot_pull_its_image_fails_after_the_limit() -> None:
    world = World()
    world.step()
    name = world.current_job()
    world.jobs[name]["status"]["active"] = 1
    world.advance(60)
    # Not ready: the controller looks again when the pod may have been stuck long enough.
    assert world.step().requeue_after == pytest.approx(POD_START_LIMIT.total_seconds() - 60, abs=5)
    world.advance(POD_START_LIMIT.total_seconds())
    world.run_pods = {
        name: [
            {
                "metadata": {"name": f"{name}-abcde", "creationTimestamp": rfc3339(START)},
                "spec": {"containers": [{"name": "pulumi", "image": "runner:nope"}]},
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": "pulumi",
                            "image": "runner:nope",
                            "state": {
                                "waiting": {
                                    "reason": "ImagePullBackOff",
                                    "message": 'Back-off pulling image "runner:nope"',
                                }
                            },
                        }
                    ],
                },
            }
        ]
    }
    result = world.step()
    assert [d.name for d in result.delete_jobs] == [name]
    update = world.status["lastUpdate"]
    assert update["state"] == "failed" and "cannot be pulled (ImagePullBackOff" in update["message"]
    warnings = [e for e in result.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["StackUpdateFailure"]
    assert "runner:nope" in warnings[0].message
    assert world.condition("Reconciling")["reason"] == "RetryingAfterFailure"


def test_a_result_sent_in_the_termination_message_is_folded_and_kept_in_its_config_map() -> None:
    world = World()
    world.step()
    name = world.finish(inline=True, outputs={"url": "https://app.example"})
    result = world.step()
    last = world.status["lastUpdate"]
    assert (last["name"], last["state"]) == (name, "succeeded")
    assert world.status["outputs"] == {"url": "https://app.example"}
    assert world.condition("Ready")["status"] == "True"
    [configmap] = result.create_results
    job = world.jobs[name]
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert configmap["metadata"]["labels"][STACK_LABEL] == "app"
    assert configmap["metadata"]["labels"][RESULT_LABEL] == "succeeded"
    assert json.loads(configmap["data"][RESULT_KEY])["outputs"] == {"url": "https://app.example"}
    # Folded once: no second run, no second ConfigMap.
    result = world.step()
    assert result.create_job is None and not result.create_results


def test_a_damaged_inline_result_is_no_result() -> None:
    world = World()
    world.step()
    name = world.finish(inline=True)
    pod = world.pods[name][0]
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = (
        "pkobatch.io/result/v1 gz:bm90IGd6aXA="
    )
    result = world.step()
    assert world.status["lastUpdate"]["state"] == "failed" and not result.create_results


def test_completed_job_without_result_is_a_failure() -> None:
    world = World()
    world.step()
    name = world.current_job()
    world.jobs[name]["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    world.step()
    assert "without writing its result" in world.status["lastUpdate"]["message"]


def test_result_not_owned_by_the_job_is_ignored() -> None:
    world = World()
    world.step()
    name = world.finish(outputs={"planted": "x"})
    world.results[name]["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    world.step()
    assert world.status["lastUpdate"]["state"] == "failed"
    assert "not owned by Job" in world.status["lastUpdate"]["message"]
    assert "outputs" not in world.status


def test_running_job_without_current_update_is_adopted() -> None:
    world = World()
    world.step()
    name = world.current_job()
    del world.stack["status"]["currentUpdate"]  # the status write was lost
    result = world.step()
    assert result.create_job is None
    assert world.current_job() == name


def test_an_adopted_job_gets_its_inputs_again() -> None:
    # The controller may have stopped between creating the Job and its run Secret: adopting
    # the Job asks for its inputs again (AlreadyExists when they are there).
    world = World(spec={**GIT_SPEC, "secrets": {"password": "inline-value"}})
    first = world.step()
    name = world.current_job()
    assert first.inputs_job == name
    assert [i["metadata"]["name"] for i in first.create_inputs] == [f"{name}-secrets"]
    del world.stack["status"]["currentUpdate"]  # the status write was lost
    adopted = world.step()
    assert adopted.create_job is None and world.current_job() == name
    assert adopted.inputs_job == name and adopted.create_inputs == first.create_inputs
    # Once adopted, nothing more is created.
    assert world.step().create_inputs == ()


def waiting_pod(name: str, reason: str) -> dict[str, Any]:
    """A run's pod whose ``pulumi`` container has not started, for ``reason``."""
    return {
        "metadata": {"name": f"{name}-abcde", "creationTimestamp": rfc3339(START)},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "pulumi", "state": {"waiting": {"reason": reason, "message": "x"}}}
            ],
        },
    }


@pytest.mark.parametrize(
    "pods",
    [
        [],
        [waiting_pod("app", "ContainerCreating")],
        [waiting_pod("app", "CreateContainerConfigError")],
        [waiting_pod("app", "ImagePullBackOff")],
    ],
    ids=["no pod yet", "pending", "missing Secret", "image pull failure"],
)
def test_a_spec_change_replaces_a_run_that_has_not_started(pods: list[dict[str, Any]]) -> None:
    world = World()
    world.step()
    first = world.current_job()
    world.jobs[first]["status"]["active"] = 1 if pods else 0
    # The observer reads a young Job's pods only once a spec change supersedes it.
    assert not pod_status_matters(world.jobs[first], world.now, 1)
    world.edit_spec(config={"x": "1"})
    assert pod_status_matters(world.jobs[first], world.now, 2)
    world.run_pods = {first: pods}
    result = world.step()
    assert [(d.name, d.foreground) for d in result.delete_jobs] == [(first, True)]
    last = world.status["lastUpdate"]
    assert (last["name"], last["state"], last["reason"]) == (first, "failed", "Superseded")
    assert "currentUpdate" not in world.status
    # Its pod may still be stopping: the new run waits until the Job is gone.
    assert result.create_job is None
    assert "waiting for run" in world.condition("Reconciling")["message"]
    world.run_pods = {}
    assert world.step().create_job is None
    world.jobs.pop(first)
    result = world.step()
    assert result.create_job is not None
    assert world.status["currentUpdate"]["generation"] == 2


def test_a_spec_change_leaves_a_started_run_to_finish() -> None:
    world = World()
    world.step()
    first = world.current_job()
    world.jobs[first]["status"]["active"] = 1
    world.edit_spec(config={"x": "1"})
    running = waiting_pod(first, "")
    running["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "pulumi", "state": {"running": {}}}],
    }
    world.run_pods = {first: [running]}
    result = world.step()
    assert not result.delete_jobs and result.create_job is None
    assert world.current_job() == first and "lastUpdate" not in world.status


def test_a_started_pulumi_container_counts_even_before_the_job_reports_it_ready() -> None:
    world = World()
    world.step()
    first = world.current_job()
    world.jobs[first]["status"]["active"] = 1
    world.edit_spec(config={"x": "1"})
    restarted = waiting_pod(first, "CrashLoopBackOff")
    restarted["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1}}
    world.run_pods = {first: [restarted]}
    result = world.step()
    assert not result.delete_jobs and world.current_job() == first


def test_a_run_without_a_spec_change_is_not_replaced() -> None:
    world = World()
    world.step()
    first = world.current_job()
    world.jobs[first]["status"]["active"] = 1
    world.run_pods = {first: [waiting_pod(first, "CreateContainerConfigError")]}
    world.advance(60)
    result = world.step()
    assert not result.delete_jobs and world.current_job() == first


def test_a_result_is_folded_only_once_the_job_controller_marks_the_job_finished() -> None:
    world = World()
    world.step()
    name = world.finish(outputs={"k": "v"})
    world.jobs[name]["status"].pop("conditions")  # the Job controller lags behind
    result = world.step()
    assert result.finished == [] and world.status["currentUpdate"]["name"] == name
    assert world.condition("Reconciling")["reason"] == "StackProcessing"
    assert "outputs" not in world.status
    # Nothing new starts meanwhile either.
    world.edit_spec(config={"x": "1"})
    assert world.step().create_job is None
    world.jobs[name]["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    result = world.step()
    assert world.status["lastUpdate"]["name"] == name
    assert world.status["outputs"] == {"k": "v"}
    assert len(result.finished) == 1 and result.create_job is not None
