"""pkobatch.controller.plan: the reconcile decision, driven through whole Stack lifecycles.

``World`` plays the part of the API server, the Job controller and the kubelet: it applies
each plan (status, finalizer, created and deleted Jobs) and lets a test finish Jobs with or
without a result — the run's pod vouching for it in its termination message, as the runner
has it do. It observes as the controller's observer does: the pods of the current run once
it has finished. Everything is pure and in memory; time moves only when a test says so.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    FINALIZER,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    RESULT_KEY,
    RESULT_LABEL,
    STACK_LABEL,
)
from pkobatch.api.messages import MAX_MESSAGE_CHARS
from pkobatch.api.run import ProjectInfo, RunResult, StackRef, result_digest_line
from pkobatch.config import Settings
from pkobatch.controller.fold import POD_START_LIMIT, pod_status_matters
from pkobatch.controller.jobs import Run, builtin_template
from pkobatch.controller.plan import Observed, Plan, SourceHead, SourceObject, plan
from pkobatch.runner.result import fitted_result_message, result_config_map, result_labels

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SHA1 = "1" * 40
SHA2 = "2" * 40
GIT_SPEC: dict[str, Any] = {
    "stack": "dev",
    "projectRepo": "https://git.example/app.git",
    "branch": "main",
}


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class World:
    """One Stack and its Jobs, with a clock."""

    def __init__(
        self,
        spec: dict[str, Any] | None = None,
        *,
        settings: Settings | None = None,
        head: str | None = SHA1,
        finalizer: bool = True,
    ) -> None:
        self.now = START
        self.settings = settings or Settings()
        self.stack: dict[str, Any] = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {
                "name": "app",
                "namespace": "team",
                "uid": "stack-uid",
                "generation": 1,
                "creationTimestamp": rfc3339(START),
                "annotations": {},
                "finalizers": [FINALIZER] if finalizer else [],
            },
            "spec": copy.deepcopy(spec if spec is not None else GIT_SPEC),
        }
        self.jobs: dict[str, dict[str, Any]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.source: SourceHead | None = SourceHead(commit=head)
        self.source_object: SourceObject | None = None
        self.prerequisites: dict[str, dict[str, Any] | None] = {}
        self.prerequisite_graph: dict[str, list[str]] = {}
        self.slot_available = True
        self.namespace_terminating = False
        self.pod_creation_failures: dict[str, str] = {}
        # Pods a test puts before the planner; the others are observed from ``pods``.
        self.run_pods: dict[str, list[dict[str, Any]]] = {}
        # Job name -> the pods the Job controller and the kubelet left of it.
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.counter = 0

    # -- observing and applying ------------------------------------------------------------

    @property
    def status(self) -> dict[str, Any]:
        return self.stack.setdefault("status", {})

    def condition(self, condition_type: str) -> dict[str, Any] | None:
        return next(
            (c for c in self.status.get("conditions", []) if c["type"] == condition_type), None
        )

    def observed_objects(self) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        """The Stack, its Jobs and results as the planner is given them (copies)."""
        return (
            copy.deepcopy(self.stack),
            [copy.deepcopy(j) for j in self.jobs.values()],
            copy.deepcopy(self.results),
        )

    def observed_pods(self) -> dict[str, list[dict[str, Any]]]:
        """As the observer reads them: the current run's pods, once its Job has finished."""
        run_pods = copy.deepcopy(self.run_pods)
        current = str((self.status.get("currentUpdate") or {}).get("name") or "")
        job = self.jobs.get(current)
        if job is not None and _conditions(job) and current not in run_pods:
            run_pods[current] = copy.deepcopy(self.pods.get(current, []))
        return run_pods

    def plan(self) -> Plan:
        stack, jobs, results = self.observed_objects()
        observed = Observed(
            stack=stack,
            jobs=jobs,
            results=results,
            now=self.now,
            source=self.source,
            source_object=self.source_object,
            prerequisites=self.prerequisites,
            prerequisite_graph=self.prerequisite_graph,
            namespace_terminating=self.namespace_terminating,
            slot_available=self.slot_available,
            pod_creation_failures=self.pod_creation_failures,
            run_pods=self.observed_pods(),
        )
        return plan(observed, self.settings, builtin_template())

    def step(self) -> Plan:
        result = self.plan()
        if result.status is not None:
            self.stack["status"] = copy.deepcopy(result.status)
        meta = self.stack["metadata"]
        if result.finalizer == "add":
            meta["finalizers"] = [*meta.get("finalizers", []), FINALIZER]
        elif result.finalizer == "remove":
            meta["finalizers"] = [f for f in meta["finalizers"] if f != FINALIZER]
        for deletion in result.delete_jobs:
            if deletion.foreground:
                self.jobs[deletion.name]["metadata"]["deletionTimestamp"] = rfc3339(self.now)
            else:
                self.jobs.pop(deletion.name, None)
        for name in result.delete_results:
            self.results.pop(name, None)
        for configmap in result.create_results:
            self.results.setdefault(configmap["metadata"]["name"], copy.deepcopy(configmap))
        if result.create_job is not None:
            job = copy.deepcopy(result.create_job)
            name = job["metadata"]["name"]
            assert name not in self.jobs, f"{name} created twice"
            self.counter += 1
            job["metadata"]["uid"] = f"job-uid-{self.counter}"
            job["metadata"]["creationTimestamp"] = rfc3339(
                self.now + timedelta(seconds=self.counter)
            )
            job["status"] = {"startTime": rfc3339(self.now)}
            self.jobs[name] = job
        return result

    def settle(self, limit: int = 5) -> Plan:
        """Step until a plan changes nothing more (no Job, no finalizer change)."""
        for _ in range(limit):
            before = copy.deepcopy(self.stack)
            result = self.step()
            if result.create_job is None and self.stack == before:
                return result
        raise AssertionError("the plan does not converge")

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def edit_spec(self, **changes: Any) -> None:
        self.stack["spec"].update(changes)
        self.stack["metadata"]["generation"] += 1

    def annotate(self, key: str, value: str) -> None:
        self.stack["metadata"]["annotations"][key] = value

    # -- the Job controller and the runner ---------------------------------------------------

    def current_job(self) -> str:
        name = self.status["currentUpdate"]["name"]
        assert isinstance(name, str)
        return name

    def active_jobs(self) -> list[str]:
        return [n for n, j in self.jobs.items() if not _conditions(j)]

    def finish(
        self,
        name: str | None = None,
        *,
        state: str = "succeeded",
        reason: str = "Succeeded",
        message: str = "",
        outputs: dict[str, Any] | None = None,
        secret_outputs: list[str] | None = None,
        drifted: int | None = None,
        commit: str | None = None,
        inline: bool = False,
        **fields: Any,
    ) -> str:
        """The run ends: its result written and vouched for by its pod (``fields``: more
        of the result's) — or, ``inline``, sent in its pod's termination message because
        the run may not write it — its Job finished."""
        name = name or self.current_job()
        job = self.jobs[name]
        run = Run.from_job(job)
        assert run is not None
        result = RunResult(
            operation=run.operation,
            drift_check=run.kind == "drift",
            state=state,  # type: ignore[arg-type]
            reason=reason,  # type: ignore[arg-type]
            message=message,
            stack=StackRef(name="app", namespace="team", uid="stack-uid"),
            job_name=name,
            generation=run.generation,
            reconcile_request=run.reconcile_request,
            commit=commit if commit is not None else run.commit,
            start_time=self.now,
            end_time=self.now,
            outputs=outputs or {},
            secret_outputs=secret_outputs or [],
            drifted_resources=drifted,
            project_info=ProjectInfo(name="app", runtime="python"),
            **fields,
        )
        # As the runner writes it, with the creation time the API server adds.
        configmap = result_config_map(
            result,
            name=name,
            namespace="team",
            labels=result_labels(job["metadata"].get("labels") or {}, "app", run.operation),
            job_uid=job["metadata"]["uid"],
        )
        configmap["metadata"]["creationTimestamp"] = rfc3339(self.now)
        if inline:
            vouched = fitted_result_message(result)
        else:
            self.results[name] = configmap
            vouched = result_digest_line(configmap["data"][RESULT_KEY])
        self.pods[name] = [run_pod(job, vouched, 0 if state == "succeeded" else 1)]
        kind = "Complete" if state == "succeeded" else "Failed"
        job["status"]["conditions"] = [
            {"type": kind, "status": "True", "lastTransitionTime": rfc3339(self.now)}
        ]
        return name

    def fail_job(
        self, name: str | None = None, reason: str = "BackoffLimitExceeded", message: str = ""
    ) -> str:
        name = name or self.current_job()
        self.pods.setdefault(name, [run_pod(self.jobs[name], None, 1)])
        self.jobs[name]["status"]["conditions"] = [
            {
                "type": "Failed",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": rfc3339(self.now),
            }
        ]
        return name


