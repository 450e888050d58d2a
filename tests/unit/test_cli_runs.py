"""A Stack's runs from Jobs and result ConfigMaps (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pkobatch.api.run import RunResult, StackRef
from pkobatch.cli.runs import build_runs, job_commit, job_snapshot, read_result


def job(name: str, operation: str, created: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": created,
            "labels": {"pkobatch.io/operation": operation},
        },
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pulumi",
                            "command": ["pkobatch", "job", "run"],
                            "args": ["--snapshot", json.dumps({"commit": "c0ffee"})],
                        }
                    ]
                }
            }
        },
        "status": status,
    }


def result_configmap(name: str, **fields: Any) -> dict[str, Any]:
    result = RunResult.model_validate(
        {
            "operation": "refresh",
            "state": "succeeded",
            "reason": "Succeeded",
            "stack": StackRef(name="web", namespace="team"),
            "jobName": name,
            "commit": "abc",
            "startTime": datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
            "endTime": datetime(2026, 11, 30, 10, 1, 30, tzinfo=UTC),
            "changes": {"same": 2},
            "pulumiVersion": "3.259.0",
            "languageHost": "pulumi-language-yaml",
            **fields,
        }
    )
    return {"metadata": {"name": name}, "data": {"result.json": result.to_json()}}


def test_a_result_is_the_authority_and_carries_details() -> None:
    runs = build_runs(
        [job("web-refresh-1", "refresh", "2026-11-30T09:59:58Z", succeeded=1)],
        [result_configmap("web-refresh-1")],
    )

    (run,) = runs
    assert (run.operation, run.state, run.reason, run.commit) == (
        "refresh",
        "succeeded",
        "Succeeded",
        "abc",
    )
    assert run.duration == timedelta(seconds=90)
    assert dict(run.changes) == {"same": 2}
    assert run.pulumi_version == "3.259.0"
    assert run.language_host == "pulumi-language-yaml"


def test_jobs_without_results_get_their_state_from_the_job() -> None:
    runs = build_runs(
        [
            job(
                "a-running",
                "up",
                "2026-11-30T10:00:00Z",
                active=1,
                startTime="2026-11-30T10:00:01Z",
            ),
            job(
                "b-deadline",
                "up",
                "2026-11-30T09:00:00Z",
                startTime="2026-11-30T09:00:01Z",
                conditions=[
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline",
                        "lastTransitionTime": "2026-11-30T10:00:01Z",
                    }
                ],
            ),
            job(
                "c-no-result",
                "destroy",
                "2026-11-30T08:00:00Z",
                conditions=[{"type": "Complete", "status": "True"}],
            ),
            job("d-new", "preview", "2026-11-30T11:00:00Z"),
        ],
        [],
    )

    by_name = {r.name: r for r in runs}
    assert [r.name for r in runs] == ["d-new", "a-running", "b-deadline", "c-no-result"]
    assert (by_name["a-running"].state, by_name["a-running"].commit) == ("running", "c0ffee")
    assert (by_name["b-deadline"].state, by_name["b-deadline"].reason) == (
        "failed",
        "DeadlineExceeded",
    )
    assert by_name["b-deadline"].duration == timedelta(hours=1)
    assert (by_name["c-no-result"].state, by_name["c-no-result"].reason) == ("failed", "NoResult")
    assert by_name["d-new"].state == "pending"


def test_a_result_without_its_job_is_still_a_run() -> None:
    (run,) = build_runs([], [result_configmap("gone", state="failed", reason="ProgramError")])

    assert (run.name, run.state, run.reason) == ("gone", "failed", "ProgramError")


def test_unreadable_results_fall_back_to_the_job() -> None:
    broken = {"metadata": {"name": "j"}, "data": {"result.json": '{"schemaVersion": "v999"}'}}

    assert read_result(broken) is None
    assert read_result({"metadata": {"name": "j"}}) is None
    (run,) = build_runs([job("j", "up", "2026-11-30T10:00:00Z", active=1)], [broken])
    assert run.state == "running"


def test_job_snapshot_reads_both_argument_spellings() -> None:
    inline = job("j", "up", "2026-11-30T10:00:00Z")
    inline["spec"]["template"]["spec"]["containers"][0]["args"] = ['--snapshot={"commit": "x"}']

    assert job_snapshot(inline) == {"commit": "x"}
    assert job_snapshot({"spec": {}}) == {}


def test_a_jobs_commit_comes_from_its_run_annotation_when_its_snapshot_is_in_configmaps() -> None:
    job = {
        "metadata": {"annotations": {"pkobatch.io/run": '{"commit": "abc", "operation": "up"}'}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pulumi",
                            "args": [
                                "--snapshot-configmap",
                                "ns/j-snapshot-0",
                                "--snapshot-sha256",
                                "d",
                            ],
                        }
                    ]
                }
            }
        },
    }
    assert job_snapshot(job) == {}
    assert job_commit(job) == "abc"
    assert job_commit({"metadata": {"annotations": {"pkobatch.io/run": "{broken"}}}) == ""
