"""steps.sync: what runs again (triggers), failures (backoff, stall, recovery), suspend, an
invalid spec, prerequisites."""

from __future__ import annotations

import pytest
from decision_world import (
    GIT_SPEC,
    SHA1,
    SHA2,
    START,
    World,
    deployed_world,
    rfc3339,
    run_pod,
)

from pkobatch.api.constants import (
    RECONCILE_REQUEST_ANNOTATION,
)
from pkobatch.api.messages import MAX_MESSAGE_CHARS
from pkobatch.api.run import snapshot_forbidden_message
from pkobatch.config import Settings
from pkobatch.controller.decision import SourceHead


def test_spec_edit_runs_again() -> None:
    world = deployed_world()
    world.edit_spec(config={"x": "1"})
    result = world.step()
    assert result.create_job is not None
    assert "new generation" in result.events[0].message
    assert world.status["currentUpdate"]["generation"] == 2


def test_reconcile_request_annotation_runs_again_and_is_acknowledged() -> None:
    world = deployed_world()
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "2026-01-01T13:00:00Z")
    result = world.step()
    assert result.create_job is not None
    assert world.status["observedReconcileRequest"] == "2026-01-01T13:00:00Z"
    world.finish()
    world.step()
    assert world.status["lastUpdate"]["reconcileRequest"] == "2026-01-01T13:00:00Z"
    assert world.step().create_job is None


def test_new_commit_on_the_branch_runs_again() -> None:
    world = deployed_world()
    world.source = SourceHead(commit=SHA2)
    result = world.step()
    assert result.create_job is not None
    assert world.status["currentUpdate"]["commit"] == SHA2
    assert f"new commit {SHA2}" in result.events[0].message


def test_pinned_commit_abbreviation_matches_the_full_sha() -> None:
    spec = {**GIT_SPEC, "branch": None, "commit": SHA1[:7]}
    del spec["branch"]
    world = World(spec, head=None)
    world.source = None
    world.step()
    world.finish(commit=SHA1)
    world.step()
    assert world.status["lastUpdate"]["lastSuccessfulCommit"] == SHA1
    assert world.step().create_job is None


def test_stack_without_source_runs_once() -> None:
    world = World({"stack": "dev"})
    world.source = None
    world.step()
    world.finish(commit="")
    world.step()
    assert world.condition("Ready")["status"] == "True"
    assert world.step().create_job is None


def test_continue_resync_on_commit_match_reruns_after_the_period() -> None:
    world = deployed_world(
        {**GIT_SPEC, "continueResyncOnCommitMatch": True, "resyncFrequencySeconds": 10}
    )
    result = world.step()
    assert result.create_job is None
    assert result.requeue_after == pytest.approx(60)  # PKO's minimum of 60 s
    world.advance(60)
    result = world.step()
    assert result.create_job is not None
    assert "resync period elapsed" in result.events[0].message


def test_failures_back_off_10_30_90_seconds_then_stall() -> None:
    world = World()
    world.step()
    waits = []
    names = set()
    for expected_failures in range(4):
        names.add(world.current_job())
        world.finish(state="failed", reason="ProgramError", message="boom")
        result = world.step()
        assert world.status["lastUpdate"]["failures"] == expected_failures
        if expected_failures < 3:
            assert world.condition("Reconciling")["reason"] == "RetryingAfterFailure"
            assert result.create_job is None
            waits.append(result.requeue_after)
            world.advance(result.requeue_after - 1)
            assert world.step().create_job is None
            world.advance(1)
            assert world.step().create_job is not None
    assert waits == [10, 30, 90]
    assert len(names) == 4
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "UpdateFailed"
    assert "up failed 4 times" in stalled["message"] and "boom" in stalled["message"]
    assert world.condition("Ready")["reason"] == "NotReadyStalled"
    world.advance(86400 * 7)
    result = world.step()
    assert result.create_job is None and result.requeue_after is None