def run_pod(job: dict[str, Any], message: str | None, exit_code: int) -> dict[str, Any]:
    """The pod of ``job`` once its run container ended with ``message`` (None: none)."""
    name = job["metadata"]["name"]
    terminated: dict[str, Any] = {"exitCode": exit_code}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {
            "name": f"{name}-pod",
            "ownerReferences": [
                {"kind": "Job", "name": name, "uid": job["metadata"]["uid"], "controller": True}
            ],
        },
        "status": {"containerStatuses": [{"name": "pulumi", "state": {"terminated": terminated}}]},
    }


def _conditions(job: dict[str, Any]) -> list[Any]:
    return [
        c
        for c in job.get("status", {}).get("conditions", [])
        if c["type"] in ("Complete", "Failed") and c["status"] == "True"
    ]


def deployed_world(spec: dict[str, Any] | None = None, **kwargs: Any) -> World:
    world = World(spec, **kwargs)
    world.step()
    world.finish(outputs={"url": "http://x"})
    world.step()
    assert world.condition("Ready")["status"] == "True"
    return world


# ---------------------------------------------------------------------------------------
# First run, success, idleness
# ---------------------------------------------------------------------------------------


def test_new_stack_gets_the_finalizer_and_its_first_run() -> None:
    world = World(finalizer=False)
    result = world.step()
    assert result.finalizer == "add"
    assert result.create_job is not None
    name = result.create_job["metadata"]["name"]
    assert name.startswith("app-up-")
    assert world.status["currentUpdate"] == {
        "generation": 1,
        "reconcileRequest": "",
        "name": name,
        "commit": SHA1,
    }
    assert world.status["observedGeneration"] == 1
    assert world.condition("Ready")["status"] == "False"
    assert world.condition("Reconciling")["reason"] == "StackProcessing"
    assert [e.reason for e in result.events] == ["StackUpdateDetected"]
    assert "initial stack update" in result.events[0].message


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


