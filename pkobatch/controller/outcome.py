"""How a run ended: its one ``Outcome``, from its Job, its pods and its result (pure).

A run ends in exactly one ``Outcome``, once its Job has finished (Complete or Failed) —
never before, whatever ConfigMap exists by then:

- the runner wrote its result ConfigMap and the run's pod vouches for it: the result.
  ``trusted_result`` accepts it only if the ConfigMap is owned by this very Job (name and
  UID; or, written by a runner that knew neither, without owner and created no earlier than
  the Job) and belongs to this Stack, and its ``result.json`` hashes to the digest a pod of
  this Job reported in its ``pulumi`` container's termination message — which the kubelet
  writes into the pod's status, where no namespace user can (docs/security.md). A result
  that fails any of this is ignored with a Warning Event (``ResultRejected``, naming the
  ConfigMap and why, never its content); one the pod reported but that is gone was deleted
  (``ResultDeleted``). A success counts only from a Job that completed: the runner exits
  non-zero after a failure, so a "succeeded" result of a failed Job is not believed either;
- the Job ended without a (trusted) result: a failure whose reason comes from the Job's
  conditions — ``DeadlineExceeded`` for ``activeDeadlineSeconds``, ``Interrupted`` when the
  pod failure policy matched ``DisruptionTarget`` (eviction, preemption, drain) — or from
  its pod's status (``pod_causes.pod_cause``: ``OOMKilled``, ``Evicted``, ``ImagePullFailed``,
  ``ContainerConfigError``, ``Unschedulable``, in words that say what to change;
  ``Interrupted`` for a container its node lost, as a reboot loses it), otherwise
  ``JobFailed`` with the Job controller's message; a Job that completed without one is
  ``JobFailed`` too. A pod whose run was refused its snapshot's ConfigMap (its ServiceAccount
  lacks ``get`` on ConfigMaps, ``refused_snapshot``) makes it ``MissingPermission``: a retry
  cannot help, so the Stack stalls naming the right to grant. A run whose pod is gone has no
  result to trust: it fails the same way and, like every failed run, is retried;
- the Job's pod has not been able to start for ``POD_START_LIMIT`` (image pull errors, a
  container that cannot be created, no node for it) — for ``FIXED_BY_SPEC_LIMIT`` when only
  a change of the spec can start it (an image the node must never pull, an invalid image
  name): that cause, and the Job is deleted so the retry is not blocked — rather than an
  hour of waiting for the Job's deadline;
- a spec change (new generation) came while the Job's sync run had not started its
  ``pulumi`` container (``superseded``, ``run_not_started``): ``Superseded``, and ``decide``
  deletes the Job so the new spec runs at once, as PKO does;
- the Job vanished (deleted by someone, garbage-collected): ``Interrupted``;
- the Job controller cannot create its pod (a missing ServiceAccount, a ResourceQuota, an
  admission webhook or policy): ``PodCreationFailed`` with the API server's words, taken
  from the Job's ``FailedCreate`` Event — the Job would otherwise wait for its pod until its
  deadline (an hour by default), and every retry again;
- the run was cancelled on request: ``Cancelled``.

``pkobatch.controller.fold`` records an outcome in the Stack's status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from pydantic import ValidationError

from pkobatch.api.constants import (
    RESULT_KEY,
    RUN_CONTAINER_NAME,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import job_finished, true_condition
from pkobatch.api.run import (
    Run,
    RunResult,
    RunState,
    digest_in_message,
    result_digest,
    result_in_message,
    snapshot_configmap_name,
    snapshot_forbidden_in_message,
)
from pkobatch.api.timestamps import parse_time
from pkobatch.controller.pod_causes import (
    FIXED_BY_SPEC_LIMIT,
    POD_START_LIMIT,
    pod_cause,
)

# Job condition reasons (batch/v1) and the pod failure policy's message for disruptions.
JOB_REASON_DEADLINE: Final = "DeadlineExceeded"
JOB_REASON_POD_FAILURE_POLICY: Final = "PodFailurePolicy"
POD_CREATION_FAILED: Final = "PodCreationFailed"
DISRUPTION_CONDITION: Final = "DisruptionTarget"
# Warning Events about a run's result ConfigMap that was not folded.
EVENT_RESULT_REJECTED: Final = "ResultRejected"
EVENT_RESULT_DELETED: Final = "ResultDeleted"
# Where a cached result ConfigMap keeps the digest of its whole ``result.json`` (the cache
# keeps only the fields folding reads: ``pkobatch.controller.cache_transforms``).
RESULT_DIGEST_KEY: Final = "pkobatch.io/resultDigest"


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """An Event to post about the Stack."""

    type: EventType
    reason: str
    message: str


def job_deleting(job: Mapping[str, Any]) -> bool:
    return bool((job.get("metadata") or {}).get("deletionTimestamp"))


# A Job without a pod this long after its creation may be unable to create one: only then
# is it worth asking for the Job controller's FailedCreate Events (and again this often).
POD_CREATION_GRACE: Final = timedelta(seconds=10)
POD_CREATION_RECHECK: Final = timedelta(seconds=20)
_POD_COUNTS: Final = ("active", "ready", "succeeded", "failed", "terminating")


def job_pod_ready(job: Mapping[str, Any]) -> bool:
    """The Job controller records the Job's pod created and ready: nothing to look at in it
    until the run ends."""
    status = job.get("status") or {}
    return bool(status.get("active") and status.get("ready"))


def job_without_pod(job: Mapping[str, Any], now: datetime) -> bool:
    """The Job is unfinished, has never had a pod, and is older than ``POD_CREATION_GRACE``."""
    status = job.get("status") or {}
    if job_finished(job) or job_deleting(job) or any(status.get(k) for k in _POD_COUNTS):
        return False
    created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and now - created >= POD_CREATION_GRACE


# How the API server's Pod Security admission begins its refusal of a pod.
POD_SECURITY_REFUSAL: Final = "violates PodSecurity"


def pod_creation_outcome(job: Mapping[str, Any], failure: str, now: datetime) -> Outcome:
    name = (job.get("metadata") or {}).get("name")
    if POD_SECURITY_REFUSAL in failure:
        fix = (
            "The namespace's Pod Security level (label pod-security.kubernetes.io/enforce) "
            "refuses the run's pod: use spec.workspaceTemplate.spec.securityProfile "
            "restricted (the default), and no podTemplate or jobTemplate field that relaxes it"
        )
    else:
        fix = (
            "Fix the cause (e.g. create the ServiceAccount named in spec.serviceAccountName, "
            "raise the namespace's ResourceQuota, satisfy its admission policies)"
        )
    return Outcome(
        "failed",
        POD_CREATION_FAILED,
        bound_message(
            f"run {name} could not start: the Job controller cannot create its pod: {failure}. "
            f"{fix}; the run is retried with the normal backoff"
        ),
        now,
    )


def _newest(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest of a Job's pods (a Job of pkobatch has one, backoffLimit 0)."""
    if not pods:
        return None
    return max(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")))


def superseded(job: Mapping[str, Any], generation: int) -> bool:
    """The unfinished Job runs a sync of an older generation of its Stack's spec: a spec
    change came after it started, and replaces it if its run has not started yet."""
    run = Run.from_job(job)
    return (
        run is not None
        and run.kind == "sync"
        and run.generation < generation
        and not job_finished(job)
        and not job_deleting(job)
    )


def run_not_started(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> bool:
    """No pod of the unfinished Job has started its ``pulumi`` container (pending, waiting
    for its image, a Secret it names, or a node), so deleting it interrupts no Pulumi
    operation. Pulumi runs in that container only: a user's init container still running
    is no start."""
    if job_finished(job) or (job.get("status") or {}).get("ready"):
        return False
    for pod in pods:
        if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return False
        for container in (pod.get("status") or {}).get("containerStatuses") or ():
            if container.get("name") != RUN_CONTAINER_NAME:
                continue
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                if state.get("running") or state.get("terminated"):
                    return False
    return True


def superseded_outcome(job_name: str, generation: int, now: datetime) -> Outcome:
    return Outcome(
        "failed",
        "Superseded",
        f"run {job_name} had not started when the Stack's spec changed (generation "
        f"{generation}): it was deleted so the new spec runs at once",
        now,
    )


def pod_status_matters(job: Mapping[str, Any], now: datetime, generation: int = 0) -> bool:
    """Whether the Job's pods must be read: it has finished (its pod vouches for its result,
    ``trusted_result``, and tells why a run without one failed), it runs but its pod has
    not become ready within ``FIXED_BY_SPEC_LIMIT`` (the first start limit), or a spec
    change of ``generation`` supersedes it (``run_not_started`` decides whether it is
    replaced)."""
    if job_finished(job):
        return True
    status = job.get("status") or {}
    if job_deleting(job) or status.get("ready"):
        return False
    if superseded(job, generation):
        return True
    if not status.get("active"):
        return False
    created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and now - created >= FIXED_BY_SPEC_LIMIT


def next_pod_start_check(created: datetime, now: datetime) -> datetime:
    """When a not-ready run created at ``created`` next reaches a start limit."""
    first = created + FIXED_BY_SPEC_LIMIT
    return first if now < first else created + POD_START_LIMIT


def _duration_words(duration: timedelta) -> str:
    seconds = int(duration.total_seconds())
    return f"{seconds // 60} minutes" if seconds % 60 == 0 else f"{seconds} seconds"


def pod_start_outcome(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now: datetime
) -> Outcome | None:
    """A failed outcome for a running Job whose pod has not been able to start for
    its cause's ``start_limit``; None while it may still start."""
    status = job.get("status") or {}
    newest = _newest(pods)
    if job_finished(job) or job_deleting(job) or status.get("ready") or newest is None:
        return None
    created = parse_time((newest.get("metadata") or {}).get("creationTimestamp"))
    cause = pod_cause(newest)
    if cause is None or not cause.waiting or created is None:
        return None
    if now - created < cause.start_limit:
        return None
    name = (job.get("metadata") or {}).get("name")
    return Outcome(
        "failed",
        cause.reason,
        bound_message(
            f"run {name} could not start for {_duration_words(cause.start_limit)}: "
            f"{cause.message}; the run is "
            "retried with the normal backoff"
        ),
        now,
    )


@dataclass(frozen=True)
class Outcome:
    """How one run ended."""

    state: RunState
    reason: str
    message: str
    finished_at: datetime
    result: RunResult | None = None
    # A Warning Event about the run's result ConfigMap, which was not folded (rejected, or
    # deleted before it could be).
    result_event: Event | None = None

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"


def read_result(
    configmap: Mapping[str, Any] | None, job: Mapping[str, Any], stack_uid: str
) -> tuple[RunResult | None, str]:
    """The run's result if ``configmap`` is the genuine result of ``job``; else a problem."""
    if configmap is None:
        return None, ""
    job_meta = job.get("metadata") or {}
    meta = configmap.get("metadata") or {}
    owners = meta.get("ownerReferences") or ()
    owned = any(
        owner.get("kind") == "Job"
        and owner.get("name") == job_meta.get("name")
        and owner.get("uid") == job_meta.get("uid")
        for owner in owners
    )
    if not owners:
        written, started = (
            parse_time(meta.get("creationTimestamp")),
            parse_time(job_meta.get("creationTimestamp")),
        )
        owned = written is not None and started is not None and written >= started
    if meta.get("name") != job_meta.get("name") or not owned:
        return None, (
            f"ConfigMap {meta.get('name')} is not owned by Job {job_meta.get('name')} "
            f"(uid {job_meta.get('uid')}); it was ignored"
        )
    text = (configmap.get("data") or {}).get(RESULT_KEY)
    if not text:
        return None, f"ConfigMap {meta.get('name')} has no {RESULT_KEY}"
    return _parse_result(text, job, stack_uid, f"{RESULT_KEY} of {meta.get('name')}")


def _parse_result(
    text: str, job: Mapping[str, Any], stack_uid: str, where: str
) -> tuple[RunResult | None, str]:
    """``text`` as the result of ``job``; else a problem naming ``where`` it came from."""
    try:
        result = RunResult.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"])
        return None, (
            f"{where} is not a result this controller understands "
            f"({field}: {first['msg']}); make sure the runner image matches the controller"
        )
    if result.job_name != (job.get("metadata") or {}).get("name") or (
        stack_uid and result.stack.uid and result.stack.uid != stack_uid
    ):
        return None, f"{where} was written for another run; ignored"
    return result, ""


def result_text_digest(configmap: Mapping[str, Any]) -> str:
    """The digest of the ConfigMap's whole ``result.json``: as the cache recorded it, else
    computed ("" when it holds none)."""
    cached = configmap.get(RESULT_DIGEST_KEY)
    if isinstance(cached, str):
        return cached
    text = (configmap.get("data") or {}).get(RESULT_KEY)
    return result_digest(text) if isinstance(text, str) else ""


def _termination_messages(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
) -> list[str] | None:
    """What the run container of each pod of ``job`` left as its termination message (the
    kubelet copies its termination message file into the pod's status); None when no pod of
    the Job is left."""
    uid = (job.get("metadata") or {}).get("uid")
    messages: list[str] | None = None
    for pod in pods:
        owners = (pod.get("metadata") or {}).get("ownerReferences") or ()
        if not any(
            o.get("kind") == "Job" and o.get("uid") == uid and o.get("controller") for o in owners
        ):
            continue
        if messages is None:
            messages = []
        for container in (pod.get("status") or {}).get("containerStatuses") or ():
            terminated = (container.get("state") or {}).get("terminated") or {}
            if container.get("name") == RUN_CONTAINER_NAME and terminated.get("message"):
                messages.append(str(terminated["message"]))
    return messages


def vouched_digests(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> set[str] | None:
    """The result digests the pods of ``job`` reported when their run container ended; None
    when no pod of the Job is left."""
    messages = _termination_messages(job, pods)
    if messages is None:
        return None
    return {digest for digest in map(digest_in_message, messages) if digest}


def inline_result(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """The ``result.json`` a pod of ``job`` sent in its termination message, because its run
    may not write the result ConfigMap ("" when none did)."""
    messages = _termination_messages(job, pods) or ()
    texts = [text for text in map(result_in_message, messages) if text]
    return texts[-1] if texts else ""


def refused_snapshot(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str:
    """The name of this run's snapshot ConfigMap that a pod of ``job`` says its run was
    refused (its ServiceAccount may not get ConfigMaps); "" when none says so. Only a
    ConfigMap of this Job's snapshot counts, in its namespace."""
    meta = job.get("metadata") or {}
    for message in _termination_messages(job, pods) or ():
        namespace, _, configmap = snapshot_forbidden_in_message(message).partition("/")
        index = configmap.rpartition("-")[2]
        if (
            namespace == meta.get("namespace")
            and index.isdigit()
            and configmap == snapshot_configmap_name(str(meta.get("name")), int(index))
        ):
            return configmap
    return ""


def _service_account(pods: Sequence[Mapping[str, Any]]) -> str:
    newest = _newest(pods)
    spec = (newest or {}).get("spec") or {}
    return str(spec.get("serviceAccountName") or "default")


def refused_snapshot_outcome(
    job: Mapping[str, Any],
    configmap: str,
    pods: Sequence[Mapping[str, Any]],
    finished_at: datetime,
) -> Outcome:
    meta = job.get("metadata") or {}
    namespace = meta.get("namespace")
    account = _service_account(pods)
    return Outcome(
        "failed",
        "MissingPermission",
        f"run {meta.get('name')} could not read its snapshot: the run's ServiceAccount "
        f"{account} may not get configmaps in namespace {namespace} (ConfigMap {configmap}: "
        "a snapshot over 64 KiB travels in ConfigMaps the run reads itself); nothing was run. "
        f"Grant it get on configmaps in namespace {namespace} — bind the pkobatch-runner "
        "ClusterRole to ServiceAccount "
        f"{account} with a RoleBinding in this namespace (docs/install.md) — or make the spec "
        "smaller (less inline config)",
        finished_at,
    )


def trusted_result(
    configmap: Mapping[str, Any] | None,
    job: Mapping[str, Any],
    stack_uid: str,
    pods: Sequence[Mapping[str, Any]],
) -> tuple[RunResult | None, str]:
    """The run's result if the pod of ``job`` sent it in its termination message, or if
    ``configmap`` is the result the pod wrote and vouched for; else why it is not ("" when
    there is no ConfigMap). The pod's own report comes first: the kubelet wrote it, and a
    ConfigMap beside it is the one the controller created from it (or a forgery)."""
    text = inline_result(job, pods)
    if text:
        job_name = (job.get("metadata") or {}).get("name")
        return _parse_result(text, job, stack_uid, f"the result the pod of run {job_name} sent")
    result, problem = read_result(configmap, job, stack_uid)
    if result is None or configmap is None:
        return None, problem
    name = (configmap.get("metadata") or {}).get("name")
    job_name = (job.get("metadata") or {}).get("name")
    digests = vouched_digests(job, pods)
    if digests is None:
        return None, (
            f"ConfigMap {name} cannot be verified: the pod of run {job_name}, which reports "
            "the digest of the result it wrote, is gone; it was ignored"
        )
    if not digests:
        return None, (
            f"ConfigMap {name} was not vouched for by the pod of run {job_name} (it reported no "
            "result digest when it ended); it was ignored"
        )
    if result_text_digest(configmap) not in digests:
        return None, (
            f"ConfigMap {name} is not the result the pod of run {job_name} wrote (its "
            f"{RESULT_KEY} does not match the digest the pod reported); it was ignored"
        )
    return result, ""


def job_outcome(
    job: Mapping[str, Any],
    configmap: Mapping[str, Any] | None,
    stack_uid: str,
    now: datetime,
    pods: Sequence[Mapping[str, Any]] = (),
) -> Outcome | None:
    """The outcome of a run once its Job has finished (None while it runs): its trusted
    result (``trusted_result``; a success only from a Job that completed), else what the
    finished Job and its pod (``pods``: the Job's pods) say."""
    complete = true_condition(job, "Complete")
    failed = true_condition(job, "Failed")
    if complete is None and failed is None:
        return None
    finished_at = parse_time((complete or failed or {}).get("lastTransitionTime")) or now
    name = (job.get("metadata") or {}).get("name")
    result, problem = trusted_result(configmap, job, stack_uid, pods)
    event = Event("Warning", EVENT_RESULT_REJECTED, f"run {name}: {problem}") if problem else None
    if configmap is None and vouched_digests(job, pods):
        problem = (
            f"the run's pod reported writing result ConfigMap {name}, but it is gone: it was "
            "deleted before the controller folded it"
        )
        event = Event("Warning", EVENT_RESULT_DELETED, f"run {name}: {problem}")
    if result is not None and result.state == "succeeded" and complete is None:
        problem = f"its result says the operation succeeded, but Job {name} failed"
        result = None
    if result is not None:
        return Outcome(
            state=result.state,
            reason=result.reason,
            message=result.message,
            finished_at=result.end_time or finished_at,
            result=result,
        )
    outcome = _failed_job_outcome(job, failed, name, problem, finished_at, pods)
    return replace(outcome, result_event=event)


def _failed_job_outcome(
    job: Mapping[str, Any],
    failed: Mapping[str, Any] | None,
    name: Any,
    problem: str,
    finished_at: datetime,
    pods: Sequence[Mapping[str, Any]],
) -> Outcome:
    """A finished run without a trusted result: what its Job (``failed``: its Failed
    condition, None when it completed) and pod say."""
    suffix = f" ({problem})" if problem else ""
    if failed is not None:
        reason = str(failed.get("reason") or "")
        detail = str(failed.get("message") or "")
        newest = _newest(pods)
        cause = pod_cause(newest) if newest is not None else None
        if reason == JOB_REASON_DEADLINE:
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            if cause is not None and cause.waiting:
                return Outcome(
                    "failed",
                    "DeadlineExceeded",
                    f"run {name} reached its deadline of {deadline}s without starting: "
                    f"{cause.message}{suffix}",
                    finished_at,
                )
            return Outcome(
                "failed",
                "DeadlineExceeded",
                f"run {name} exceeded its deadline of {deadline}s and was stopped; raise "
                f"spec.timeoutSeconds if the operation needs longer{suffix}",
                finished_at,
            )
        if reason == JOB_REASON_POD_FAILURE_POLICY and DISRUPTION_CONDITION in detail:
            why = cause.message if cause is not None else detail
            return Outcome(
                "failed",
                "Interrupted",
                f"run {name} was interrupted (eviction, preemption or node drain): {why}; "
                f"it will be retried{suffix}",
                finished_at,
            )
        refused = refused_snapshot(job, pods)
        if refused:
            return refused_snapshot_outcome(job, refused, pods, finished_at)
        if cause is not None:
            return Outcome(
                "failed",
                cause.reason,
                f"run {name} failed: {cause.message}{suffix}",
                finished_at,
            )
        return Outcome(
            "failed",
            "JobFailed",
            f"run {name} failed without a result ({reason or 'Failed'}: {detail}); see "
            f"`pkobatch logs` or the Job's pod for the cause (image pull, OOM, crash){suffix}",
            finished_at,
        )
    if problem:
        return Outcome(
            "failed",
            "JobFailed",
            f"run {name} completed without a result the controller can trust ({problem})",
            finished_at,
        )
    return Outcome(
        "failed",
        "JobFailed",
        f"run {name} completed without writing its result ConfigMap",
        finished_at,
    )


def vanished_outcome(job_name: str, now: datetime) -> Outcome:
    return Outcome(
        "failed",
        "Interrupted",
        f"run {job_name} disappeared before reporting a result (its Job was deleted); "
        "it will be retried",
        now,
    )


def cancelled_outcome(job_name: str, request: str, now: datetime) -> Outcome:
    return Outcome("failed", "Cancelled", f"run {job_name} was cancelled ({request})", now)
