"""The ``pulumi.com/v1`` Stack API: PKO v2.9's spec and status, plus pkobatch's extensions.

Attributes are snake_case, the wire names camelCase (``model_dump(by_alias=True)``). Models
are strict: a manifest that validates is exactly what the API server stores, so
``StackSpec.model_validate(d).to_manifest() == d`` for canonical manifests.

Checking a spec happens in three layers, from cheapest to richest:

1. **CRD schema + CEL** (``pkobatch.api.crd``): types, required fields, enums, and the
   cross-field rules that are cheap in CEL (source and branch/commit exclusivity, one git
   auth method). ``kubectl apply`` fails with a fix-it message.
2. **Model validation** (``StackSpec.model_validate``, raises): the shape of every field
   and the values of pkobatch's own fields (cron syntax, IANA time zone, timeout > 0, Go
   duration). The alias dialect is normalised first (``normalize_spec``); an alias that
   disagrees with its canonical field is an error here.
3. **Semantic problems** (``validate_stack_spec``, returns a list): relations between
   fields and PKO's rules that PKO itself reports as ``Stalled/SpecInvalid`` rather than
   rejecting at admission: git source completeness, ResourceRef type/field agreement,
   deprecated ``Env``/``FS`` refs, cross-namespace Secret refs. These repeat the CEL rules
   because objects stored before the CRD was installed, or by another operator's CRD, never
   went through them.

``load_stack_spec`` runs 2 and 3 and returns everything the controller needs to set
``Stalled/SpecInvalid`` or emit an alias Event.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from pkobatch.api.constants import FLUX_SOURCE_GROUP
from pkobatch.api.cron import load_time_zone
from pkobatch.api.durations import parse_duration
from pkobatch.api.hints import (
    ANY_JSON,
    ATOMIC_LIST,
    FREE_FORM_OBJECT,
    INT32,
    INT64,
    POD_SPEC_TEMPLATE,
    POD_TEMPLATE_SPEC,
    PRESERVE_UNKNOWN,
    CrdHint,
)
from pkobatch.api.operation_request import RequestState
from pkobatch.api.run import ProjectInfo

Int64 = Annotated[int, INT64]
# Bound of every duration in seconds in the spec (365 days). Larger magnitudes overflow time
# arithmetic: Python's timedelta in the controller, Go's time.Duration in the Job controller.
MAX_SPEC_SECONDS: Final = 31_536_000
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
MAX_PULUMI_LOG_LEVEL: Final = 20
FreeFormObject = Annotated[dict[str, Any], FREE_FORM_OBJECT]
ENV_SECRETS_SCHEMA = CrdHint(schema={"type": "array", "items": dict(PRESERVE_UNKNOWN)})


class _Model(BaseModel):
    model_config = ConfigDict(
        strict=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )

    def to_manifest(self) -> dict[str, Any]:
        """The wire form: camelCase keys, only the fields that were set, JSON types."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class _OpenModel(_Model):
    """A template: pkobatch reads the typed fields; everything else is kept as given."""

    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------------------------
# ResourceRef and git auth
# ---------------------------------------------------------------------------------------

ResourceRefType = Literal["Env", "FS", "Secret", "Literal"]
DEPRECATED_REF_TYPES: Final = ("Env", "FS")
# Which sub-field each ResourceRef type reads.
REF_TYPE_FIELDS: Final[Mapping[str, str]] = {
    "Env": "env",
    "FS": "filesystem",
    "Secret": "secret",
    "Literal": "literal",
}


class EnvSelector(_Model):
    name: str = Field(description="Deprecated: name of an environment variable of the operator.")


class FSSelector(_Model):
    path: str = Field(description="Deprecated: path of a file in the operator's filesystem.")


class SecretSelector(_Model):
    name: str = Field(description="Name of the Secret, in the Stack's namespace.")
    key: str = Field(description="Key in the Secret whose value is used.")
    namespace: str | None = Field(
        default=None,
        description="Deprecated: must be empty or the Stack's own namespace.",
    )


# A value that reaches the run in an environment variable: Linux caps one at 128 KiB, so the
# API server refuses a longer one with this limit (4 bytes a character at most in UTF-8).
MAX_ENV_VALUE_CHARS: Final = 32000
ENV_VALUE = CrdHint(extra={"maxLength": MAX_ENV_VALUE_CHARS})


class LiteralRef(_Model):
    value: Annotated[str, ENV_VALUE] = Field(
        description=f"The value itself (at most {MAX_ENV_VALUE_CHARS} characters: it reaches "
        "the run in an environment variable)."
    )


class ResourceRef(_Model):
    type: ResourceRefType = Field(
        description="Where the value comes from: Secret or Literal (Env and FS are deprecated "
        "and rejected)."
    )
    env: EnvSelector | None = Field(default=None, description="Deprecated (type Env).")
    filesystem: FSSelector | None = Field(default=None, description="Deprecated (type FS).")
    secret: SecretSelector | None = Field(default=None, description="For type Secret.")
    literal: LiteralRef | None = Field(default=None, description="For type Literal.")


class SSHAuth(_Model):
    ssh_private_key: ResourceRef = Field(description="The SSH private key.")
    password: ResourceRef | None = Field(
        default=None, description="Passphrase of the private key, if it has one."
    )


class BasicAuth(_Model):
    user_name: ResourceRef = Field(description="User name for HTTP basic auth.")
    password: ResourceRef = Field(description="Password for HTTP basic auth.")


class GitHubAppAuth(_Model):
    app_id: ResourceRef = Field(alias="appID", description="GitHub App ID.")
    installation_id: ResourceRef = Field(
        alias="installationID", description="Installation ID of the GitHub App."
    )
    private_key: ResourceRef = Field(description="Private key (PEM) of the GitHub App.")