def test_an_idle_stack_plans_no_change_at_all() -> None:
    world = deployed_world()
    world.advance(3600)
    before = copy.deepcopy(world.stack)
    result = world.step()
    assert world.stack == before
    assert result.create_job is None and not result.events and result.finalizer is None
    assert result.requeue_after is None


def test_secret_outputs_are_masked_even_if_the_runner_forgot() -> None:
    world = World()
    world.step()
    world.finish(outputs={"token": "s3cr3t-value"}, secret_outputs=["token"])
    world.step()
    assert "s3cr3t-value" not in json.dumps(world.stack)


# ---------------------------------------------------------------------------------------
# Triggers
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Failures: backoff, stall, recovery
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Runs that end without a result, vanish, or are adopted
# ---------------------------------------------------------------------------------------


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


def test_finished_job_whose_fold_was_lost_is_folded_not_rerun() -> None:
    world = World()
    world.step()
    name = world.current_job()
    world.finish(outputs={"k": "v"})
    world.stack["status"] = {}  # lost: currentUpdate and everything else
    # Its pod, which vouches for its result, is read for the current run only: it becomes
    # the current run again, and is folded by the next reconcile.
    result = world.step()
    assert result.create_job is None and result.finished == []
    assert world.status["currentUpdate"]["name"] == name
    assert result.requeue_after == 1
    result = world.step()
    assert result.create_job is None
    assert world.status["lastUpdate"]["name"] == name
    assert world.status["outputs"] == {"k": "v"}
    assert world.condition("Ready")["status"] == "True"


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


