"""The Stack's spec: PKO's fields and pkobatch's extensions, ``StackSpec`` last.

Models are strict: a manifest that validates is exactly what the API server stores. The
alias dialect is rewritten before validation (``pkobatch.api.stack.normalize``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pkobatch.api.constants import FLUX_SOURCE_GROUP
from pkobatch.api.crd_hints import (
    ANY_JSON,
    ATOMIC_LIST,
    INT32,
    POD_SPEC_TEMPLATE,
    POD_TEMPLATE_SPEC,
    PRESERVE_UNKNOWN,
    CrdHint,
)
from pkobatch.api.cron import load_time_zone
from pkobatch.api.durations import parse_duration
from pkobatch.api.stack.base import (
    INT32_MAX,
    INT32_MIN,
    MAX_SPEC_SECONDS,
    ApiModel,
    FreeFormObject,
    Int64,
    OpenApiModel,
    to_snake,
)
from pkobatch.api.stack.normalize import normalize_spec

MAX_PULUMI_LOG_LEVEL: Final = 20
ENV_SECRETS_SCHEMA = CrdHint(schema={"type": "array", "items": dict(PRESERVE_UNKNOWN)})


def _checked_duration(value: str) -> str:
    parse_duration(value)
    return value


# A Go duration string ("90s", "1h30m"), kept as written.
GoDuration = Annotated[str, AfterValidator(_checked_duration)]


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


class EnvSelector(ApiModel):
    name: str = Field(description="Deprecated: name of an environment variable of the operator.")


class FSSelector(ApiModel):
    path: str = Field(description="Deprecated: path of a file in the operator's filesystem.")


class SecretSelector(ApiModel):
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


class LiteralRef(ApiModel):
    value: Annotated[str, ENV_VALUE] = Field(
        description=f"The value itself (at most {MAX_ENV_VALUE_CHARS} characters: it reaches "
        "the run in an environment variable)."
    )


class ResourceRef(ApiModel):
    type: ResourceRefType = Field(
        description="Where the value comes from: Secret or Literal (Env and FS are deprecated "
        "and rejected)."
    )
    env: EnvSelector | None = Field(default=None, description="Deprecated (type Env).")
    filesystem: FSSelector | None = Field(default=None, description="Deprecated (type FS).")
    secret: SecretSelector | None = Field(default=None, description="For type Secret.")
    literal: LiteralRef | None = Field(default=None, description="For type Literal.")


class SSHAuth(ApiModel):
    ssh_private_key: ResourceRef = Field(description="The SSH private key.")
    password: ResourceRef | None = Field(
        default=None, description="Passphrase of the private key, if it has one."
    )


class BasicAuth(ApiModel):
    user_name: ResourceRef = Field(description="User name for HTTP basic auth.")
    password: ResourceRef = Field(description="Password for HTTP basic auth.")


class GitHubAppAuth(ApiModel):
    app_id: ResourceRef = Field(alias="appID", description="GitHub App ID.")
    installation_id: ResourceRef = Field(
        alias="installationID", description="Installation ID of the GitHub App."
    )
    private_key: ResourceRef = Field(description="Private key (PEM) of the GitHub App.")


GIT_AUTH_METHODS: Final = ("accessToken", "sshAuth", "basicAuth", "githubApp")


class GitAuthConfig(ApiModel):
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


class FluxSourceReference(ApiModel):
    api_version: Annotated[str, CrdHint(extra={"maxLength": 253})] = Field(
        description=f"{FLUX_SOURCE_GROUP}/<version>, e.g. {FLUX_SOURCE_GROUP}/v1"
    )
    kind: Annotated[str, CrdHint(extra={"maxLength": 63})] = Field(
        description="GitRepository, Bucket or OCIRepository (or a kind the operator added: "
        "PKOBATCH_EXTRA_FLUX_SOURCE_KINDS)."
    )
    name: str = Field(description="Name of the Flux source, in the Stack's namespace.")


class FluxSource(ApiModel):
    source_ref: FluxSourceReference = Field(description="The Flux source object.")
    dir: str | None = Field(
        default=None, description="Directory of the artifact that contains Pulumi.yaml."
    )


class ProgramReference(ApiModel):
    name: str = Field(description="Name of a pulumi.com/v1 Program in the Stack's namespace.")


class ConfigMapRef(ApiModel):
    name: str = Field(description="Name of the ConfigMap, in the Stack's namespace.")
    key: str = Field(description="Key in the ConfigMap.")
    json_value: bool | None = Field(
        default=None, alias="json", description="Parse the value as JSON (structured config)."
    )


class RequirementSpec(ApiModel):
    succeeded_within_duration: GoDuration | None = Field(
        default=None,
        description="The prerequisite must have succeeded within this duration (e.g. '1h'); "
        "an older success triggers a re-run of the prerequisite first.",
    )


class PrerequisiteRef(ApiModel):
    name: str = Field(description="Name of another Stack in the same namespace.")
    requirement: RequirementSpec | None = Field(
        default=None, description="Extra conditions on the prerequisite's last success."
    )


# ---------------------------------------------------------------------------------------
# Templates: free-form, except the parts pkobatch maps onto the Job
# ---------------------------------------------------------------------------------------


class LocalSource(OpenApiModel):
    dir: str | None = Field(
        default=None,
        description="Directory inside the image holding the program (used when the Stack "
        "has no source).",
    )


class WorkspaceTemplateSpec(OpenApiModel):
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
    security_profile: Literal["baseline", "restricted"] | None = Field(
        default=None,
        description="PKO's security profile of the run's pod: 'restricted' (the default: "
        "non-root, no privilege escalation, all capabilities dropped) or 'baseline' (only "
        "the RuntimeDefault seccomp profile), before podTemplate and jobTemplate.",
    )


class WorkspaceTemplate(OpenApiModel):
    metadata: FreeFormObject | None = Field(
        default=None,
        description="Labels and annotations added to every Job (PKO puts them on its "
        "Workspace object, not its pod; use podTemplate.metadata for the pod).",
    )
    spec: WorkspaceTemplateSpec | None = Field(
        default=None, description="Workspace settings; see docs/migration.md for the mapping."
    )


class UpdateTemplateSpec(OpenApiModel):
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
    ttl_after_completed: GoDuration | None = Field(
        default=None,
        description="How long a finished run's Job (and its result) stays, e.g. '1h': its "
        "ttlSecondsAfterFinished, at least 10m; PKO's Update TTL.",
    )


class UpdateTemplate(OpenApiModel):
    metadata: FreeFormObject | None = Field(
        default=None,
        description="Labels and annotations added to every Job (PKO puts them on its "
        "Update object).",
    )
    spec: UpdateTemplateSpec | None = Field(
        default=None, description="Per-run Pulumi options; see docs/migration.md."
    )


class JobTemplateMetadata(ApiModel):
    labels: dict[str, str] | None = Field(
        default=None, description="Labels added to every Job and its pod."
    )
    annotations: dict[str, str] | None = Field(
        default=None, description="Annotations added to every Job and its pod."
    )


class JobTemplate(ApiModel):
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


class DriftDetection(ApiModel):
    schedule: str = Field(description="5-field cron: when to check for drift.")
    remediate: bool | None = Field(
        default=None, description="Run an update when drift is found (default: only report)."
    )

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, value: str) -> str:
        return check_cron(value)


class Approval(ApiModel):
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


class ExportTarget(ApiModel):
    name: str = Field(
        min_length=1, max_length=253, description="Name of the object, in the Stack's namespace."
    )


class ExportOutputs(ApiModel):
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


class NotificationSecretRef(ApiModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        description="Secret in the Stack's namespace with key 'url' (the receiver's URL) and, "
        "for a webhook, optional key 'signingKey' (the HMAC-SHA256 key).",
    )


class NotificationReceiver(ApiModel):
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


class Notifications(ApiModel):
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
GIT_SOURCE_FIELDS: Final = ("branch", "commit", "gitAuth", "gitAuthSecret")


class StackSpec(ApiModel):
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