GIT_AUTH_METHODS: Final = ("accessToken", "sshAuth", "basicAuth", "githubApp")


class GitAuthConfig(_Model):
    access_token: ResourceRef | None = Field(
        default=None, description="Token used as the password of HTTP basic auth (user 'git')."
    )
    ssh_auth: SSHAuth | None = Field(default=None, description="SSH key authentication.")
    basic_auth: BasicAuth | None = Field(default=None, description="HTTP basic authentication.")
    github_app: GitHubAppAuth | None = Field(
        default=None, description="GitHub App credentials exchanged for an installation token."
    )

    def methods(self) -> list[str]:
        """The wire names of the auth methods that are set."""
        return [name for name in GIT_AUTH_METHODS if getattr(self, to_snake(name)) is not None]


# ---------------------------------------------------------------------------------------
# Sources, config, prerequisites
# ---------------------------------------------------------------------------------------


class FluxSourceReference(_Model):
    api_version: Annotated[str, CrdHint(extra={"maxLength": 253})] = Field(
        description=f"{FLUX_SOURCE_GROUP}/<version>, e.g. {FLUX_SOURCE_GROUP}/v1"
    )
    kind: Annotated[str, CrdHint(extra={"maxLength": 63})] = Field(
        description="GitRepository, Bucket or OCIRepository (or a kind the operator added: "
        "PKOBATCH_EXTRA_FLUX_SOURCE_KINDS)."
    )
    name: str = Field(description="Name of the Flux source, in the Stack's namespace.")


class FluxSource(_Model):
    source_ref: FluxSourceReference = Field(description="The Flux source object.")
    dir: str | None = Field(
        default=None, description="Directory of the artifact that contains Pulumi.yaml."
    )


class ProgramReference(_Model):
    name: str = Field(description="Name of a pulumi.com/v1 Program in the Stack's namespace.")


class ConfigMapRef(_Model):
    name: str = Field(description="Name of the ConfigMap, in the Stack's namespace.")
    key: str = Field(description="Key in the ConfigMap.")
    json_value: bool | None = Field(
        default=None, alias="json", description="Parse the value as JSON (structured config)."
    )


class RequirementSpec(_Model):
    succeeded_within_duration: str | None = Field(
        default=None,
        description="The prerequisite must have succeeded within this duration (e.g. '1h'); "
        "an older success triggers a re-run of the prerequisite first.",
    )

    @field_validator("succeeded_within_duration")
    @classmethod
    def _check_duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value


class PrerequisiteRef(_Model):
    name: str = Field(description="Name of another Stack in the same namespace.")
    requirement: RequirementSpec | None = Field(
        default=None, description="Extra conditions on the prerequisite's last success."
    )


# ---------------------------------------------------------------------------------------
# Templates: free-form, except the parts pkobatch maps onto the Job
# ---------------------------------------------------------------------------------------


class LocalSource(_OpenModel):
    dir: str | None = Field(
        default=None,
        description="Directory inside the image holding the program (used when the Stack "
        "has no source).",
    )


class WorkspaceTemplateSpec(_OpenModel):
    image: str | None = Field(default=None, description="Image of the run's container.")
    image_pull_policy: str | None = Field(
        default=None, description="Pull policy of the run's container."
    )
    service_account_name: str | None = Field(
        default=None,
        description="ServiceAccount of the run's pod (spec.serviceAccountName wins).",
    )
    resources: FreeFormObject | None = Field(
        default=None, description="Resource requests/limits of the run's container."
    )
    env: list[FreeFormObject] | None = Field(
        default=None, description="Extra environment variables (core/v1 EnvVar)."
    )
    env_from: list[FreeFormObject] | None = Field(
        default=None, description="Extra environment sources (core/v1 EnvFromSource)."
    )
    pod_template: Annotated[dict[str, Any], POD_TEMPLATE_SPEC] | None = Field(
        default=None,
        description="PodTemplateSpec merged into the Job's pod template (container 'pulumi' "
        "is the run's container).",
    )
    pulumi_log_level: Annotated[int, INT32] | None = Field(
        default=None,
        ge=0,
        le=MAX_PULUMI_LOG_LEVEL,
        description=f"Pulumi verbosity (-v level) of the run, 0 to {MAX_PULUMI_LOG_LEVEL} "
        "(the bound only refuses values no Pulumi log level uses).",
    )
    local: LocalSource | None = Field(default=None, description="Program baked into the image.")


class WorkspaceTemplate(_OpenModel):
    metadata: FreeFormObject | None = Field(
        default=None, description="No-op in pkobatch (there is no Workspace object)."
    )
    spec: WorkspaceTemplateSpec | None = Field(
        default=None, description="Workspace settings; see docs/migration.md for the mapping."
    )


class UpdateTemplateSpec(_OpenModel):
    parallel: Annotated[int, INT32] | None = Field(
        default=None,
        ge=INT32_MIN,
        le=INT32_MAX,
        description="Resource operations run in parallel (--parallel); a 32-bit integer, "
        "like Pulumi's flag.",
    )
    message: str | None = Field(default=None, description="Update message (--message).")
    expect_no_changes: bool | None = Field(
        default=None, description="Fail if the update would change anything."
    )
    continue_on_error: bool | None = Field(
        default=None, description="Keep going after a resource fails (--continue-on-error)."
    )
    replace: list[str] | None = Field(default=None, description="URNs to replace (--replace).")
    target: list[str] | None = Field(
        default=None, description="URNs to target; overrides spec.targets."
    )
    target_dependents: bool | None = Field(
        default=None, description="Overrides spec.targetDependents."
    )
    refresh: bool | None = Field(default=None, description="Overrides spec.refresh.")
    run_program: bool | None = Field(
        default=None, description="Run the program during destroy/refresh (--run-program)."
    )
    remove: bool | None = Field(
        default=None, description="Remove the stack from the backend after a destroy."
    )


