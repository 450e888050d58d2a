"""A Stack's runs, from its Jobs and their result ConfigMaps (pure).

A run is one Job; its result ConfigMap has the same name. Either may be missing: a Job
that is still running or that died without writing a result (OOM, deadline, eviction) has
no ConfigMap, and a ConfigMap can outlive its Job for a moment while the garbage collector
catches up. The result, when present and readable, is the authority on what happened; the
Job's status fills in the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError

from pkobatch.api.constants import OPERATION_LABEL, RESULT_KEY, RUN_ANNOTATION
from pkobatch.api.objects import true_condition
from pkobatch.api.run import RunResult
from pkobatch.api.timestamps import parse_time
from pkobatch.cli.stack_views import RUNNING

PENDING: Final = "pending"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"


@dataclass(frozen=True)
class RunRecord:
    name: str
    operation: str
    state: str
    reason: str = ""
    message: str = ""
    drift_check: bool = False
    commit: str = ""
    created: datetime | None = None
    started: datetime | None = None
    finished: datetime | None = None
    changes: Mapping[str, int] = field(default_factory=dict)
    permalink: str = ""
    pulumi_version: str = ""
    language_host: str = ""
    outputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> timedelta | None:
        if self.started is None or self.finished is None:
            return None
        return self.finished - self.started


def read_result(configmap: Mapping[str, Any]) -> RunResult | None:
    """The RunResult in a result ConfigMap, or None when it is missing or unreadable."""
    text = (configmap.get("data") or {}).get(RESULT_KEY)
    if not text:
        return None
    try:
        return RunResult.model_validate_json(text)
    except (ValidationError, ValueError):
        return None


def _job_state(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """(state, reason, message) of a Job that has no readable result."""
    failed = true_condition(job, "Failed")
    if failed is not None:
        return FAILED, str(failed.get("reason") or "JobFailed"), str(failed.get("message") or "")
    if true_condition(job, "Complete") is not None:
        return FAILED, "NoResult", "the run ended without writing a result"
    status = job.get("status") or {}
    if status.get("active"):
        return RUNNING, "", ""
    return PENDING, "", ""


def _record_from_result(name: str, result: RunResult, job: Mapping[str, Any] | None) -> RunRecord:
    created = parse_time(((job or {}).get("metadata") or {}).get("creationTimestamp"))
    return RunRecord(
        name=name,
        operation=result.operation,
        state=result.state,
        reason=result.reason,
        message=result.message,
        drift_check=result.drift_check,
        commit=result.commit,
        created=created,
        started=result.start_time,
        finished=result.end_time,
        changes=dict(result.changes),
        permalink=result.permalink,
        pulumi_version=result.pulumi_version,
        language_host=result.language_host,
        outputs=dict(result.outputs),
    )


def _record_from_job(name: str, job: Mapping[str, Any]) -> RunRecord:
    metadata = job.get("metadata") or {}
    status = job.get("status") or {}
    state, reason, message = _job_state(job)
    return RunRecord(
        name=name,
        operation=str((metadata.get("labels") or {}).get(OPERATION_LABEL) or ""),
        state=state,
        reason=reason,
        message=message,
        commit=job_commit(job),
        created=parse_time(metadata.get("creationTimestamp")),
        started=parse_time(status.get("startTime")),
        finished=parse_time(status.get("completionTime"))
        or parse_time((true_condition(job, "Failed") or {}).get("lastTransitionTime")),
    )


def job_snapshot(job: Mapping[str, Any]) -> dict[str, Any]:
    """The RunSnapshot the Job was started with (its ``--snapshot`` argument), if readable."""
    spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in spec.get("containers") or []:
        words = [*(container.get("command") or []), *(container.get("args") or [])]
        for index, word in enumerate(words):
            text = None
            if word == "--snapshot" and index + 1 < len(words):
                text = words[index + 1]
            elif isinstance(word, str) and word.startswith("--snapshot="):
                text = word.split("=", 1)[1]
            if text:
                try:
                    decoded = json.loads(text)
                except ValueError:
                    return {}
                return decoded if isinstance(decoded, dict) else {}
    return {}


def job_commit(job: Mapping[str, Any]) -> str:
    """The commit a Job ran: from its snapshot argument, else from its run annotation (a
    large snapshot travels in ConfigMaps, which the Job only names)."""
    commit = job_snapshot(job).get("commit")
    if not commit:
        text = ((job.get("metadata") or {}).get("annotations") or {}).get(RUN_ANNOTATION)
        try:
            run = json.loads(text) if text else {}
        except ValueError:
            run = {}
        commit = run.get("commit") if isinstance(run, dict) else None
    return str(commit or "")


def build_runs(
    jobs: Iterable[Mapping[str, Any]], configmaps: Iterable[Mapping[str, Any]]
) -> list[RunRecord]:
    """One record per run, newest first."""
    jobs_by_name = {str((j.get("metadata") or {}).get("name")): j for j in jobs}
    results = {}
    for configmap in configmaps:
        result = read_result(configmap)
        if result is not None:
            results[str((configmap.get("metadata") or {}).get("name"))] = result
    records = []
    for name in sorted(set(jobs_by_name) | set(results)):
        job = jobs_by_name.get(name)
        if name in results:
            records.append(_record_from_result(name, results[name], job))
        elif job is not None:
            records.append(_record_from_job(name, job))
    return sorted(records, key=_newest_first)


def _newest_first(record: RunRecord) -> tuple[float, str]:
    moment = record.started or record.created
    return (-moment.timestamp() if moment else 0.0, record.name)
