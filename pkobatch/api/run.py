"""The contract between the controller and the runner: what a run gets, what it returns.

A ``Run`` is the controller's decision of what one Job runs (operation, kind, trigger, the
approved plan); it names the Job and is stored on it (annotation ``pkobatch.io/run``), so a
restarted controller adopts the Job. Every part of the controller (plan, fold, retry,
approval, the reflector transforms) reads it from here.

A ``RunSnapshot`` is everything one Job needs, frozen at Job creation: the controller's Job
builder serialises it into the Job (argument ``--snapshot`` as JSON); the runner parses it
and never reads the Stack. Secret *values* are never in the snapshot: it names the
environment variables (filled by the kubelet from ``secretKeyRef``) that hold them — values
the Stack holds inline (``spec.secrets``, ``Literal`` refs of ``secretsRef`` and ``gitAuth``)
go into a Secret the controller creates for the run.

A snapshot too large for one command-line argument (``MAX_INLINE_SNAPSHOT_BYTES``) travels in
ConfigMaps instead (``--snapshot-configmap``, in parts of at most ``SNAPSHOT_PART_BYTES``), and
the Job records its SHA-256 (``--snapshot-sha256``), which the runner checks: the Job still
says exactly what ran.

A ``RunResult`` is what the runner writes to the result ConfigMap under ``result.json``
(``result_config_map``, with ``result_labels``; the controller builds the same ConfigMap from
a result sent in the termination message).
Both carry ``schemaVersion`` so that a controller can reject a runner it does not
understand instead of misreading it.

The controller trusts a result only when the run's own pod vouches for it: as its last step
the runner writes ``result_digest_line`` — the SHA-256 of the exact ``result.json`` text — to
its container's termination message file, which the kubelet copies into the pod's status,
where no namespace user can write (``digest_in_message`` reads it back; docs/security.md).

A run whose ServiceAccount may not write ConfigMaps (a PKO manifest grants it nothing of
pkobatch's) sends its result through that same channel instead: ``inline_result_message``,
``pkobatch.io/result/v1 gz:<base64 of gzip of result.json>``, at most
``MAX_TERMINATION_MESSAGE_BYTES`` (the kubelet keeps no more); ``result_in_message`` reads it
back, and the controller creates the result ConfigMap from it.

A run that may not even read the ConfigMaps of its large snapshot (its ServiceAccount lacks
``get`` on ConfigMaps) has no result to send: it names the ConfigMap it was refused instead
(``snapshot_forbidden_message``; ``snapshot_forbidden_in_message`` reads it back), so the
controller fails the run as ``MissingPermission`` rather than retrying it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from pkobatch.api.constants import (
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    MAX_LABEL_VALUE_LENGTH,
    OPERATION_LABEL,
    RESULT_KEY,
    RESULT_LABEL,
    RUN_ANNOTATION,
    SHARD_LABEL,
    STACK_LABEL,
    FailedStep,
    Operation,
    ResultReason,
)

SNAPSHOT_SCHEMA_VERSION: Final = "pkobatch.io/run-snapshot/v1"
RESULT_SCHEMA_VERSION: Final = "pkobatch.io/run-result/v1"
# Bounds that keep a result ConfigMap far below the 1 MiB object limit.
MAX_RESULT_BYTES: Final = 512 * 1024
# Outputs kept in a result (they end up in status.outputs, which kubectl shows in full).
MAX_RESULT_OUTPUTS: Final = 1000
SECRET_PLACEHOLDER: Final = "[secret]"

# How the snapshot reaches the runner (the Job builder writes these, ``pkobatch job run`` reads).
SNAPSHOT_FLAG: Final = "--snapshot"
SNAPSHOT_CONFIGMAP_FLAG: Final = "--snapshot-configmap"
SNAPSHOT_SHA256_FLAG: Final = "--snapshot-sha256"
SNAPSHOT_KEY: Final = "snapshot.json"
# The termination message of a run refused its snapshot's ConfigMap: this prefix, then
# NAMESPACE/NAME of that ConfigMap.
SNAPSHOT_FORBIDDEN_PREFIX: Final = "pkobatch.io/snapshot-forbidden/v1 "
# One argument may hold at most 128 KiB on Linux (MAX_ARG_STRLEN), all of them together with
# the environment about 2 MiB; a larger snapshot goes into ConfigMaps (1 MiB each at most).
MAX_INLINE_SNAPSHOT_BYTES: Final = 64 * 1024
SNAPSHOT_PART_BYTES: Final = 768 * 1024
# PKO's dynamic environment: the file (dotenv lines) this variable names, which a template's
# init container may write; the runner passes its variables to Pulumi (docs/runner.md).
DYNAMIC_ENV_VAR: Final = "PULUMI_ENV"
# The run's Job's UID, from the pod label the Job controller sets (downward API): the runner
# owns its result by it without reading the Job.
JOB_UID_ENV: Final = "PKOBATCH_JOB_UID"
# Where the runner keeps plugins, package caches and virtualenvs; the controller sets it
# when it mounts the run cache (pkobatch.controller.run_cache).
CACHE_DIR_ENV: Final = "PKOBATCH_CACHE_DIR"
# What the runner prunes that cache down to, in bytes; the controller sets it from the run
# cache claim's capacity.
CACHE_MAX_BYTES_ENV: Final = "PKOBATCH_CACHE_MAX_BYTES"
# PKO's bound on a Flux artifact's unpacked size, in bytes (-1: none): the controller gives it
# to runs of its own setting (PKOBATCH_JOB__FLUX_MAX_UNTAR_SIZE_BYTES).
MAX_UNTAR_SIZE_ENV: Final = "FLUX_MAX_UNTAR_SIZE_BYTES"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
# Where the runner writes its result's digest: the container's terminationMessagePath (the
# Job builder sets both to the same path; the local node agent maps it to a file of its own).
TERMINATION_MESSAGE_PATH_ENV: Final = "PKOBATCH_TERMINATION_MESSAGE_PATH"
TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
# The one line of a run's termination message: this prefix, then "sha256:<hex>" (the result
# is in its ConfigMap) or "gz:<base64>" (the result itself).
RESULT_DIGEST_PREFIX: Final = "pkobatch.io/result/v1 "
INLINE_RESULT_MARK: Final = "gz:"
# The kubelet cuts a termination message to 4096 bytes.
MAX_TERMINATION_MESSAGE_BYTES: Final = 4096


def snapshot_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def result_digest(text: str) -> str:
    """``sha256:<hex>`` of ``result.json`` as written (its UTF-8 bytes)."""
    return f"sha256:{snapshot_sha256(text)}"


def result_digest_line(text: str) -> str:
    """The termination message of a run whose ``result.json`` is ``text``."""
    return f"{RESULT_DIGEST_PREFIX}{result_digest(text)}\n"


def digest_in_message(message: str) -> str:
    """The result digest a termination message names; "" when it is not a run's digest line."""
    line = message.strip()
    if "\n" in line or not line.startswith(RESULT_DIGEST_PREFIX + "sha256:"):
        return ""
    return line.removeprefix(RESULT_DIGEST_PREFIX)