def test_no_free_slot_waits() -> None:
    world = World()
    world.slot_available = False
    result = world.step()
    assert result.create_job is None
    assert "free run slot" in world.condition("Reconciling")["message"]
    assert result.requeue_after == 30
    world.slot_available = True
    assert world.step().create_job is not None


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


# ---------------------------------------------------------------------------------------
# Suspend, invalid spec, prerequisites
# ---------------------------------------------------------------------------------------


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


def test_a_planning_bug_stalls_that_stack_with_the_error_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = deployed_world()
    world.edit_spec(config={"x": "1"})

    def broken(self: Any, spec: Any, commit: Any) -> bool:
        raise OverflowError("date value out of range " + "x" * 100_000)

    monkeypatch.setattr("pkobatch.controller.plan._Planner._sync", broken)
    result = world.step()
    assert "OverflowError" in result.error and result.create_job is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "ReconcileError"
    assert "OverflowError: date value out of range" in stalled["message"]
    assert len(stalled["message"]) <= MAX_MESSAGE_CHARS
    assert world.condition("Ready")["status"] == "False"
    assert world.status["observedGeneration"] == 2
    assert world.status["lastUpdate"]["state"] == "succeeded"
    assert [e.reason for e in result.events] == ["ReconcileError"]
    assert len(result.events[0].message) <= MAX_MESSAGE_CHARS
    assert result.requeue_after is None
    assert world.step().events == []  # no Event storm on later passes
    monkeypatch.undo()
    world.edit_spec(config={"x": "2"})
    assert world.step().create_job is not None


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


# ---------------------------------------------------------------------------------------
# Deletion
# ---------------------------------------------------------------------------------------


def delete(world: World) -> None:
    world.stack["metadata"]["deletionTimestamp"] = rfc3339(world.now)
    world.stack["metadata"]["generation"] += 1


def test_deletion_without_destroy_removes_the_finalizer_at_once() -> None:
    world = deployed_world()
    delete(world)
    result = world.step()
    assert result.finalizer == "remove"
    assert result.create_job is None and result.status is None


def test_deletion_waits_for_a_running_job() -> None:
    world = World()
    world.step()
    delete(world)
    assert world.step().finalizer is None
    world.finish()
    assert world.step().finalizer == "remove"


def test_destroy_on_finalize_destroys_then_releases() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    result = world.step()
    assert result.finalizer is None
    assert result.create_job is not None
    assert result.create_job["metadata"]["labels"]["pkobatch.io/operation"] == "destroy"
    snapshot = json.loads(result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1])
    assert snapshot["projectInfo"] == {"name": "app", "runtime": "python"}
    world.finish()
    result = world.step()
    assert result.finalizer == "remove"
    assert [e.reason for e in result.events] == ["StackCreated", "StackDestroyed"]


def forge(world: World, name: str, **fields: Any) -> None:
    """Someone else writes a succeeded result for run ``name`` (no owner reference)."""
    forged = RunResult(
        operation="destroy",
        state="succeeded",
        reason="Succeeded",
        stack=StackRef(name="app", namespace="team", uid="stack-uid"),
        job_name=name,
        permalink="https://forged.example/",
        **fields,
    )
    world.results[name] = {
        "metadata": {"name": name, "creationTimestamp": rfc3339(world.now + timedelta(hours=1))},
        "data": {RESULT_KEY: forged.to_json()},
    }