def test_a_failure_retrying_cannot_fix_stalls_at_once_until_something_changes() -> None:
    world = World()
    world.step()
    world.finish(state="failed", reason="InvalidSpec", message="needs pulumi-language-nodejs")
    result = world.step()
    assert result.create_job is None and result.requeue_after is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert "pulumi-language-nodejs" in stalled["message"]
    assert world.condition("Reconciling") is None
    world.advance(86400)
    assert world.step().create_job is None
    # A new commit or spec may bring what was missing: it runs again.
    world.source = SourceHead(commit=SHA2)
    assert world.step().create_job is not None
    world.finish(state="failed", reason="InvalidSpec", message="still missing")
    assert world.step().create_job is None
    world.edit_spec(config={"image": "fixed"})
    assert world.step().create_job is not None
    world.finish()
    world.step()
    assert world.condition("Ready")["status"] == "True"


def test_a_missing_permission_stalls_at_once_naming_it_until_something_changes() -> None:
    world = World()
    world.step()
    message = "the run's ServiceAccount may not create secrets in namespace team"
    world.finish(state="failed", reason="MissingPermission", message=message, inline=True)
    result = world.step()
    assert result.create_job is None and result.requeue_after is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "MissingPermission" and message in stalled["message"]
    world.advance(86400)
    assert world.step().create_job is None
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "granted")
    assert world.step().create_job is not None


def refused_snapshot(world: World, configmap_of: str | None = None) -> str:
    """The current run ends as ``pkobatch job run`` ends when its ServiceAccount may not get
    its snapshot's ConfigMap (of Job ``configmap_of``, by default its own): exit status 2,
    the ConfigMap named in the termination message."""
    name = world.current_job()
    refused = f"team/{configmap_of or name}-snapshot-0"
    pod = run_pod(world.jobs[name], snapshot_forbidden_message(refused), 2)
    pod["spec"] = {"serviceAccountName": "pko-workspace"}
    world.pods[name] = [pod]
    return world.fail_job(name)


def test_a_run_refused_its_snapshot_configmap_stalls_naming_the_right_to_grant() -> None:
    world = World()
    world.step()
    name = refused_snapshot(world)
    result = world.step()
    assert result.create_job is None and result.requeue_after is None
    last = world.status["lastUpdate"]
    assert (last["state"], last["reason"], last["failures"]) == ("failed", "MissingPermission", 0)
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "MissingPermission"
    for words in (
        "ServiceAccount pko-workspace may not get configmaps in namespace team",
        f"ConfigMap {name}-snapshot-0",
        "Grant it get on configmaps in namespace team",
        "RoleBinding",
    ):
        assert words in stalled["message"]
    world.advance(86400)
    assert world.step().create_job is None
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "granted")
    assert world.step().create_job is not None


def test_a_refusal_named_for_another_runs_snapshot_is_an_ordinary_failure() -> None:
    world = World()
    world.step()
    refused_snapshot(world, configmap_of="other-up-0123456789")
    result = world.step()
    assert world.status["lastUpdate"]["reason"] == "JobFailed"
    assert world.condition("Stalled") is None
    assert result.requeue_after is not None  # retried after the backoff


def test_fixing_the_spec_recovers_a_stalled_stack() -> None:
    world = World(settings=Settings(retry={"max_failures": 1}))
    world.step()
    world.finish(state="failed", reason="ProgramError")
    world.advance(world.step().requeue_after or 0)
    world.step()
    world.finish(state="failed", reason="ProgramError")
    world.step()
    assert world.condition("Stalled")["reason"] == "UpdateFailed"
    world.edit_spec(config={"fixed": "yes"})
    assert world.step().create_job is not None
    world.finish()
    world.step()
    assert world.condition("Ready")["status"] == "True"
    assert world.condition("Stalled") is None
    assert world.status["lastUpdate"]["failures"] == 0


def test_a_new_commit_retries_at_once_and_counts_on() -> None:
    world = World()
    world.step()
    world.finish(state="failed", reason="ProgramError")
    world.step()
    world.source = SourceHead(commit=SHA2)
    assert world.step().create_job is not None
    world.finish(state="failed", reason="ProgramError")
    world.step()
    # PKO counts failures by generation and reconcile request, not by commit.
    assert world.status["lastUpdate"]["failures"] == 1
    assert world.status["lastUpdate"]["lastAttemptedCommit"] == SHA2
    assert world.status["lastUpdate"]["lastSuccessfulCommit"] == ""