def inline_result_message(text: str) -> str:
    """The termination message that carries ``result.json`` (``text``) itself; it may be
    longer than ``MAX_TERMINATION_MESSAGE_BYTES``: the caller makes the result fit."""
    packed = base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")
    return f"{RESULT_DIGEST_PREFIX}{INLINE_RESULT_MARK}{packed}\n"


def result_in_message(message: str) -> str:
    """The ``result.json`` a termination message carries; "" when it carries none (or a
    damaged one, which then counts as none)."""
    line = message.strip()
    if "\n" in line or not line.startswith(RESULT_DIGEST_PREFIX + INLINE_RESULT_MARK):
        return ""
    packed = line.removeprefix(RESULT_DIGEST_PREFIX + INLINE_RESULT_MARK)
    try:
        return gzip.decompress(base64.b64decode(packed, validate=True)).decode("utf-8")
    except (ValueError, OSError, EOFError):
        return ""


def snapshot_configmap_name(job: str, index: int) -> str:
    """The ConfigMap holding part ``index`` of the snapshot of run ``job``."""
    return f"{job}-snapshot-{index}"


def snapshot_forbidden_message(ref: str) -> str:
    """The termination message of a run refused ``get`` on its snapshot's ConfigMap ``ref``
    (NAMESPACE/NAME)."""
    return f"{SNAPSHOT_FORBIDDEN_PREFIX}{ref}\n"