def test_a_destroy_on_deletion_releases_the_stack_only_on_a_success_its_run_vouches_for() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.step()
    name = world.current_job()
    # While the destroy runs, a forged success changes nothing.
    forge(world, name)
    result = world.step()
    assert result.finalizer is None and result.finished == []
    assert world.status["currentUpdate"]["name"] == name
    # The real destroy fails; the forgery is still what the ConfigMap holds when it is folded.
    world.finish(state="failed", reason="ProgramError", message="cannot delete bucket")
    forge(world, name)
    result = world.step()
    assert result.finalizer is None
    assert world.status["lastUpdate"]["state"] == "failed"
    assert "is not the result the pod of run" in world.status["lastUpdate"]["message"]
    assert [e.reason for e in result.events] == ["ResultRejected", "StackUpdateFailure"]
    assert world.stack["metadata"]["finalizers"] == [FINALIZER]


def test_a_destroy_whose_job_failed_keeps_the_finalizer_even_with_a_vouched_success() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.step()
    name = world.finish()  # its result says succeeded, and its pod vouches for it ...
    world.fail_job(name, reason="DeadlineExceeded")  # ... but the Job failed
    result = world.step()
    assert result.finalizer is None
    assert world.status["lastUpdate"]["state"] == "failed"
    assert "StackDestroyed" not in [e.reason for e in result.events]


def test_a_destroy_whose_pod_is_gone_is_a_failure_and_retried() -> None:
    world = deployed_world(
        {**GIT_SPEC, "destroyOnFinalize": True}, settings=Settings(retry={"base": "1s"})
    )
    delete(world)
    world.step()
    name = world.finish()
    world.pods.pop(name)  # nothing is left to vouch for its result: never trusted
    result = world.step()
    assert result.finalizer is None and world.status["lastUpdate"]["state"] == "failed"
    assert "is gone" in world.status["lastUpdate"]["message"]
    # Never wedged: the retry destroys, and only then is the Stack released.
    world.advance(result.requeue_after or 1)
    assert world.step().create_job is not None
    world.finish()
    assert world.step().finalizer == "remove"


def test_failed_destroy_keeps_the_finalizer_and_stalls_with_a_way_out() -> None:
    world = deployed_world(
        {**GIT_SPEC, "destroyOnFinalize": True}, settings=Settings(retry={"base": "1s"})
    )
    delete(world)
    world.step()
    for _ in range(4):
        world.finish(state="failed", reason="ProgramError", message="cannot delete bucket")
        result = world.step()
        assert result.finalizer is None
        if result.requeue_after:
            world.advance(result.requeue_after)
            world.step()
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "UpdateFailed"
    assert "cannot delete bucket" in stalled["message"]
    assert ABANDON_ANNOTATION in stalled["message"]
    assert world.step().create_job is None
    world.annotate(ABANDON_ANNOTATION, "true")
    result = world.step()
    assert result.finalizer == "remove"
    assert [e.reason for e in result.events] == ["FinalizerAbandoned"]


def test_destroy_on_finalize_in_a_terminating_namespace_stalls() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True})
    delete(world)
    world.namespace_terminating = True
    result = world.step()
    assert result.create_job is None and result.finalizer is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "NamespaceTerminating"
    assert "kubectl annotate stack app" in stalled["message"]


def test_preview_stack_never_destroys_on_deletion() -> None:
    world = deployed_world({**GIT_SPEC, "destroyOnFinalize": True, "preview": True})
    delete(world)
    assert world.step().finalizer == "remove"


def test_a_stack_that_never_completed_a_run_is_destroyed_as_in_pko() -> None:
    # The stack may hold resources from before (PKO, another Stack, a manual `pulumi up`).
    world = World({**GIT_SPEC, "destroyOnFinalize": True}, finalizer=True)
    delete(world)
    result = world.step()
    assert result.finalizer is None
    assert result.create_job is not None
    assert result.create_job["metadata"]["name"].startswith("app-destroy-")
    world.finish()
    assert world.step().finalizer == "remove"