class UpdateTemplate(_OpenModel):
    metadata: FreeFormObject | None = Field(
        default=None, description="No-op in pkobatch (there is no Update object)."
    )
    spec: UpdateTemplateSpec | None = Field(
        default=None, description="Per-run Pulumi options; see docs/migration.md."
    )


class JobTemplateMetadata(_Model):
    labels: dict[str, str] | None = Field(
        default=None, description="Labels added to every Job and its pod."
    )
    annotations: dict[str, str] | None = Field(
        default=None, description="Annotations added to every Job and its pod."
    )


class JobTemplate(_Model):
    metadata: JobTemplateMetadata | None = Field(
        default=None, description="Labels and annotations of the Jobs."
    )
    spec: Annotated[dict[str, Any], POD_SPEC_TEMPLATE] | None = Field(
        default=None,
        description="core/v1 PodSpec fields merged into every Job's pod template "
        "(tolerations, nodeSelector, volumes, ...).",
    )


# ---------------------------------------------------------------------------------------
# pkobatch extensions
# ---------------------------------------------------------------------------------------

CRON_HINT: Final = (
    "use 5 fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * *' "
    "('H' picks a stable per-Stack value, e.g. 'H 3 * * *')"
)


def check_cron(expr: str) -> str:
    """Accept exactly the 5-field cron expressions pkobatch schedules (``H`` allowed)."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"{expr!r} is not a 5-field cron expression; {CRON_HINT}")
    from croniter import croniter  # not at the top: see pkobatch.api.cron

    # The hash id only seeds 'H'; validity does not depend on it.
    if not croniter.is_valid(expr, strict=True, hash_id=b"pkobatch"):
        raise ValueError(f"{expr!r} is not a valid cron expression (or never fires); {CRON_HINT}")
    return expr


def check_time_zone(name: str) -> str:
    # An empty name would mean UTC to the scheduler; in a spec it is a mistake.
    load_time_zone(name or "<empty>")
    return name


class DriftDetection(_Model):
    schedule: str = Field(description="5-field cron: when to check for drift.")
    remediate: bool | None = Field(
        default=None, description="Run an update when drift is found (default: only report)."
    )

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, value: str) -> str:
        return check_cron(value)


class Approval(_Model):
    """pkobatch: updates wait for a human to approve the saved plan of their preview."""

    required: bool | None = Field(
        default=None,
        description="Every update first runs a preview that saves a Pulumi update plan; the "
        "update runs only that plan, and only once it is approved.",
    )
    approved_plan: str | None = Field(
        default=None,
        max_length=63,
        description="Approve the pending plan with this id (status.approval.planID), the "
        "GitOps way; `pkobatch approve` does the same with an annotation.",
    )


# A ConfigMap or Secret key (Kubernetes' rule for both).
DATA_KEY_PATTERN: Final = re.compile(r"[-._a-zA-Z0-9]+")


class ExportTarget(_Model):
    name: str = Field(
        min_length=1, max_length=253, description="Name of the object, in the Stack's namespace."
    )


class ExportOutputs(_Model):
    """Where a successful ``up`` writes the stack's outputs for other workloads."""

    config_map: ExportTarget | None = Field(
        default=None, description="ConfigMap that receives the plain (non-secret) outputs."
    )
    secret: ExportTarget | None = Field(
        default=None, description="Secret that receives the secret outputs."
    )
    outputs: list[str] | None = Field(
        default=None, description="The outputs to export (default: all of them)."
    )
    keys: dict[str, str] | None = Field(
        default=None, description="Output name -> key to write it under (default: its name)."
    )

    @model_validator(mode="after")
    def _check(self) -> ExportOutputs:
        if self.config_map is None and self.secret is None:
            raise ValueError("set configMap, secret or both: where the outputs go")
        for output, key in (self.keys or {}).items():
            if not DATA_KEY_PATTERN.fullmatch(key) or len(key) > 253:
                raise ValueError(
                    f"keys.{output}: {key!r} is not a valid ConfigMap/Secret key: use at most "
                    "253 letters, digits, '-', '_' and '.'"
                )
        return self


# Notification events (docs/notifications.md), in the order the docs list them.
NotificationEvent = Literal[
    "run-failed", "run-recovered", "drift-detected", "approval-pending", "stalled", "destroyed"
]
NOTIFICATION_EVENTS: Final[tuple[NotificationEvent, ...]] = (
    "run-failed",
    "run-recovered",
    "drift-detected",
    "approval-pending",
    "stalled",
    "destroyed",
)
# A receiver's name is a key of status.notifications.pending entries and a metric label.
RECEIVER_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# What a receiver is sent (docs/notifications.md).
ReceiverType = Literal["webhook", "slack", "flux"]
RECEIVER_TYPES: Final[tuple[ReceiverType, ...]] = ("webhook", "slack", "flux")


class NotificationSecretRef(_Model):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Secret in the Stack's namespace with key 'url' (the receiver's URL) and, "
        "for a webhook, optional key 'signingKey' (the HMAC-SHA256 key).",
    )