def snapshot_forbidden_in_message(message: str) -> str:
    """The snapshot ConfigMap (NAMESPACE/NAME) a termination message says the run was refused;
    "" when it says no such thing."""
    line = message.strip()
    if "\n" in line or not line.startswith(SNAPSHOT_FORBIDDEN_PREFIX):
        return ""
    return line.removeprefix(SNAPSHOT_FORBIDDEN_PREFIX)


def split_snapshot(text: str, part_bytes: int = SNAPSHOT_PART_BYTES) -> list[str]:
    """``text`` in parts of at most ``part_bytes`` UTF-8 bytes, cut between characters."""
    data = text.encode("utf-8")
    parts: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + part_bytes, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte
            end -= 1
        parts.append(data[start:end].decode("utf-8"))
        start = end
    return parts


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class StackRef(_Model):
    name: str
    namespace: str
    uid: str = ""


class ProjectInfo(_Model):
    name: str
    runtime: str


class ValueFromEnv(_Model):
    """A config value whose content the kubelet puts into environment variable ``env``."""

    env: str
    secret: bool = False
    json_value: bool = Field(default=False, alias="json")


class GitAuthEnv(_Model):
    """Names of the environment variables that hold git credentials (never the values)."""

    username_env: str | None = Field(default=None, alias="usernameEnv")
    password_env: str | None = Field(default=None, alias="passwordEnv")
    token_env: str | None = Field(default=None, alias="tokenEnv")
    ssh_private_key_env: str | None = Field(default=None, alias="sshPrivateKeyEnv")
    ssh_passphrase_env: str | None = Field(default=None, alias="sshPassphraseEnv")
    github_app_id_env: str | None = Field(default=None, alias="githubAppIDEnv")
    github_app_installation_id_env: str | None = Field(
        default=None, alias="githubAppInstallationIDEnv"
    )
    github_app_private_key_env: str | None = Field(default=None, alias="githubAppPrivateKeyEnv")


class ProgramSnapshot(_Model):
    """A ``Program`` as the controller observed it, rendered: the run uses exactly this."""

    name: str
    # The Program's generation; reported as the run's commit.
    revision: str
    # The rendered Pulumi.yaml (``pkobatch.api.program.render_project``).
    project: str


class FluxArtifact(_Model):
    """``status.artifact`` of the Flux source a Stack names, as the controller observed it."""

    kind: str
    name: str
    url: str
    revision: str
    # "<algorithm>:<hex>" (Flux's format); the runner refuses an artifact that differs.
    digest: str = ""
    # sha256 hex: what Flux's source API published before ``digest`` (v1beta2 ``checksum``);
    # verified when there is no digest.
    checksum: str = ""


# The key of a plan Secret that holds the gzip-compressed plan file.
PLAN_KEY: Final = "plan.json.gz"
PLAN_ID_PREFIX: Final = "plan-"
# A Secret holds at most 1 MiB; a compressed plan larger than this fails the preview.
MAX_PLAN_BYTES: Final = 900 * 1024
# Resources of a plan listed in a result (and status.approval.resources).
MAX_PLANNED_RESOURCES: Final = 100


def plan_id(plan: bytes, commit: str, spec: Mapping[str, Any]) -> str:
    """The id an approval names: a digest of the plan file, the commit and the spec.

    ``spec.approval`` is left out (approving by spec changes it); inline secret values are
    already blanked in a run's spec, and the plan file holds secrets only as ciphertext.
    """
    reviewed = {key: value for key, value in spec.items() if key != "approval"}
    digest = hashlib.sha256()
    for part in (plan, commit.encode(), json.dumps(reviewed, sort_keys=True).encode()):
        digest.update(hashlib.sha256(part).digest())
    return PLAN_ID_PREFIX + digest.hexdigest()[:20]


