"""Writing a run's result ConfigMap (the runner's only Kubernetes writes).

The ConfigMap is named after the Job, lives in its namespace, and is owned by the Job, so it
goes when the Job goes. The Job's UID is not known before the Job exists, so the runner reads
its own Job (``get`` on ``batch/v1 jobs``) — which also yields the Job's labels (copied onto the
result) and its deadline (to tell ``DeadlineExceeded`` from ``Cancelled``). The API calls are
listed in ``pkobatch.kube.rbac.RUNNER_API_CALLS``.

Transient API errors (unreachable, 429, 5xx, a conflicting update) are retried with backoff,
within a bounded number of attempts and the time the run has left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Final

from pkobatch.api.run import RunResult
from pkobatch.kube.client import CONFIGMAPS, JOBS, AlreadyExists, Conflict, Kube, KubeError
from pkobatch.runner.result import result_config_map, result_labels

MAX_ATTEMPTS: Final = 6
FIRST_BACKOFF_SECONDS: Final = 0.5
MAX_BACKOFF_SECONDS: Final = 8.0
_TRANSIENT_STATUSES: Final = frozenset({0, 429, 500, 502, 503, 504})


class ResultNotWritten(Exception):
    """The result ConfigMap could not be written."""


def is_transient(error: KubeError) -> bool:
    return error.status in _TRANSIENT_STATUSES or (
        isinstance(error, Conflict) and not isinstance(error, AlreadyExists)
    )


def job_deadline(job: dict[str, Any]) -> datetime | None:
    """When the Job controller ends the Job (``status.startTime + activeDeadlineSeconds``)."""
    seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
    started = (job.get("status") or {}).get("startTime")
    if not seconds or not started:
        return None
    return datetime.fromisoformat(str(started).replace("Z", "+00:00")) + timedelta(
        seconds=int(seconds)
    )


class ResultWriter:
    """Reads the run's Job and writes its result ConfigMap."""

    def __init__(
        self,
        connect: Callable[[], Kube],
        namespace: str,
        name: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._kube: Kube | None = None
        self.namespace = namespace
        self.name = name
        self.job: dict[str, Any] | None = None
        self._sleep = sleep
        self._clock = clock

    def _retrying(self, what: str, call: Callable[[Kube], Any], time_limit: float) -> Any:
        give_up_at = self._clock() + time_limit
        backoff = FIRST_BACKOFF_SECONDS
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                if self._kube is None:
                    self._kube = self._connect()
                return call(self._kube)
            except KubeError as error:
                last = error
                out_of_time = self._clock() + backoff > give_up_at
                if not is_transient(error) or attempt == MAX_ATTEMPTS or out_of_time:
                    break
                self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
        raise ResultNotWritten(f"{what}: {last}")

    def load_job(self, time_limit: float = 30.0) -> dict[str, Any]:
        """The run's Job (kept in ``self.job``)."""
        self.job = self._retrying(
            f"reading Job {self.namespace}/{self.name}",
            lambda kube: kube.get(JOBS, self.name, self.namespace),
            time_limit,
        )
        return self.job

    def write(self, result: RunResult, time_limit: float = 60.0) -> None:
        """Create (or, after a lost response, replace) the result ConfigMap."""
        metadata = (self.job or {}).get("metadata") or {}
        body = result_config_map(
            result,
            name=self.name,
            namespace=self.namespace,
            labels=result_labels(metadata.get("labels") or {}, result.stack.name, result.operation),
            job_uid=metadata.get("uid"),
        )

        def put(kube: Kube) -> None:
            try:
                kube.create(CONFIGMAPS, body, self.namespace)
            except AlreadyExists:
                existing = kube.get(CONFIGMAPS, self.name, self.namespace)
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                kube.replace(CONFIGMAPS, body, self.namespace)

        self._retrying(f"writing ConfigMap {self.namespace}/{self.name}", put, time_limit)

    def close(self) -> None:
        if self._kube is not None:
            self._kube.close()