def test_a_stack_deleted_during_its_first_run_is_destroyed_after_it() -> None:
    world = World({**GIT_SPEC, "destroyOnFinalize": True})
    world.step()
    first = world.current_job()
    delete(world)
    assert world.step().create_job is None
    world.finish(first, state="failed", reason="ProgramError")
    result = world.step()
    assert result.create_job is not None and "-destroy-" in result.create_job["metadata"]["name"]


def test_never_deployed_stack_without_destroy_on_finalize_is_released_at_once() -> None:
    world = World(GIT_SPEC, finalizer=True)
    delete(world)
    assert world.step().finalizer == "remove"


def test_deleted_stack_without_finalizer_needs_nothing() -> None:
    world = World(finalizer=False)
    delete(world)
    result = world.step()
    assert result.status is None and result.finalizer is None and result.create_job is None


# ---------------------------------------------------------------------------------------
# Operation requests
# ---------------------------------------------------------------------------------------


def request(world: World, value: str) -> Plan:
    world.annotate(OPERATION_REQUEST_ANNOTATION, value)
    return world.step()


def test_requested_refresh_runs_once_and_is_acknowledged() -> None:
    world = deployed_world()
    result = request(world, "refresh:t1")
    assert result.create_job is not None
    name = result.create_job["metadata"]["name"]
    assert "-refresh-" in name
    assert world.status["operationRequest"] == {
        "request": "refresh:t1",
        "operation": "refresh",
        "state": "Running",
        "jobName": name,
        "message": f"run {name} started",
    }
    assert world.condition("Ready")["status"] == "True"  # a refresh is not an update
    world.finish(message="refreshed")
    world.step()
    assert world.status["operationRequest"]["state"] == "Succeeded"
    assert world.status["lastUpdate"]["type"] == "up"
    assert world.step().create_job is None


def test_request_while_running_is_pending_then_runs() -> None:
    world = World()
    world.step()
    result = request(world, "preview:t1")
    assert result.create_job is None
    assert world.status["operationRequest"]["state"] == "Pending"
    world.finish()
    result = world.step()
    assert result.create_job is not None
    assert world.status["operationRequest"]["state"] == "Running"


def test_invalid_request_is_rejected_once() -> None:
    world = deployed_world()
    result = request(world, "explode:now")
    assert world.status["operationRequest"]["state"] == "Rejected"
    assert [e.reason for e in result.events] == ["OperationRequestRejected"]
    assert world.step().events == []


def test_preview_stack_rejects_up_and_destroy() -> None:
    world = deployed_world({**GIT_SPEC, "preview": True})
    request(world, "destroy:t1")
    assert world.status["operationRequest"]["state"] == "Rejected"
    assert "spec.preview" in world.status["operationRequest"]["message"]


def test_cancel_deletes_the_running_job_and_records_a_failure() -> None:
    world = World()
    world.step()
    name = world.current_job()
    result = request(world, "cancel:t1")
    assert [(d.name, d.foreground) for d in result.delete_jobs] == [(name, True)]
    last = world.status["lastUpdate"]
    assert last["state"] == "failed" and last["name"] == name and "cancelled" in last["message"]
    assert world.status["operationRequest"]["state"] == "Succeeded"
    assert "currentUpdate" not in world.status
    # The Job is still stopping: nothing new starts until it is gone.
    world.advance(60)
    assert world.step().create_job is None
    del world.jobs[name]
    assert world.step().create_job is not None  # the normal retry policy applies


def test_cancel_with_nothing_running_is_rejected() -> None:
    world = deployed_world()
    request(world, "cancel:t1")
    assert world.status["operationRequest"]["state"] == "Rejected"