class PlanRef(_Model):
    """A saved plan: the Secret that holds it (owned by its preview Job) and its id."""

    secret: str
    # Empty when saving (the preview computes it); the approved id when applying.
    id: str = ""


class RunSnapshot(_Model):
    schema_version: Literal["pkobatch.io/run-snapshot/v1"] = Field(
        default=SNAPSHOT_SCHEMA_VERSION, alias="schemaVersion"
    )
    operation: Operation
    # A drift check is a refresh in preview mode: it changes nothing and counts drift.
    drift_check: bool = Field(default=False, alias="driftCheck")
    stack: StackRef
    job_name: str = Field(alias="jobName")
    generation: int = 0
    reconcile_request: str = Field(default="", alias="reconcileRequest")
    # The canonical Stack spec (aliases normalised), exactly as the run must see it.
    spec: dict[str, Any]
    # Source commit the controller resolved for this run ("" = let the runner resolve it).
    commit: str = ""
    # Project info from the last successful run: lets destroy run when the source is gone.
    project_info: ProjectInfo | None = Field(default=None, alias="projectInfo")
    config_from_env: dict[str, ValueFromEnv] = Field(default_factory=dict, alias="configFromEnv")
    # spec.secrets key -> variable holding its value (the spec's own value is blanked).
    secrets_from_env: dict[str, str] = Field(default_factory=dict, alias="secretsFromEnv")
    git_auth: GitAuthEnv | None = Field(default=None, alias="gitAuth")
    # Environment variables whose values are secret (envRefs of type Secret, the access
    # token): the runner scrubs their values from logs, messages and outputs.
    secret_env: list[str] = Field(default_factory=list, alias="secretEnv")
    # Hosts to which git credentials may go over plain http:// (the operator's
    # PKOBATCH_INSECURE_HTTP_GIT_HOSTS); the runner refuses every other http:// host.
    insecure_http_git_hosts: list[str] = Field(default_factory=list, alias="insecureHttpGitHosts")
    # spec.programRef: the Program to run (None when the Program was gone at Job creation:
    # only a destroy from the stack's state can then run).
    program: ProgramSnapshot | None = None
    # spec.fluxSource: the artifact to download (None when the source had none at Job
    # creation: only a destroy from the stack's state can then run).
    flux: FluxArtifact | None = None
    # Where the result ConfigMap goes; empty disables writing (embedded `pkobatch run`).
    result_config_map: str = Field(default="", alias="resultConfigMap")
    # This Stack's Jobs that had finished (so had no running pod) when this one was made:
    # a Pulumi lock created by one of their pods is stale (pkobatch.runner.locks).
    ended_runs: list[str] = Field(default_factory=list, alias="endedRuns")
    # spec.approval: a preview saves its plan into this Secret (``save_plan``); an approved
    # up applies exactly the plan in this Secret, refusing one whose id differs.
    save_plan: PlanRef | None = Field(default=None, alias="savePlan")
    apply_plan: PlanRef | None = Field(default=None, alias="applyPlan")


RunState = Literal["succeeded", "failed"]


class PlannedStep(_Model):
    urn: str
    op: str


class RunResult(_Model):
    schema_version: Literal["pkobatch.io/run-result/v1"] = Field(
        default=RESULT_SCHEMA_VERSION, alias="schemaVersion"
    )
    operation: Operation
    drift_check: bool = Field(default=False, alias="driftCheck")
    state: RunState
    reason: ResultReason
    failed_step: FailedStep | None = Field(default=None, alias="failedStep")
    message: str = ""
    stack: StackRef
    job_name: str = Field(alias="jobName")
    generation: int = 0
    reconcile_request: str = Field(default="", alias="reconcileRequest")
    commit: str = ""
    start_time: datetime | None = Field(default=None, alias="startTime")
    end_time: datetime | None = Field(default=None, alias="endTime")
    outputs: dict[str, Any] = Field(default_factory=dict)
    secret_outputs: list[str] = Field(default_factory=list, alias="secretOutputs")
    # Operation counts from Pulumi's summary, e.g. {"create": 2, "same": 1}.
    changes: dict[str, int] = Field(default_factory=dict)
    drifted_resources: int | None = Field(default=None, alias="driftedResources")
    permalink: str = ""
    pulumi_version: str = Field(default="", alias="pulumiVersion")
    project_info: ProjectInfo | None = Field(default=None, alias="projectInfo")
    # What executed the program: "pulumi-language-<runtime>", or "inline-python" when a
    # Python program ran in the runner's interpreter ("" for a destroy from state).
    language_host: str = Field(default="", alias="languageHost")
    # Stale Pulumi locks the run removed before it could run, one description each.
    cleared_locks: list[str] = Field(default_factory=list, alias="clearedLocks")
    # A preview that saved a plan (snapshot.savePlan): its id and the resources it changes.
    plan_id: str = Field(default="", alias="planID")
    planned_resources: list[PlannedStep] = Field(default_factory=list, alias="plannedResources")
    planned_resource_count: int = Field(default=0, alias="plannedResourceCount")
    truncated: bool = False

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


