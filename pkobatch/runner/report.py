"""The runner's Kubernetes calls: reading a large snapshot, writing the result ConfigMap,
writing and deleting the objects of ``spec.exportOutputs`` (``OutputsWriter``).

The result ConfigMap is named after the Job, lives in its namespace, and is owned by the Job,
so it goes when the Job goes. The Job's UID is not known before the Job exists: the pod gets it
from the label the Job controller puts on its pods (``batch.kubernetes.io/controller-uid``,
through the downward API, variable ``PKOBATCH_JOB_UID``), so an API server the runner cannot
reach at start does not cost the result its owner. The runner also reads its own Job (``get``
on ``batch/v1 jobs``) for its labels (copied onto the result) and its deadline (to tell
``DeadlineExceeded`` from ``Cancelled``); both have fallbacks. The API calls are listed in
``pkobatch.kube.rbac.RUNNER_API_CALLS``.

The result ConfigMap is immutable: no run and no namespace user can change it in place. One
of its name that is not this run's own (a forgery, a left-over) is deleted and the run's own
created instead. Then the runner vouches for it: the digest of ``result.json`` goes to the
container's termination message file (``TERMINATION_MESSAGE_PATH_ENV``, else
``/dev/termination-log``), which the kubelet copies into the pod's status; the controller
folds only a result that matches it (docs/security.md). A run the API server forbids to
write the ConfigMap (its ServiceAccount has no pkobatch rights, as in PKO's manifests)
writes the result itself there instead (``fitted_result_message``), and the controller
creates the ConfigMap.

Transient API errors (unreachable, 429, 5xx, a conflicting update) are retried with backoff:
reading the Job a few times, writing the result for as long as the run may (minutes: an API
server restart must not turn a finished run into a lost one). A snapshot ConfigMap that is
not there yet is waited for too: the controller creates it right after the Job. One the run may
not read (``SnapshotForbidden``) is not: no wait gives the run a right it lacks, and
``pkobatch job run`` names the ConfigMap in its termination message so the controller fails the
run as ``MissingPermission``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from pkobatch.api.constants import RESULT_KEY
from pkobatch.api.objects import owned_by
from pkobatch.api.run import (
    SNAPSHOT_KEY,
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_PATH_ENV,
    RunResult,
    StackRef,
    result_config_map,
    result_digest_line,
    result_labels,
    snapshot_sha256,
)
from pkobatch.api.timestamps import parse_time
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    SECRETS,
    SELF_SUBJECT_ACCESS_REVIEWS,
    AlreadyExists,
    Conflict,
    Forbidden,
    Kube,
    KubeError,
    NotFound,
    Resource,
)
from pkobatch.kube.rbac import access_review
from pkobatch.runner.exports import ExportFailed, ExportTargetObject
from pkobatch.runner.result import fitted_result_message
from pkobatch.runner.rights import Right

MAX_ATTEMPTS: Final = 6
FIRST_BACKOFF_SECONDS: Final = 0.5
MAX_BACKOFF_SECONDS: Final = 8.0
SNAPSHOT_WAIT_SECONDS: Final = 120.0
RESULT_WRITE_SECONDS: Final = 300.0
EXPORT_WRITE_SECONDS: Final = 120.0
# Attempts when only time bounds the retries (the backoff is capped at MAX_BACKOFF_SECONDS).
_UNTIL_TIME_RUNS_OUT: Final = 10_000
_TRANSIENT_STATUSES: Final = frozenset({0, 429, 500, 502, 503, 504})
# Times the runner takes a result ConfigMap of its name that is not its own away before it
# gives up (someone keeps creating one).
_REPLACE_ATTEMPTS: Final = 3


class ResultNotWritten(Exception):
    """The result ConfigMap could not be written."""


class SnapshotUnreadable(Exception):
    """The snapshot's ConfigMaps could not be read, or do not hold what the Job says."""


class SnapshotForbidden(SnapshotUnreadable):
    """The run's ServiceAccount may not read the snapshot's ConfigMap ``ref`` (NAMESPACE/NAME)."""

    def __init__(self, ref: str, message: str) -> None:
        super().__init__(message)
        self.ref = ref