def test_requested_destroy_holds_the_stack_until_up_is_requested() -> None:
    world = deployed_world()
    result = request(world, "destroy:t1")
    assert result.create_job is not None
    world.finish()
    world.step()
    assert world.status["lastUpdate"]["type"] == "destroy"
    assert world.status["outputs"] == {}
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "DestroyedOnRequest"
    world.source = SourceHead(commit=SHA2)
    world.advance(3600)
    assert world.step().create_job is None  # held: no automatic up, even on a new commit
    result = request(world, "up:t2")
    assert result.create_job is not None
    world.finish()
    world.step()
    assert world.condition("Ready")["status"] == "True"


def test_requested_destroy_hold_ends_with_a_spec_change() -> None:
    world = deployed_world()
    request(world, "destroy:t1")
    world.finish()
    world.step()
    world.edit_spec(config={"a": "b"})
    assert world.step().create_job is not None


# ---------------------------------------------------------------------------------------
# Schedules and drift detection
# ---------------------------------------------------------------------------------------


def test_schedule_runs_the_normal_operation_at_its_times() -> None:
    world = deployed_world({**GIT_SPEC, "schedule": "0 13 * * *"})
    result = world.step()
    assert result.create_job is None
    assert result.requeue_after == pytest.approx(3600)
    world.advance(3600)
    result = world.step()
    assert result.create_job is not None
    assert "scheduled run 2026-01-01T13:00:00Z" in result.events[0].message
    assert world.status["lastScheduleTime"] == "2026-01-01T13:00:00Z"
    world.finish()
    world.step()
    assert world.step().create_job is None


def test_missed_schedule_beyond_the_starting_deadline_is_skipped() -> None:
    world = deployed_world({**GIT_SPEC, "schedule": "0 13 * * *"})
    world.advance(3600 + 7200)  # controller was down from before 13:00 until 15:00
    assert world.step().create_job is None


def test_drift_check_detects_and_remediates() -> None:
    world = deployed_world(
        {**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *", "remediate": True}}
    )
    world.advance(1800)
    result = world.step()
    assert result.create_job is not None
    check = result.create_job["metadata"]["name"]
    assert "-refresh-" in check
    snapshot = json.loads(result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1])
    assert snapshot["driftCheck"] is True
    assert world.condition("Ready")["status"] == "True"  # a check is not an update
    world.finish(drifted=2)
    result = world.step()
    drifted = world.condition("Drifted")
    assert drifted["status"] == "True" and "2 resource(s) drifted" in drifted["message"]
    assert "DriftDetected" in [e.reason for e in result.events]
    assert world.status["lastDriftCheck"]["driftedResources"] == 2
    # remediation: an up with refresh
    assert result.create_job is not None
    remediation = json.loads(
        result.create_job["spec"]["template"]["spec"]["containers"][0]["args"][1]
    )
    assert remediation["operation"] == "up" and remediation["spec"]["refresh"] is True
    world.finish()
    world.step()
    assert world.condition("Drifted")["reason"] == "Remediated"
    assert world.step().create_job is None


def test_drift_check_without_remediation_only_reports() -> None:
    world = deployed_world({**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *"}})
    world.advance(1800)
    world.step()
    world.finish(drifted=1)
    result = world.step()
    assert result.create_job is None
    assert world.condition("Drifted")["status"] == "True"
    ready = world.condition("Ready")
    # GitOps tools show Ready's message as the health message: it names the drift.
    assert ready["status"] == "True" and "1 resource(s) drifted" in ready["message"]


def test_no_drift_sets_drifted_false() -> None:
    world = deployed_world({**GIT_SPEC, "driftDetection": {"schedule": "30 12 * * *"}})
    world.advance(1800)
    world.step()
    world.finish(drifted=0)
    world.step()
    assert world.condition("Drifted")["reason"] == "NoDrift"
    assert world.status["lastDriftCheck"]["scheduledTime"] == "2026-01-01T12:30:00Z"


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