RunKind = Literal["sync", "request", "drift", "approval"]
"""Why a run exists: the Stack's normal operation, a CLI operation request, a drift check,
the preview that saves a plan for approval (spec.approval)."""
# Trigger of the update that remediates drift; it always refreshes first.
REMEDIATE_TRIGGER_PREFIX: Final = "remediate:"
# Triggers of a run for a spec.schedule time, and of a drift check for its schedule time.
SCHEDULE_TRIGGER_PREFIX: Final = "schedule:"
DRIFT_TRIGGER_PREFIX: Final = "drift:"


@dataclass(frozen=True)
class Run:
    """What one Job runs; stored on the Job (annotation ``pkobatch.io/run``) for adoption."""

    operation: Operation
    kind: RunKind
    generation: int
    reconcile_request: str
    commit: str
    # Distinguishes runs of the same generation and request: the retry, commit, schedule
    # time or request token that caused this run. Part of the Job name.
    trigger: str
    # The operation-request annotation value, for kind "request".
    request: str = ""
    # An approved up (spec.approval): the plan's id and the Secret that holds it.
    plan: str = ""
    plan_secret: str = ""

    def to_annotation(self) -> str:
        # Every field is a str or an int: no need for asdict's deep copy.
        fields = {field.name: getattr(self, field.name) for field in dataclass_fields(self)}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> Run | None:
        """The run a Job was created for; None for a Job pkobatch did not create."""
        annotations = (job.get("metadata") or {}).get("annotations") or {}
        text = annotations.get(RUN_ANNOTATION)
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(
                operation=data["operation"],
                kind=data["kind"],
                generation=int(data["generation"]),
                reconcile_request=str(data["reconcile_request"]),
                commit=str(data["commit"]),
                trigger=str(data["trigger"]),
                request=str(data.get("request", "")),
                plan=str(data.get("plan", "")),
                plan_secret=str(data.get("plan_secret", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


# The shard label puts the result in the watches of its Stack's controller shard.
_COPIED_JOB_LABELS: Final = (MANAGED_BY_LABEL, STACK_LABEL, OPERATION_LABEL, SHARD_LABEL)


def result_labels(job_labels: Mapping[str, str], stack_name: str, operation: str) -> dict[str, str]:
    """The result ConfigMap's labels: the run's Job's own (so the stack label's hashing
    stays the Job builder's alone), or computed when the Job could not be read."""
    labels = {key: job_labels[key] for key in _COPIED_JOB_LABELS if key in job_labels}
    labels.setdefault(MANAGED_BY_LABEL, MANAGED_BY_VALUE)
    labels.setdefault(OPERATION_LABEL, operation)
    if STACK_LABEL not in labels and len(stack_name) <= MAX_LABEL_VALUE_LENGTH:
        labels[STACK_LABEL] = stack_name
    return labels


def result_config_map(
    result: RunResult,
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    job_uid: str | None,
) -> dict[str, Any]:
    """The result ConfigMap, owned by the run's Job when its UID is known; immutable, so
    nobody changes it in place (it can only be deleted, which the controller reports)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels, RESULT_LABEL: result.state},
    }
    if job_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": result.job_name,
                "uid": job_uid,
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "immutable": True,
        "data": {RESULT_KEY: result.to_json()},
    }