class NotificationReceiver(_Model):
    """Where notifications go; the URL and key come only from the Secret."""

    name: Annotated[str, CrdHint(extra={"pattern": RECEIVER_NAME_PATTERN})] = Field(
        min_length=1, max_length=63, description="Name of the receiver (unique in the list)."
    )
    type: ReceiverType = Field(
        description="webhook: JSON body, signed when the Secret has a signingKey; slack: a "
        'Slack-compatible incoming webhook ({"text": ...}); flux: the event Flux controllers '
        "post to notification-controller's events address."
    )
    secret_ref: NotificationSecretRef = Field(description="The Secret with the URL (and key).")
    events: list[NotificationEvent] | None = Field(
        default=None, description="The events this receiver gets (default: the list's events)."
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not re.fullmatch(RECEIVER_NAME_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a valid receiver name: use lower-case letters, digits and "
                "'-', starting and ending with a letter or digit"
            )
        return value


class Notifications(_Model):
    """Receivers of a Stack's events; replaces the namespace default when set."""

    receivers: list[NotificationReceiver] = Field(
        description="The receivers (an empty list turns the namespace default off)."
    )
    events: list[NotificationEvent] | None = Field(
        default=None, description="The events sent (default: all of them)."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Notifications:
        names = [receiver.name for receiver in self.receivers]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"receiver names must be unique: {', '.join(repeated)} repeated")
        return self


# ---------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------

# Fields that are pkobatch's, not PKO's (wire names).
EXTENSION_FIELDS: Final = (
    "suspend",
    "schedule",
    "timeZone",
    "driftDetection",
    "timeoutSeconds",
    "jobTemplate",
    "exportOutputs",
    "notifications",
    "approval",
)
# Alias dialect: alias wire name -> canonical wire name (see normalize_spec).
SPEC_ALIASES: Final[Mapping[str, str]] = {
    "projectPath": "repoDir",
    "destroyOnDelete": "destroyOnFinalize",
}
ALIAS_FIELD_DESCRIPTIONS: Final[Mapping[str, str]] = {
    "projectPath": "Alias of repoDir (prefer repoDir).",
    "destroyOnDelete": "Alias of destroyOnFinalize (prefer destroyOnFinalize).",
}
GIT_SOURCE_FIELDS: Final = ("branch", "commit", "gitAuth", "gitAuthSecret")


class StackSpec(_Model):
    # --- what to run
    stack: str = Field(
        description="Fully qualified stack name: 'org/project/stack', 'org/stack' or 'stack'."
    )
    project_repo: str | None = Field(
        default=None, description="Git URL of the program (https or ssh)."
    )
    branch: str | None = Field(
        default=None, description="Branch to follow (polled); exclusive with commit."
    )
    commit: str | None = Field(
        default=None, description="Commit SHA to deploy; exclusive with branch."
    )
    repo_dir: str | None = Field(
        default=None, description="Directory of the repository that contains Pulumi.yaml."
    )
    shallow: bool | None = Field(default=None, description="Shallow clone.")
    git_auth: GitAuthConfig | None = Field(
        default=None, description="Git credentials: exactly one method."
    )
    git_auth_secret: str | None = Field(
        default=None,
        description="Deprecated (use gitAuth): Secret with sshPrivateKey[/password], "
        "accessToken, or username/password.",
    )
    flux_source: FluxSource | None = Field(
        default=None, description="Take the program from a Flux source's artifact."
    )
    program_ref: ProgramReference | None = Field(
        default=None, description="Take the program from a pulumi.com/v1 Program."
    )
    # --- config and credentials
    config: dict[str, Any] | None = Field(
        default=None, description="Stack config; values may be structured JSON."
    )
    config_ref: dict[str, ConfigMapRef] | None = Field(
        default=None, description="Stack config read from ConfigMaps."
    )
    secrets: dict[str, Annotated[str, ENV_VALUE]] | None = Field(
        default=None,
        description="Deprecated (use secretsRef): inline secret config values (each at most "
        f"{MAX_ENV_VALUE_CHARS} characters: it reaches the run in an environment variable).",
    )
    secrets_ref: dict[str, ResourceRef] | None = Field(
        default=None, description="Secret config values from Secrets or literals."
    )
    secrets_provider: str | None = Field(
        default=None, description="Secrets provider used when the stack is created."
    )
    env_refs: dict[str, ResourceRef] | None = Field(
        default=None, description="Environment variables of the run, from Secrets or literals."
    )
    envs: list[str] | None = Field(
        default=None, description="Deprecated (use envRefs): ConfigMaps added as envFrom."
    )
    # The CRD accepts the alias form ({name: ...}) too; normalize_spec rewrites it.
    env_secrets: Annotated[list[str], ENV_SECRETS_SCHEMA] | None = Field(
        default=None,
        description="Deprecated (use envRefs): Secrets added as envFrom; entries are names "
        "or {name: ...}. Key accessToken also becomes PULUMI_ACCESS_TOKEN.",
    )
    access_token_secret: str | None = Field(
        default=None,
        description="Deprecated (use envRefs.PULUMI_ACCESS_TOKEN): Secret whose key "
        "accessToken becomes PULUMI_ACCESS_TOKEN.",
    )
    # The CRD accepts the alias form ({url: ...}) too; normalize_spec rewrites it.
    backend: Annotated[str, ANY_JSON] | None = Field(
        default=None,
        description="Backend URL (PULUMI_BACKEND_URL); a string, or {url: ...}.",
    )
    environment: Annotated[list[str], ATOMIC_LIST] | None = Field(
        default=None, description="Pulumi ESC environments added to the stack."
    )
    # --- what each run does
    refresh: bool | None = Field(default=None, description="Refresh before up/preview.")
    expect_no_refresh_changes: bool | None = Field(
        default=None, description="No-op (ignored by PKO v2 too)."
    )
    destroy_on_finalize: bool | None = Field(
        default=None, description="Destroy the stack's resources when the Stack is deleted."
    )
    run_program: bool | None = Field(
        default=None, description="Run the program during destroy (--run-program)."
    )
    retry_on_update_conflict: bool | None = Field(
        default=None, description="No-op (ignored by PKO v2 too)."
    )
    use_local_stack_only: bool | None = Field(
        default=None, description="Do not create the stack if it does not exist."
    )
    resync_frequency_seconds: Int64 | None = Field(
        default=None,
        ge=-MAX_SPEC_SECONDS,
        le=MAX_SPEC_SECONDS,
        description="Branch polling and resync period (minimum 60: smaller values, negative "
        f"ones included, mean 60, as in PKO). At most {MAX_SPEC_SECONDS} (365 days) either "
        "way: larger magnitudes overflow time arithmetic.",
    )
    continue_resync_on_commit_match: bool | None = Field(
        default=None, description="Re-run every resync period even without a new commit."
    )
    retry_max_backoff_duration_seconds: Int64 | None = Field(
        default=None,
        ge=-MAX_SPEC_SECONDS,
        le=MAX_SPEC_SECONDS,
        description="Cap of the failure backoff (default 86400; 0 or negative: the default, "
        "as in PKO). As in PKO the first retry waits 10 s even under a lower cap. At most "
        f"{MAX_SPEC_SECONDS} (365 days) either way: larger magnitudes overflow time "
        "arithmetic.",
    )
    targets: list[str] | None = Field(default=None, description="URNs to target (--target).")
    target_dependents: bool | None = Field(
        default=None, description="Also target dependents (--target-dependents)."
    )
    prerequisites: list[PrerequisiteRef] | None = Field(
        default=None, description="Stacks that must have succeeded before this one runs."
    )
    service_account_name: str | None = Field(
        default=None, description="ServiceAccount of the run's pod."
    )
    workspace_template: WorkspaceTemplate | None = Field(
        default=None, description="PKO Workspace template; partly mapped onto the Job."
    )
    workspace_reclaim_policy: Literal["Retain", "Delete"] | None = Field(
        default=None, description="No-op (there is no long-lived workspace)."
    )
    update_template: UpdateTemplate | None = Field(
        default=None, description="PKO Update template; spec options apply to each run."
    )
    preview: bool | None = Field(default=None, description="Only ever run previews.")
    # --- pkobatch extensions
    suspend: bool | None = Field(
        default=None, description="pkobatch: start no new run (a running one finishes)."
    )
    schedule: str | None = Field(
        default=None, description="pkobatch: 5-field cron; also run at these times."
    )
    time_zone: str | None = Field(
        default=None, description="pkobatch: IANA time zone of the schedules (default UTC)."
    )
    drift_detection: DriftDetection | None = Field(
        default=None, description="pkobatch: scheduled drift checks (refresh --preview-only)."
    )
    timeout_seconds: Int64 | None = Field(
        default=None,
        gt=0,
        le=MAX_SPEC_SECONDS,
        description="pkobatch: per-run deadline (activeDeadlineSeconds), 1 to "
        f"{MAX_SPEC_SECONDS} (365 days): larger values overflow the Job controller's "
        "deadline arithmetic.",
    )
    job_template: JobTemplate | None = Field(
        default=None, description="pkobatch: metadata and pod spec merged into every Job."
    )
    export_outputs: ExportOutputs | None = Field(
        default=None,
        description="pkobatch: write the outputs to a ConfigMap (plain) and a Secret (secret) "
        "after each successful up; deleted after a destroy.",
    )
    notifications: Notifications | None = Field(
        default=None,
        description="pkobatch: receivers of this Stack's events (run failed, recovered, drift "
        "detected, approval pending, stalled, destroyed); replaces the namespace default.",
    )
    approval: Approval | None = Field(
        default=None,
        description="pkobatch: updates run only a saved plan someone approved (docs/api.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _normalize_aliases(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return normalize_spec(data)[0]
        return data

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, value: str | None) -> str | None:
        return None if value is None else check_cron(value)

    @field_validator("time_zone")
    @classmethod
    def _check_time_zone(cls, value: str | None) -> str | None:
        return None if value is None else check_time_zone(value)

    def source_kind(self) -> Literal["git", "flux", "program", "none"]:
        """Where the program comes from (the first one set, when validation reported more)."""
        if self.project_repo:
            return "git"
        if self.flux_source is not None:
            return "flux"
        if self.program_ref is not None:
            return "program"
        return "none"


# ---------------------------------------------------------------------------------------
# The status
# ---------------------------------------------------------------------------------------

LooseTime = Annotated[datetime, Field(strict=False)]


class StackUpdateState(_Model):
    generation: Int64 | None = Field(default=None, description="Generation the run was for.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value the run was for."
    )
    name: str | None = Field(default=None, description="Name of the run (the Job).")
    type: str | None = Field(default=None, description="up, preview, refresh or destroy.")
    state: str | None = Field(default=None, description="succeeded or failed.")
    message: str | None = Field(default=None, description="Error or summary of the run.")
    last_attempted_commit: str | None = Field(
        default=None, description="Source revision of the run."
    )
    last_successful_commit: str | None = Field(
        default=None, description="Last source revision that succeeded."
    )
    permalink: str | None = Field(default=None, description="Pulumi Cloud URL of the update.")
    last_resync_time: LooseTime | None = Field(
        default=None, description="When the result was recorded."
    )
    failures: Int64 | None = Field(
        default=None, description="Consecutive failures for this generation and request."
    )
    reason: str | None = Field(
        default=None,
        description="pkobatch: the run's result reason (Succeeded, InvalidSpec, ...).",
    )


class CurrentStackUpdate(_Model):
    generation: Int64 | None = Field(default=None, description="Generation being run.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value being run."
    )
    name: str | None = Field(default=None, description="Name of the running Job.")
    commit: str | None = Field(default=None, description="Source revision being run.")


_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class Condition(_Model):
    """metav1.Condition."""

    type: Annotated[str, CrdHint(extra={"maxLength": 316, "pattern": _CONDITION_TYPE})] = Field(
        description="Ready, Reconciling or Stalled."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: Annotated[int, CrdHint(extra={"format": "int64", "minimum": 0})] | None = (
        Field(default=None, description="Generation the condition was set for.")
    )
    last_transition_time: Annotated[LooseTime, CrdHint(extra={"format": "date-time"})] = Field(
        description="When the status last changed."
    )
    reason: Annotated[
        str, CrdHint(extra={"maxLength": 1024, "minLength": 1, "pattern": _CONDITION_REASON})
    ] = Field(description="CamelCase reason.")
    message: Annotated[str, CrdHint(extra={"maxLength": 32768})] = Field(
        description="Human-readable details."
    )


class OperationRequestStatus(_Model):
    """pkobatch: the controller's acknowledgement of pkobatch.io/operation-request."""

    request: str | None = Field(default=None, description="The annotation value handled.")
    operation: str | None = Field(
        default=None, description="up, preview, refresh, destroy or cancel."
    )
    state: RequestState | None = Field(
        default=None, description="Pending, Running, Succeeded, Failed or Rejected."
    )
    job_name: str | None = Field(default=None, description="The Job that ran (or was cancelled).")
    message: str | None = Field(default=None, description="Result or reason for rejection.")


class DriftCheckStatus(_Model):
    """pkobatch: the last scheduled drift check (spec.driftDetection)."""

    name: str | None = Field(default=None, description="The drift check's Job.")
    scheduled_time: LooseTime | None = Field(
        default=None, description="The schedule time the check ran for."
    )
    time: LooseTime | None = Field(default=None, description="When the check finished.")
    state: str | None = Field(default=None, description="succeeded or failed.")
    drifted_resources: Int64 | None = Field(
        default=None, description="Resources that differ from the last update."
    )
    message: str | None = Field(default=None, description="Error of a failed check.")


class PendingNotification(_Model):
    """pkobatch: an event not yet delivered to every receiver (written with the status
    change that caused it, removed per receiver after delivery or after the last retry)."""

    event: NotificationEvent = Field(description="The event kind.")
    time: LooseTime = Field(description="When the event happened.")
    summary: Annotated[str, CrdHint(extra={"maxLength": 1024})] = Field(
        description="One line about the event."
    )
    run: str | None = Field(default=None, description="The run (Job) the event is about.")
    operation: str | None = Field(default=None, description="The run's operation.")
    revision: str | None = Field(
        default=None, description="The source revision the event is about (the run's commit)."
    )
    receivers: dict[str, str] = Field(
        description="Receiver name -> type, for the receivers still to be sent to."
    )
    attempts: dict[str, int] | None = Field(
        default=None,
        description="Receiver name -> failed attempts so far (a restarted controller goes on "
        "counting).",
    )


class NotificationsStatus(_Model):
    """pkobatch: delivery state of spec.notifications (docs/notifications.md)."""

    pending: dict[str, PendingNotification] | None = Field(
        default=None, description="Event id -> the event, while some receiver still awaits it."
    )


class PlannedResource(_Model):
    """One resource of a saved plan and what the plan does to it."""

    urn: str = Field(description="The resource's URN.")
    op: str = Field(description="create, update, replace, delete, ... (Pulumi's step).")


class ApprovalStatus(_Model):
    """pkobatch: the saved plan of spec.approval, and what became of it."""

    plan_id: str | None = Field(
        default=None,
        alias="planID",
        description="Digest of the plan, the commit and the spec: what an approval names.",
    )
    state: (
        Literal[
            "Previewing",
            "Pending",
            "Approved",
            "Applied",
            "Failed",
            "Rejected",
            "Superseded",
            "PreviewFailed",
        ]
        | None
    ) = Field(
        default=None,
        description="Previewing, Pending, Approved (its update runs), Applied, Failed, Rejected, "
        "Superseded or PreviewFailed.",
    )
    summary: str | None = Field(default=None, description="What the plan changes, in short.")
    changes: dict[str, Int64] | None = Field(
        default=None, description="Operation counts of the plan, e.g. {create: 2, same: 1}."
    )
    resources: list[PlannedResource] | None = Field(
        default=None, description="The resources the plan changes (at most 100)."
    )
    resource_count: Int64 | None = Field(
        default=None, description="How many resources the plan changes in all."
    )
    commit: str | None = Field(default=None, description="Source revision the plan was made at.")
    generation: Int64 | None = Field(default=None, description="Generation of the preview.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value of the preview."
    )
    target: str | None = Field(
        default=None,
        description="What the plan is for: a digest of the spec (without approval), the "
        "reconcile request, the commit and the trigger; a new one supersedes the plan.",
    )
    trigger: str | None = Field(default=None, description="What asked for the change.")
    preview_job: str | None = Field(
        default=None, description="The preview Job; it owns the Secret that holds the plan."
    )
    plan_secret: str | None = Field(default=None, description="The Secret that holds the plan.")
    created_time: LooseTime | None = Field(default=None, description="When the plan was saved.")
    approved_by: str | None = Field(
        default=None,
        description="Who approved: the field manager that wrote the approval (managedFields).",
    )
    approved_via: str | None = Field(
        default=None,
        description="spec.approval.approvedPlan or the pkobatch.io/approve annotation.",
    )
    approved_time: LooseTime | None = Field(default=None, description="When it was approved.")
    update_job: str | None = Field(default=None, description="The update that runs the plan.")
    failures: Int64 | None = Field(default=None, description="Consecutive failed previews.")
    message: str | None = Field(default=None, description="What happened, or what to do.")


class StackStatus(_Model):
    observed_generation: Int64 | None = Field(
        default=None, description="Generation last processed."
    )
    observed_reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value last processed."
    )
    last_update: StackUpdateState | None = Field(default=None, description="The last run.")
    current_update: CurrentStackUpdate | None = Field(
        default=None, description="The run in progress."
    )
    outputs: dict[str, Any] | None = Field(
        default=None, description="Stack outputs; secret values are '[secret]'."
    )
    conditions: (
        Annotated[
            list[Condition],
            CrdHint(
                extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
            ),
        ]
        | None
    ) = Field(default=None, description="Ready, Reconciling and Stalled.")
    project_info: ProjectInfo | None = Field(
        default=None, description="Project name and runtime of the last successful run."
    )
    operation_request: OperationRequestStatus | None = Field(
        default=None, description="pkobatch: the last operation request handled."
    )
    last_schedule_time: LooseTime | None = Field(
        default=None, description="pkobatch: the last spec.schedule time a run started for."
    )
    last_drift_check: DriftCheckStatus | None = Field(
        default=None, description="pkobatch: the last drift check."
    )
    notifications: NotificationsStatus | None = Field(
        default=None, description="pkobatch: notifications not yet delivered."
    )
    approval: ApprovalStatus | None = Field(
        default=None, description="pkobatch: the saved plan of spec.approval."
    )


class Stack(_Model):
    api_version: str = Field(description="pulumi.com/v1")
    kind: str = Field(description="Stack")
    metadata: FreeFormObject = Field(description="Standard object metadata.")
    spec: StackSpec
    status: StackStatus | None = None


# ---------------------------------------------------------------------------------------
# Alias dialect
# ---------------------------------------------------------------------------------------


class SpecAliasError(ValueError):
    """An alias and its canonical field disagree, or an alias has the wrong shape."""


def _alias_note(alias: str, canonical: str) -> str:
    return f"{alias} was read as {canonical}; prefer the canonical name {canonical}"


_ENV_SECRETS_NOTE: Final = (
    "spec.envSecrets entries of the form {name: <secret>} (spec.envSecrets[].name) were read "
    "as Secret names; prefer the canonical form, a list of names: spec.envSecrets: [<secret>]"
)


def _set_canonical(
    spec: dict[str, Any], alias_path: str, canonical: str, value: Any, notes: list[str]
) -> None:
    if canonical in spec and spec[canonical] is not None and spec[canonical] != value:
        raise SpecAliasError(
            f"{alias_path} is an alias of spec.{canonical}, and they disagree "
            f"({value!r} vs {spec[canonical]!r}): remove {alias_path} (spec.{canonical} is "
            "the canonical name) or give both the same value"
        )
    spec[canonical] = value
    notes.append(_alias_note(alias_path, f"spec.{canonical}"))


def normalize_spec(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Rewrite the alias dialect into canonical PKO fields.

    Returns the canonical spec (a new dict; ``raw`` is not modified) and one note per alias
    used, for an Event. Raises ``SpecAliasError`` when an alias conflicts with its canonical
    field or has a shape pkobatch cannot read.
    """
    spec = dict(raw)
    notes: list[str] = []
    for alias, canonical in SPEC_ALIASES.items():
        if alias in spec:
            value = spec.pop(alias)
            if value is not None:
                _set_canonical(spec, f"spec.{alias}", canonical, value, notes)

    env_secrets = spec.get("envSecrets")
    if isinstance(env_secrets, list) and any(isinstance(e, Mapping) for e in env_secrets):
        names: list[Any] = []
        for index, entry in enumerate(env_secrets):
            if isinstance(entry, Mapping):
                if set(entry) != {"name"} or not isinstance(entry["name"], str):
                    raise SpecAliasError(
                        f"spec.envSecrets[{index}] must be a Secret name or {{name: <secret>}} "
                        f"with a string name and no other keys, got {dict(entry)!r}"
                    )
                names.append(entry["name"])
            else:
                names.append(entry)
        spec["envSecrets"] = names
        notes.append(_ENV_SECRETS_NOTE)

    backend = spec.get("backend")
    if isinstance(backend, Mapping):
        if set(backend) != {"url"} or not isinstance(backend["url"], str):
            raise SpecAliasError(
                "spec.backend must be a URL string or {url: <backend URL>} with no other "
                f"keys, got {dict(backend)!r}"
            )
        spec["backend"] = backend["url"]
        notes.append(_alias_note("spec.backend.url", "spec.backend"))
    return spec, notes


# ---------------------------------------------------------------------------------------
# Semantic validation
# ---------------------------------------------------------------------------------------


def to_snake(name: str) -> str:
    """Attribute name of a wire field (``appID`` -> ``app_id``)."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def iter_resource_refs(spec: StackSpec) -> Iterator[tuple[str, ResourceRef]]:
    """Every ResourceRef in the spec, with its path (e.g. ``spec.envRefs.TOKEN``)."""
    for map_name, refs in (("envRefs", spec.env_refs), ("secretsRef", spec.secrets_ref)):
        for key, ref in sorted((refs or {}).items()):
            yield f"spec.{map_name}.{key}", ref
    auth = spec.git_auth
    if auth is None:
        return
    if auth.access_token is not None:
        yield "spec.gitAuth.accessToken", auth.access_token
    if auth.ssh_auth is not None:
        yield "spec.gitAuth.sshAuth.sshPrivateKey", auth.ssh_auth.ssh_private_key
        if auth.ssh_auth.password is not None:
            yield "spec.gitAuth.sshAuth.password", auth.ssh_auth.password
    if auth.basic_auth is not None:
        yield "spec.gitAuth.basicAuth.userName", auth.basic_auth.user_name
        yield "spec.gitAuth.basicAuth.password", auth.basic_auth.password
    if auth.github_app is not None:
        yield "spec.gitAuth.githubApp.appID", auth.github_app.app_id
        yield "spec.gitAuth.githubApp.installationID", auth.github_app.installation_id
        yield "spec.gitAuth.githubApp.privateKey", auth.github_app.private_key


def _resource_ref_problems(path: str, ref: ResourceRef, namespace: str | None) -> list[str]:
    if ref.type in DEPRECATED_REF_TYPES:
        return [
            f"{path}: type {ref.type} is deprecated and no longer supported: use type Secret "
            "(secret: {name, key}) or type Literal (literal: {value})"
        ]
    wanted = REF_TYPE_FIELDS[ref.type]
    problems: list[str] = []
    if getattr(ref, wanted) is None:
        problems.append(f"{path}: type {ref.type} needs the field {wanted}")
    others = [f for f in REF_TYPE_FIELDS.values() if f != wanted and getattr(ref, f) is not None]
    if others:
        problems.append(
            f"{path}: type {ref.type} reads only {wanted}, but {', '.join(others)} is also "
            f"set: remove it or change type"
        )
    secret = ref.secret
    if (
        ref.type == "Secret"
        and secret is not None
        and secret.namespace
        and namespace is not None
        and secret.namespace != namespace
    ):
        problems.append(
            f"{path}.secret.namespace: cross-namespace refs are not allowed: the Secret "
            f"must be in the Stack's namespace {namespace!r}; remove namespace "
            f"(got {secret.namespace!r})"
        )
    return problems


def validate_stack_spec(spec: StackSpec, namespace: str | None = None) -> list[str]:
    """Problems that make the spec unusable (the controller sets ``Stalled/SpecInvalid``).

    Pass the Stack's ``namespace`` to check for cross-namespace Secret refs. An empty list
    means the spec is valid.
    """
    problems: list[str] = []
    if not spec.stack.strip():
        problems.append("spec.stack is empty: set the stack name, e.g. 'org/project/dev'")

    sources = [
        name
        for name, present in (
            ("projectRepo", bool(spec.project_repo)),
            ("fluxSource", spec.flux_source is not None),
            ("programRef", spec.program_ref is not None),
        )
        if present
    ]
    if len(sources) > 1:
        problems.append(
            f"spec.{', spec.'.join(sources)} are alternative sources: keep only one of "
            "spec.projectRepo, spec.fluxSource, spec.programRef"
        )

    if spec.project_repo:
        if spec.branch and spec.commit:
            problems.append(
                "spec.branch and spec.commit are both set: with spec.projectRepo set exactly "
                "one (branch to follow a branch, commit to pin a SHA)"
            )
        elif not spec.branch and not spec.commit:
            problems.append(
                "spec.projectRepo needs spec.branch (a branch to follow) or spec.commit "
                "(a SHA to pin): set exactly one"
            )
    else:
        for name in GIT_SOURCE_FIELDS:
            if getattr(spec, to_snake(name)):
                problems.append(
                    f"spec.{name} is set but spec.projectRepo is not: set spec.projectRepo "
                    f"to the git URL, or remove spec.{name}"
                )

    if spec.flux_source is not None:
        api_version = spec.flux_source.source_ref.api_version
        group, _, version = api_version.rpartition("/")
        if group != FLUX_SOURCE_GROUP or not version:
            problems.append(
                f"spec.fluxSource.sourceRef.apiVersion {api_version!r} is not a Flux source's: "
                f"use {FLUX_SOURCE_GROUP}/<version>, e.g. {FLUX_SOURCE_GROUP}/v1"
            )

    if spec.git_auth is not None:
        methods = spec.git_auth.methods()
        if not methods:
            problems.append("spec.gitAuth has no method: set one of " + ", ".join(GIT_AUTH_METHODS))
        elif len(methods) > 1:
            problems.append(
                f"spec.gitAuth has {len(methods)} methods ({', '.join(methods)}): keep only one"
            )

    for path, ref in iter_resource_refs(spec):
        problems.extend(_resource_ref_problems(path, ref, namespace))

    drift = spec.drift_detection
    if drift is not None and drift.remediate and spec.preview:
        problems.append(
            "spec.driftDetection.remediate runs an update, but spec.preview only allows "
            "previews: remove one of them"
        )
    if drift is not None and drift.remediate and spec.approval and spec.approval.required:
        problems.append(
            "spec.driftDetection.remediate runs an update nobody reviewed, but "
            "spec.approval.required asks for review of every update: remove remediate (drift "
            "checks still report drift, and a reconcile request makes a plan to review)"
        )
    return problems


def describe_validation_error(error: ValidationError, prefix: str = "spec") -> list[str]:
    """One line per pydantic error, naming the field by its wire path."""
    lines = []
    for item in error.errors(include_url=False):
        path = prefix
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return lines


@dataclass(frozen=True)
class SpecCheck:
    """The outcome of reading a Stack's spec; ``spec`` is None when it could not be parsed."""

    spec: StackSpec | None
    problems: list[str] = field(default_factory=list)
    alias_notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.spec is not None and not self.problems


def load_stack_spec(raw: Mapping[str, Any], namespace: str | None = None) -> SpecCheck:
    """Normalise aliases, validate the model and the semantics; never raises on bad input."""
    try:
        canonical, notes = normalize_spec(raw)
    except SpecAliasError as error:
        return SpecCheck(spec=None, problems=[str(error)])
    try:
        spec = StackSpec.model_validate(canonical)
    except ValidationError as error:
        return SpecCheck(spec=None, problems=describe_validation_error(error), alias_notes=notes)
    return SpecCheck(spec=spec, problems=validate_stack_spec(spec, namespace), alias_notes=notes)