def test_a_stack_failing_on_every_commit_stalls_and_runs_each_new_commit_once() -> None:
    world = World()
    for index in range(4):
        world.source = SourceHead(commit=str(index + 1) * 40)
        assert world.step().create_job is not None
        world.finish(state="failed", reason="ProgramError", message=f"boom {index}")
        world.step()
        assert world.status["lastUpdate"]["failures"] == index
    stalled = world.condition("Stalled")
    assert stalled is not None and stalled["reason"] == "UpdateFailed"
    world.advance(86400)
    assert world.step().create_job is None
    # A new commit still gets one run (PKO's isSynced), but no retries after it fails.
    world.source = SourceHead(commit="5" * 40)
    assert world.step().create_job is not None
    world.finish(state="failed", reason="ProgramError")
    result = world.step()
    assert world.status["lastUpdate"]["failures"] == 4
    assert world.condition("Stalled")["reason"] == "UpdateFailed"
    assert result.requeue_after is None
    world.advance(86400)
    assert world.step().create_job is None


def test_backoff_is_capped_by_retry_max_backoff_duration_seconds() -> None:
    world = World({**GIT_SPEC, "retryMaxBackoffDurationSeconds": 20})
    world.step()
    world.finish(state="failed", reason="ProgramError")
    assert world.step().requeue_after == 10
    world.advance(10)
    world.step()
    world.finish(state="failed", reason="ProgramError")
    assert world.step().requeue_after == 20


def fail_and_wait(world: World) -> float | None:
    world.finish(state="failed", reason="ProgramError")
    wait = world.step().requeue_after
    world.advance(wait or 0)
    world.step()
    return wait


def test_negative_retry_max_backoff_is_ignored_as_in_pko() -> None:
    world = World({**GIT_SPEC, "retryMaxBackoffDurationSeconds": -5})
    world.step()
    assert [fail_and_wait(world) for _ in range(3)] == [10, 30, 90]


def test_a_cap_below_ten_seconds_still_waits_ten_seconds_first_as_in_pko() -> None:
    world = World({**GIT_SPEC, "retryMaxBackoffDurationSeconds": 3})
    world.step()
    assert [fail_and_wait(world) for _ in range(3)] == [10, 3, 3]


def test_retry_base_comes_from_settings() -> None:
    world = World(settings=Settings(retry={"base": "1s"}))
    world.step()
    world.finish(state="failed", reason="ProgramError")
    assert world.step().requeue_after == 1


def test_a_failure_after_success_at_the_same_generation_counts_from_one() -> None:
    world = deployed_world({**GIT_SPEC, "continueResyncOnCommitMatch": True})
    world.advance(60)
    assert world.step().create_job is not None
    world.finish(state="failed", reason="ProgramError")
    world.step()
    assert world.status["lastUpdate"]["failures"] == 1


def test_preview_stack_runs_previews_and_reports_preview_failed() -> None:
    world = World({**GIT_SPEC, "preview": True})
    result = world.step()
    assert result.create_job is not None
    assert result.create_job["metadata"]["labels"]["pkobatch.io/operation"] == "preview"
    world.finish(state="failed", reason="ProgramError")
    world.step()
    assert world.condition("Reconciling")["reason"] == "PreviewFailed"


def test_suspended_stack_starts_nothing_but_folds_a_running_job() -> None:
    world = World()
    world.step()
    world.edit_spec(suspend=True)
    world.finish()
    result = world.step()
    assert result.create_job is None
    ready = world.condition("Ready")
    assert ready["status"] == "True" and ready["reason"] == "Suspended"
    world.edit_spec(config={"x": "y"})
    assert world.step().create_job is None
    world.edit_spec(suspend=False)
    assert world.step().create_job is not None