def is_transient(error: KubeError) -> bool:
    return error.status in _TRANSIENT_STATUSES or (
        isinstance(error, Conflict) and not isinstance(error, AlreadyExists)
    )


def termination_log_path(env: Mapping[str, str]) -> Path:
    """The file whose content the kubelet reports as the container's termination message."""
    return Path(env.get(TERMINATION_MESSAGE_PATH_ENV) or TERMINATION_MESSAGE_PATH)


def _own_result(existing: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """``existing`` is the ConfigMap ``body`` creates (a create whose response was lost)."""

    def owners(obj: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
        return sorted((ref.get("kind"), ref.get("name"), ref.get("uid")) for ref in refs)

    return (
        existing.get("immutable") is True
        and existing.get("data") == body["data"]
        and owners(existing) == owners(body)
    )


def job_deadline(job: dict[str, Any]) -> datetime | None:
    """When the Job controller ends the Job (``status.startTime + activeDeadlineSeconds``)."""
    seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
    started = (job.get("status") or {}).get("startTime")
    if not seconds or not started:
        return None
    started_at = parse_time(started)
    return None if started_at is None else started_at + timedelta(seconds=int(seconds))


class _Connection:
    """One API connection, made on first use, with bounded retries of transient errors."""

    def __init__(
        self,
        connect: Callable[[], Kube],
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._kube: Kube | None = None
        self._sleep = sleep
        self._clock = clock

    def retrying(
        self,
        call: Callable[[Kube], Any],
        time_limit: float,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        retry_not_found: bool = False,
    ) -> Any:
        """``call``'s value; raises the last ``KubeError`` when attempts or time run out."""
        give_up_at = self._clock() + time_limit
        backoff = FIRST_BACKOFF_SECONDS
        attempt = 0
        while True:
            attempt += 1
            try:
                if self._kube is None:
                    self._kube = self._connect()
                return call(self._kube)
            except KubeError as error:
                retry = is_transient(error) or (retry_not_found and isinstance(error, NotFound))
                if not retry or attempt >= max_attempts or self._clock() + backoff > give_up_at:
                    raise
                self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def close(self) -> None:
        if self._kube is not None:
            self._kube.close()


def read_snapshot(
    connect: Callable[[], Kube],
    configmaps: list[str],
    sha256: str,
    *,
    time_limit: float = SNAPSHOT_WAIT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """The snapshot held in ``configmaps`` (``namespace/name``, in order), checked against the
    SHA-256 the Job records; waits up to ``time_limit`` for ConfigMaps not created yet."""
    connection = _Connection(connect, sleep, clock)
    parts: list[str] = []
    try:
        for ref in configmaps:
            namespace, _, name = ref.partition("/")
            if not namespace or not name:
                raise SnapshotUnreadable(f"{ref!r} is not NAMESPACE/NAME")

            def get(kube: Kube, name: str = name, namespace: str = namespace) -> Any:
                return kube.get(CONFIGMAPS, name, namespace)

            try:
                configmap = connection.retrying(
                    get,
                    time_limit,
                    max_attempts=_UNTIL_TIME_RUNS_OUT,
                    retry_not_found=True,
                )
            except Forbidden as error:
                raise SnapshotForbidden(
                    ref,
                    f"reading ConfigMap {ref}: {error}; the run's ServiceAccount needs get on "
                    f"configmaps in namespace {namespace}",
                ) from None
            except KubeError as error:
                raise SnapshotUnreadable(f"reading ConfigMap {ref}: {error}") from None
            part = (configmap.get("data") or {}).get(SNAPSHOT_KEY)
            if not isinstance(part, str):
                raise SnapshotUnreadable(f"ConfigMap {ref} has no {SNAPSHOT_KEY}")
            parts.append(part)
    finally:
        connection.close()
    text = "".join(parts)
    if snapshot_sha256(text) != sha256:
        raise SnapshotUnreadable(
            f"the snapshot in ConfigMaps {', '.join(configmaps)} is not the one the Job records "
            f"(SHA-256 {sha256}): it was changed after the Job was created"
        )
    return text


class ResultWriter:
    """Reads the run's Job, writes its result ConfigMap and vouches for it."""

    def __init__(
        self,
        connect: Callable[[], Kube],
        namespace: str,
        name: str,
        *,
        termination_log: Path,
        job_uid: str = "",
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = _Connection(connect, sleep, clock)
        self.namespace = namespace
        self.name = name
        # The container's termination message file (``termination_log_path``).
        self.termination_log = termination_log
        # From the pod's label (downward API); the Job read, when it succeeds, confirms it.
        self.job_uid = job_uid
        self.job: dict[str, Any] | None = None
        # The result went into the termination message, not a ConfigMap (``write``).
        self.inline = False

    def _retrying(
        self, what: str, call: Callable[[Kube], Any], time_limit: float, max_attempts: int
    ) -> Any:
        try:
            return self._connection.retrying(call, time_limit, max_attempts=max_attempts)
        except KubeError as error:
            raise ResultNotWritten(f"{what}: {error}") from None

    def load_job(self, time_limit: float = 30.0) -> dict[str, Any]:
        """The run's Job (kept in ``self.job``)."""
        self.job = self._retrying(
            f"reading Job {self.namespace}/{self.name}",
            lambda kube: kube.get(JOBS, self.name, self.namespace),
            time_limit,
            MAX_ATTEMPTS,
        )
        return self.job

    def write(self, result: RunResult, time_limit: float = RESULT_WRITE_SECONDS) -> None:
        """Create the immutable result ConfigMap — in place of one of its name that is not
        this run's own — then write its digest to the termination message file: the run's
        last word, and the only proof the controller accepts that the result is the run's."""
        metadata = (self.job or {}).get("metadata") or {}
        body = result_config_map(
            result,
            name=self.name,
            namespace=self.namespace,
            labels=result_labels(metadata.get("labels") or {}, result.stack.name, result.operation),
            job_uid=metadata.get("uid") or self.job_uid,
        )
        where = f"ConfigMap {self.namespace}/{self.name}"

        def put(kube: Kube) -> None:
            for _ in range(_REPLACE_ATTEMPTS):
                try:
                    kube.create(CONFIGMAPS, body, self.namespace)
                    return
                except AlreadyExists:
                    pass
                try:
                    existing = kube.get(CONFIGMAPS, self.name, self.namespace)
                    if _own_result(existing, body):
                        return
                    # Not this run's (written by someone else, or left by an earlier Job of
                    # this name): it goes, and the run's own takes its place.
                    uid = existing["metadata"]["uid"]
                    kube.delete(CONFIGMAPS, self.name, self.namespace, uid=uid)
                except NotFound:
                    continue
            raise ResultNotWritten(
                f"writing {where}: another ConfigMap of that name was created again each time "
                f"the run replaced it ({_REPLACE_ATTEMPTS} times); find who writes it"
            )

        try:
            self._connection.retrying(put, time_limit, max_attempts=_UNTIL_TIME_RUNS_OUT)
            last_word = result_digest_line(body["data"][RESULT_KEY])
        except Forbidden:
            # The run's ServiceAccount has no rights of pkobatch's (a PKO manifest's): the
            # result itself goes to the controller through the pod's status.
            last_word = fitted_result_message(result)
            self.inline = True
        except KubeError as error:
            raise ResultNotWritten(f"writing {where}: {error}") from None
        try:
            self.termination_log.write_text(last_word)
        except OSError as error:
            raise ResultNotWritten(
                f"{where} was written, but its digest could not be written to the termination "
                f"message file {self.termination_log} ({error}), so the controller will not "
                f"trust it: set {TERMINATION_MESSAGE_PATH_ENV} to the container's "
                "terminationMessagePath"
            ) from None

    def close(self) -> None:
        self._connection.close()


class OutputsWriter:
    """Writes and deletes the ConfigMap and Secret of ``spec.exportOutputs``; an object of the
    same name that the Stack does not own is never changed or deleted."""

    def __init__(
        self,
        connect: Callable[[], Kube],
        namespace: str,
        *,
        time_limit: float = EXPORT_WRITE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = _Connection(connect, sleep, clock)
        self.namespace = namespace
        self.time_limit = time_limit

    @staticmethod
    def _resource(kind: str) -> Resource:
        return SECRETS if kind == "Secret" else CONFIGMAPS

    def _retrying(self, what: str, call: Callable[[Kube], Any], verbs: str) -> Any:
        try:
            return self._connection.retrying(
                call, self.time_limit, max_attempts=_UNTIL_TIME_RUNS_OUT
            )
        except ExportFailed:
            raise
        except KubeError as error:
            raise ExportFailed(
                f"{what}: {error.status} {error.reason} (the runner's RBAC needs {verbs})"
            ) from None

    def _not_owned(self, target: ExportTargetObject, stack: StackRef) -> str:
        return (
            f"{target.describe(self.namespace)} exists and is not owned by Stack {stack.name}: "
            "pkobatch leaves it alone; delete it or name another object in spec.exportOutputs"
        )

    def write(self, body: dict[str, Any]) -> None:
        metadata = body["metadata"]
        target = ExportTargetObject(body["kind"], metadata["name"])
        resource = self._resource(target.kind)
        owner = metadata["ownerReferences"][0]
        stack = StackRef(name=owner["name"], namespace=self.namespace, uid=owner["uid"])

        def put(kube: Kube) -> None:
            try:
                kube.create(resource, body, self.namespace)
                return
            except AlreadyExists:
                existing = kube.get(resource, target.name, self.namespace)
            if not owned_by(existing, stack.uid):
                raise ExportFailed(self._not_owned(target, stack))
            replacement = {**body, "metadata": {**metadata}}
            replacement["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            kube.replace(resource, replacement, self.namespace)

        self._retrying(
            f"writing {target.describe(self.namespace)}",
            put,
            f"create, get and update on {resource.plural}",
        )

    def create_plan(self, body: dict[str, Any]) -> None:
        """Create a plan Secret (``pkobatch.runner.plans``); one that exists is kept: its
        name is its preview Job's, so it is this run's own (a retried write)."""
        name = body["metadata"]["name"]

        def create(kube: Kube) -> None:
            try:
                kube.create(SECRETS, body, self.namespace)
            except AlreadyExists:
                return

        self._retrying(f"writing Secret {self.namespace}/{name}", create, "create on secrets")

    def read_plan(self, name: str) -> dict[str, Any]:
        def read(kube: Kube) -> dict[str, Any]:
            try:
                secret: dict[str, Any] = kube.get(SECRETS, name, self.namespace)
            except NotFound:
                raise ExportFailed(
                    f"Secret {self.namespace}/{name} does not exist (its preview Job was deleted?)"
                ) from None
            return secret

        found: dict[str, Any] = self._retrying(
            f"reading Secret {self.namespace}/{name}", read, "get on secrets"
        )
        return found

    def allowed(self, right: Right) -> bool:
        """A SelfSubjectAccessReview of ``right`` (``pkobatch.runner.rights``); True when the
        API server cannot be asked: the call that needs the right then tells."""
        review = access_review("", right.resource, right.verb, right.namespace)
        try:
            answer = self._connection.retrying(
                lambda kube: kube.create(SELF_SUBJECT_ACCESS_REVIEWS, review), self.time_limit
            )
        except KubeError:
            return True
        return bool((answer.get("status") or {}).get("allowed"))

    def remove(self, target: ExportTargetObject, stack: StackRef) -> str:
        resource = self._resource(target.kind)

        def delete(kube: Kube) -> str:
            try:
                existing = kube.get(resource, target.name, self.namespace)
                if not owned_by(existing, stack.uid):
                    return self._not_owned(target, stack)
                kube.delete(resource, target.name, self.namespace, uid=existing["metadata"]["uid"])
            except NotFound:
                return f"{target.describe(self.namespace)} did not exist"
            return f"deleted {target.describe(self.namespace)}"

        note: str = self._retrying(
            f"deleting {target.describe(self.namespace)}",
            delete,
            f"get and delete on {resource.plural}",
        )
        return note

    def close(self) -> None:
        self._connection.close()
