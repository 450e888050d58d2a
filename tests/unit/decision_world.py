"""The unit tier's Stack world for ``pkobatch.controller.decide`` and its steps.

``World`` plays the part of the API server, the Job controller and the kubelet: it applies
each decision (status, finalizer, created and deleted Jobs) and lets a test finish Jobs with or
without a result — the run's pod vouching for it in its termination message, as the runner
has it do. It observes as the controller's observer does: the pods of the current run once
it has finished. Everything is pure and in memory; time moves only when a test says so.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from pkobatch.api.constants import (
    FINALIZER,
    RESULT_KEY,
)
from pkobatch.api.run import (
    ProjectInfo,
    Run,
    RunResult,
    StackRef,
    result_config_map,
    result_digest_line,
    result_labels,
)
from pkobatch.config import Settings
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Decision, Observed, SourceHead, SourceObject
from pkobatch.controller.job_builder import builtin_template
from pkobatch.runner.result import fitted_result_message

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
        # Pods a test puts before the decider; the others are observed from ``pods``.
        self.run_pods: dict[str, list[dict[str, Any]]] = {}
        # Job name -> the pods the Job controller and the kubelet left of it.
        self.pods: dict[str, list[dict[str, Any]]] = {}
        # The namespace's run cache claim, as the observer reads it (run cache enabled).
        self.run_cache_claim: dict[str, Any] | None = None
        self.run_cache_in_use = False
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
        """The Stack, its Jobs and results as ``decide`` is given them (copies)."""
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

    def decide(self) -> Decision:
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
            run_cache_claim=copy.deepcopy(self.run_cache_claim),
            run_cache_in_use=self.run_cache_in_use,
        )
        return decide(observed, self.settings, builtin_template())

    def step(self) -> Decision:
        result = self.decide()
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

    def settle(self, limit: int = 5) -> Decision:
        """Step until a decision changes nothing more (no Job, no finalizer change)."""
        for _ in range(limit):
            before = copy.deepcopy(self.stack)
            result = self.step()
            if result.create_job is None and self.stack == before:
                return result
        raise AssertionError("the decisions do not converge")

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


def delete(world: World) -> None:
    """Start the deletion of the world's Stack (as the API server does: a new generation)."""
    world.stack["metadata"]["deletionTimestamp"] = rfc3339(world.now)
    world.stack["metadata"]["generation"] += 1