def test_suspended_stack_whose_last_run_failed_or_never_ran_is_stalled() -> None:
    # Ready=False with neither Reconciling nor Stalled reads as Current in kstatus (Flux's
    # healthChecks) and as Progressing for ever in Argo CD: nothing runs until resumed.
    world = World({**GIT_SPEC, "suspend": True})
    world.step()
    stalled = world.condition("Stalled")
    assert stalled is not None and stalled["reason"] == "Suspended"
    assert "nothing has run yet" in stalled["message"]
    assert "spec.suspend: false" in stalled["message"]
    ready = world.condition("Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "Suspended")
    assert world.condition("Reconciling") is None

    world.edit_spec(suspend=False)
    world.step()
    world.finish(state="failed", reason="ProgramError", message="boom")
    world.edit_spec(suspend=True)
    world.step()
    stalled = world.condition("Stalled")
    assert stalled is not None and "the last up failed" in stalled["message"]

    world.edit_spec(suspend=False)
    world.step()
    world.finish()
    world.edit_spec(suspend=True)
    world.step()
    assert world.condition("Stalled") is None
    assert world.condition("Ready")["status"] == "True"


def test_invalid_spec_is_stalled_with_one_event() -> None:
    world = World({"stack": "dev", "projectRepo": "https://git.example/x.git"})
    result = world.step()
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert "spec.branch" in stalled["message"]
    assert [e.reason for e in result.events] == ["StackConfigInvalid"]
    assert world.step().events == []


INT64_MAX = 2**63 - 1


@pytest.mark.parametrize(
    "field", ["retryMaxBackoffDurationSeconds", "resyncFrequencySeconds", "timeoutSeconds"]
)
def test_an_out_of_bounds_integer_stored_before_the_crd_bound_is_spec_invalid(field: str) -> None:
    world = World({**GIT_SPEC, field: INT64_MAX})
    result = world.step()
    assert result.create_job is None and not result.error
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SpecInvalid" and f"spec.{field}" in stalled["message"]


def test_an_over_long_spec_invalid_message_is_bounded() -> None:
    cross = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "other"}}
    spec = {**GIT_SPEC, "envRefs": {f"VAR_{i:05d}": cross for i in range(3000)}}
    world = World(spec)
    result = world.step()
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert len(stalled["message"]) <= MAX_MESSAGE_CHARS
    assert "VAR_00000" in stalled["message"] and "VAR_02999" in stalled["message"]
    assert all(len(e.message) <= MAX_MESSAGE_CHARS for e in result.events)


def test_prerequisites_wait_then_run() -> None:
    world = World({**GIT_SPEC, "prerequisites": [{"name": "base"}]})
    world.prerequisites = {"base": None}
    result = world.step()
    assert result.create_job is None
    reconciling = world.condition("Reconciling")
    assert reconciling["reason"] == "PrerequisiteNotSatisfied"
    assert "base does not exist" in reconciling["message"]
    assert result.requeue_after == 30
    base = {
        "metadata": {"name": "base", "generation": 3, "annotations": {}},
        "status": {
            "lastUpdate": {
                "state": "succeeded",
                "type": "up",
                "generation": 3,
                "reconcileRequest": "",
                "name": "base-up-1",
                "lastResyncTime": rfc3339(START),
            }
        },
    }
    world.prerequisites = {"base": base}
    assert world.step().create_job is not None


def test_stale_prerequisite_is_poked() -> None:
    world = World(
        {
            **GIT_SPEC,
            "prerequisites": [{"name": "base", "requirement": {"succeededWithinDuration": "1h"}}],
        }
    )
    world.advance(7200)
    world.prerequisites = {
        "base": {
            "metadata": {"name": "base", "generation": 1, "annotations": {}},
            "status": {
                "lastUpdate": {
                    "state": "succeeded",
                    "type": "up",
                    "generation": 1,
                    "reconcileRequest": "",
                    "name": "base-up-1",
                    "lastResyncTime": rfc3339(START),
                }
            },
        }
    }
    result = world.step()
    assert result.create_job is None
    assert result.prerequisite_requests == {"base": "after-base-up-1"}
