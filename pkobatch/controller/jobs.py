"""The Job of one run, built by a pure function from the template, settings and Stack.

Layers, each applied over the previous one:

1. the Job template (``job_template.yaml`` in this package, or ``Settings.job.template_file``);
2. what the controller owns: name, labels, owner, deadlines, image, command with the
   ``RunSnapshot``, ServiceAccount, and the environment that carries credentials;
3. ``spec.workspaceTemplate.spec`` (PKO's mappable fields: image, pull policy, resources,
   env, envFrom, podTemplate);
4. ``spec.jobTemplate`` (pkobatch: labels, annotations, pod spec fields);
5. the invariants again (labels, ``restartPolicy: Never``, ``backoffLimit: 0``, the runner
   command), so no template can break the run contract; a run container a template made
   read-only (``readOnlyRootFilesystem``) gets a writable ``/tmp`` (``_writable_tmp``).

The controller creates the Job with its own rights, so the Stack may not use it to get more
than its author could run: the finished pod must meet the Pod Security level of
``Settings.job.pod_security_level`` (``pkobatch.api.pod_security``), the templates may not
change the ServiceAccount (it comes only from ``spec.serviceAccountName`` or
``spec.workspaceTemplate.spec.serviceAccountName``), and git credentials go over plain
``http://`` only to hosts the operator allowed (``pkobatch.api.git_transport``). Each
refusal is a ``JobBuildError`` naming the field, raised before any Job exists.

**Any image runs pkobatch's runner.** A run whose container image (after every layer) is
not the runner image ``Settings.job.image`` — a Stack's ``workspaceTemplate.spec.image`` or
a ``jobTemplate`` container image, e.g. a stock ``pulumi/pulumi`` image — gets the runner
the way PKO injects its agent: an init container from the runner image copies the runner
bundle (a self-contained directory with its own C library, ``Settings.job.runner_bundle``)
into an ``emptyDir``,
and the run container, in the user's image that brings the Pulumi CLI and the language
runtimes, executes that copy. This is decided last, on the final image, so no layer can
leave a run without a runner.

Secrets never reach the Job as values: every credential becomes a ``secretKeyRef`` or
``envFrom.secretRef`` resolved by the kubelet, and the snapshot names the environment
variables that hold them. References to the Stack's Secrets and ConfigMaps are ``optional``
so a missing one makes the run fail fast with the runner's message instead of leaving the pod
stuck in ``CreateContainerConfigError`` until the deadline.

Secret values the Stack holds inline (``spec.secrets``, ``Literal`` refs in ``secretsRef`` and
``gitAuth``) go into a Secret made for the run (``<job>-secrets``), referenced like any other,
not optional: the controller creates it right after the Job, and the kubelet waits for it.
The snapshot keeps their keys with the value ``[secret]``. A snapshot too large for one
argument goes into ConfigMaps (``<job>-snapshot-<n>``) that the runner reads. These run inputs
are returned beside the Job (``RunObjects.inputs``), to be created only when a run needs them
and owned by the Job, so the garbage collector removes them with it.

Job names are deterministic — ``<stack>-<operation>-<hash of (uid, generation, reconcile
request, trigger)>`` — so a retry after a crash or on a stale cache gets ``AlreadyExists``
instead of starting a second run.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

import yaml

from pkobatch.api.constants import (
    API_VERSION,
    JOB_STACK_UID_ANNOTATION,
    KIND,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    MAX_LABEL_VALUE_LENGTH,
    OPERATION_LABEL,
    PREFIX,
    RUN_ANNOTATION,
    SHARD_LABEL,
    STACK_LABEL,
    STACK_NAME_ANNOTATION,
    Operation,
)
from pkobatch.api.git_transport import credentials_allowed, has_url_credentials, refusal_message
from pkobatch.api.objects import JSON
from pkobatch.api.pod_security import Level, Violation, check_pod
from pkobatch.api.program import program_revision, render_project
from pkobatch.api.run import (
    DYNAMIC_ENV_VAR,
    JOB_UID_ENV,
    JOB_UID_LABEL,
    MAX_INLINE_SNAPSHOT_BYTES,
    SECRET_PLACEHOLDER,
    SNAPSHOT_CONFIGMAP_FLAG,
    SNAPSHOT_FLAG,
    SNAPSHOT_KEY,
    SNAPSHOT_SHA256_FLAG,
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_PATH_ENV,
    FluxArtifact,
    GitAuthEnv,
    PlanRef,
    ProgramSnapshot,
    ProjectInfo,
    RunSnapshot,
    StackRef,
    ValueFromEnv,
    snapshot_sha256,
    split_snapshot,
)
from pkobatch.api.stack import MAX_SPEC_SECONDS, ResourceRef, StackSpec
from pkobatch.config import JobSettings

CONTAINER_NAME: Final = "pulumi"
TEMPLATE_RESOURCE: Final = "job_template.yaml"
MAX_NAME_LENGTH: Final = 63
# Pod Security violations quoted in one message (the rest are counted).
MAX_REPORTED_VIOLATIONS: Final = 5
POD_SECURITY_SETTING: Final = "PKOBATCH_JOB__POD_SECURITY_LEVEL"
SERVICE_ACCOUNT_FIELDS: Final = ("serviceAccountName", "serviceAccount")
_HASH_LENGTH: Final = 10

# Environment variables the builder fills from references (values never pass through here).
ENV_BACKEND: Final = "PULUMI_BACKEND_URL"
ENV_ACCESS_TOKEN: Final = "PULUMI_ACCESS_TOKEN"
ACCESS_TOKEN_KEY: Final = "accessToken"
ENV_CONFIG_PREFIX: Final = "PKOBATCH_CONFIG_"
ENV_SECRET_PREFIX: Final = "PKOBATCH_SECRET_"
ENV_INLINE_SECRET_PREFIX: Final = "PKOBATCH_INLINE_SECRET_"
ENV_GIT_USERNAME: Final = "PKOBATCH_GIT_USERNAME"
ENV_GIT_PASSWORD: Final = "PKOBATCH_GIT_PASSWORD"
ENV_GIT_TOKEN: Final = "PKOBATCH_GIT_TOKEN"
ENV_GIT_SSH_PRIVATE_KEY: Final = "PKOBATCH_GIT_SSH_PRIVATE_KEY"
ENV_GIT_SSH_PASSPHRASE: Final = "PKOBATCH_GIT_SSH_PASSPHRASE"
ENV_GIT_GITHUB_APP_ID: Final = "PKOBATCH_GIT_GITHUB_APP_ID"
ENV_GIT_GITHUB_APP_INSTALLATION_ID: Final = "PKOBATCH_GIT_GITHUB_APP_INSTALLATION_ID"
ENV_GIT_GITHUB_APP_PRIVATE_KEY: Final = "PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY"
# Read by the runner (pkobatch.runner.cancel) to pace a clean Pulumi cancellation.
ENV_GRACE_PERIOD: Final = "PKOBATCH_GRACE_PERIOD_SECONDS"

# The runner bundle injected into runs whose image is not the runner image.
BUNDLE_VOLUME: Final = "pkobatch-runner"
# PKO's "share" volume, where its workspace pod keeps the dynamic environment file
# ($PULUMI_ENV): templates written for PKO mount it by this name.
SHARE_VOLUME: Final = "share"
SHARE_MOUNT_PATH: Final = "/share"
DYNAMIC_ENV_FILE: Final = f"{SHARE_MOUNT_PATH}/.env"
BUNDLE_MOUNT_PATH: Final = "/pkobatch"
# The init container copies the bundle directory here; its launcher is the run's command.
INJECTED_BUNDLE: Final = f"{BUNDLE_MOUNT_PATH}/runner"
INJECTED_RUNNER: Final = f"{INJECTED_BUNDLE}/pkobatch-runner"
BUNDLE_INIT_CONTAINER: Final = "pkobatch-runner"
# A run container with a read-only root filesystem gets a writable /tmp (an emptyDir).
TMP_VOLUME: Final = "pkobatch-tmp"
TMP_DIR: Final = "/tmp"
JOB_RUN_ARGS: Final = ("job", "run")
# The user PKO runs workspace pods as (its "restricted" security profile): stock images such
# as pulumi/pulumi:<version>-nonroot name their user ("pulumi"), which runAsNonRoot cannot
# verify without a numeric runAsUser.
PKO_RUN_AS_USER: Final = 1000
# Pod Security Standard "restricted", whatever the template says.
RESTRICTED_SECURITY_CONTEXT: Final[JSON] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

RunKind = Literal["sync", "request", "drift", "approval"]
"""Why a run exists: the Stack's normal operation, a CLI operation request, a drift check,
the preview that saves a plan for approval (spec.approval)."""
# Trigger of the update that remediates drift; it always refreshes first.
REMEDIATE_TRIGGER_PREFIX: Final = "remediate:"
# Triggers of a run for a spec.schedule time, and of a drift check for its schedule time.
SCHEDULE_TRIGGER_PREFIX: Final = "schedule:"
DRIFT_TRIGGER_PREFIX: Final = "drift:"
# The label that ties a run input (Secret, snapshot ConfigMap) to its Job. Inputs carry no
# managed-by label: the controller's ConfigMap cache (managed-by selector) must not hold them.
RUN_INPUT_LABEL: Final = f"{PREFIX}/run-input-of"
# An inline secret travels in an environment variable: Linux caps one at 128 KiB.
MAX_INLINE_SECRET_BYTES: Final = 128 * 1024 - 256


class JobBuildError(ValueError):
    """The Stack asks for something a Job cannot do; the message says what to change."""


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


def short_hash(*parts: str, length: int = _HASH_LENGTH) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return digest[:length]


def stack_label_value(stack_name: str) -> str:
    """The ``pkobatch.io/stack`` label value: the name, or a hashed form when too long."""
    if len(stack_name) <= MAX_LABEL_VALUE_LENGTH:
        return stack_name
    keep = MAX_LABEL_VALUE_LENGTH - _HASH_LENGTH - 1
    return f"{stack_name[:keep].rstrip('-.')}-{short_hash(stack_name)}"


def job_name(stack_name: str, stack_uid: str, run: Run) -> str:
    """Deterministic, at most 63 characters, unique per (Stack, generation, request, trigger)."""
    digest = short_hash(
        stack_uid, str(run.generation), run.reconcile_request, run.operation, run.kind, run.trigger
    )
    suffix = f"-{run.operation}-{digest}"
    prefix = stack_name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-.")
    return f"{prefix}{suffix}"


def run_labels(stack: Mapping[str, Any], operation: str) -> dict[str, str]:
    """The labels of a run's Job, pod and result; the Stack's shard label, when it has one,
    puts them in its shard's watches (docs/sharding.md)."""
    meta = stack.get("metadata") or {}
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        STACK_LABEL: stack_label_value(str(meta["name"])),
        OPERATION_LABEL: operation,
    }
    shard = (meta.get("labels") or {}).get(SHARD_LABEL)
    if shard is not None:
        labels[SHARD_LABEL] = str(shard)
    return labels


@cache
def _builtin_template_text() -> str:
    return resources.files("pkobatch.controller").joinpath(TEMPLATE_RESOURCE).read_text()


def parse_template(text: str, source: str) -> JSON:
    """A Job template from YAML; raises JobBuildError naming ``source`` when unusable."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobBuildError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "Job":
        raise JobBuildError(f"{source}: must be a batch/v1 Job manifest (kind: Job)")
    containers = (((data.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    if not any(isinstance(c, dict) and c.get("name") == CONTAINER_NAME for c in containers):
        raise JobBuildError(f"{source}: needs a container named {CONTAINER_NAME!r}")
    return data


def builtin_template() -> JSON:
    return parse_template(_builtin_template_text(), f"pkobatch/controller/{TEMPLATE_RESOURCE}")


def merge_named(base: Any, patch: Any) -> Any:
    """Merge ``patch`` over ``base`` like a strategic merge of pod specs.

    Maps merge recursively; lists whose items all have a ``name`` (containers, env,
    volumes, volumeMounts) merge item by item; any other list, and scalars, are replaced.
    Returns a new value; the inputs are not modified.
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = merge_named(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        merged_list = copy.deepcopy(base)
        positions = {item["name"]: index for index, item in enumerate(merged_list)}
        for item in patch:
            if item["name"] in positions:
                index = positions[item["name"]]
                merged_list[index] = merge_named(merged_list[index], item)
            else:
                positions[item["name"]] = len(merged_list)
                merged_list.append(copy.deepcopy(item))
        return merged_list
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return all(isinstance(item, dict) and "name" in item for item in items)


# ---------------------------------------------------------------------------------------
# Credentials: references only
# ---------------------------------------------------------------------------------------


def _secret_ref(name: str, key: str) -> JSON:
    return {"secretKeyRef": {"name": name, "key": key, "optional": True}}


def _ref_env(env_name: str, ref: ResourceRef, path: str) -> JSON:
    """An EnvVar for a Secret or Literal ResourceRef (other types fail validation earlier)."""
    if ref.type == "Secret" and ref.secret is not None:
        return {"name": env_name, "valueFrom": _secret_ref(ref.secret.name, ref.secret.key)}
    if ref.type == "Literal" and ref.literal is not None:
        return {"name": env_name, "value": ref.literal.value}
    raise JobBuildError(f"{path}: use type Secret (secret: {{name, key}}) or type Literal")


def run_secret_name(job: str) -> str:
    return f"{job}-secrets"


def plan_secret_name(job: str) -> str:
    """The Secret a preview of kind "approval" saves its plan in (owned by that Job)."""
    return f"{job}-plan"


@dataclass
class _InlineSecrets:
    """Secret values the Stack holds inline, on their way into the run's Secret."""

    secret_name: str
    values: dict[str, str]  # variable name -> value (the Secret's keys are variable names)

    def env(self, env_name: str, value: str, path: str) -> JSON:
        if len(value.encode("utf-8")) > MAX_INLINE_SECRET_BYTES:
            raise JobBuildError(
                f"{path}: the value is larger than {MAX_INLINE_SECRET_BYTES} bytes, more than a "
                "process environment variable can hold; put it in a file the program reads, "
                "or split it into several keys"
            )
        self.values[env_name] = value
        return {
            "name": env_name,
            "valueFrom": {"secretKeyRef": {"name": self.secret_name, "key": env_name}},
        }

    def ref_env(self, env_name: str, ref: ResourceRef, path: str) -> JSON:
        """Like ``_ref_env``, for a ref whose value is secret: a literal moves to the Secret."""
        if ref.type == "Literal" and ref.literal is not None:
            return self.env(env_name, ref.literal.value, path)
        return _ref_env(env_name, ref, path)


# Where inline secret values sit in the canonical manifest (blanked in the snapshot).
_GIT_AUTH_SECRET_REFS: Final = (
    ("accessToken",),
    ("basicAuth", "password"),
    ("sshAuth", "sshPrivateKey"),
    ("sshAuth", "password"),
    ("githubApp", "privateKey"),
)


def without_inline_secrets(manifest: Mapping[str, Any]) -> JSON:
    """``manifest`` with every inline secret value replaced by ``[secret]``."""
    blanked: JSON = copy.deepcopy(dict(manifest))
    if isinstance(blanked.get("secrets"), dict):
        blanked["secrets"] = dict.fromkeys(blanked["secrets"], SECRET_PLACEHOLDER)
    refs: list[Any] = list((blanked.get("secretsRef") or {}).values())
    for path in _GIT_AUTH_SECRET_REFS:
        node: Any = blanked.get("gitAuth")
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        refs.append(node)
    for ref in refs:
        if isinstance(ref, dict) and isinstance(ref.get("literal"), dict):
            ref["literal"]["value"] = SECRET_PLACEHOLDER
    return blanked


@dataclass
class _Environment:
    env: list[JSON]
    env_from: list[JSON]
    config_from_env: dict[str, ValueFromEnv]
    secrets_from_env: dict[str, str]
    git_auth: GitAuthEnv | None


def _environment(
    spec: StackSpec, workspace_env: list[JSON], inline: _InlineSecrets
) -> _Environment:
    env: list[JSON] = []
    env_from: list[JSON] = []
    explicit = {*(spec.env_refs or {}), *(str(item.get("name")) for item in workspace_env)}
    if spec.backend:
        env.append({"name": ENV_BACKEND, "value": spec.backend})
    for name in spec.envs or ():
        env_from.append({"configMapRef": {"name": name, "optional": True}})
    for name in spec.env_secrets or ():
        env_from.append({"secretRef": {"name": name, "optional": True}})
    if ENV_ACCESS_TOKEN not in explicit:
        # PKO v1 read key accessToken of these Secrets as the Pulumi access token.
        token_secrets = [*(spec.env_secrets or ())]
        if spec.access_token_secret:
            token_secrets.append(spec.access_token_secret)
        for name in token_secrets:
            env.append({"name": ENV_ACCESS_TOKEN, "valueFrom": _secret_ref(name, ACCESS_TOKEN_KEY)})
    for key, ref in sorted((spec.env_refs or {}).items()):
        env.append(_ref_env(key, ref, f"spec.envRefs.{key}"))

    config_from_env: dict[str, ValueFromEnv] = {}
    for index, (key, cm_ref) in enumerate(sorted((spec.config_ref or {}).items())):
        env_name = f"{ENV_CONFIG_PREFIX}{index}"
        env.append(
            {
                "name": env_name,
                "valueFrom": {
                    "configMapKeyRef": {"name": cm_ref.name, "key": cm_ref.key, "optional": True}
                },
            }
        )
        config_from_env[key] = ValueFromEnv(env=env_name, json_value=bool(cm_ref.json_value))
    for index, (key, ref) in enumerate(sorted((spec.secrets_ref or {}).items())):
        env_name = f"{ENV_SECRET_PREFIX}{index}"
        env.append(inline.ref_env(env_name, ref, f"spec.secretsRef.{key}"))
        config_from_env[key] = ValueFromEnv(env=env_name, secret=True)
    secrets_from_env: dict[str, str] = {}
    for index, (key, value) in enumerate(sorted((spec.secrets or {}).items())):
        env_name = f"{ENV_INLINE_SECRET_PREFIX}{index}"
        env.append(inline.env(env_name, value, f"spec.secrets.{key}"))
        secrets_from_env[key] = env_name

    git_env, git_auth = _git_auth(spec, inline)
    env.extend(git_env)
    return _Environment(env, env_from, config_from_env, secrets_from_env, git_auth)


def _git_auth(spec: StackSpec, inline: _InlineSecrets) -> tuple[list[JSON], GitAuthEnv | None]:
    auth = spec.git_auth
    if auth is not None:
        if auth.github_app is not None:
            app = auth.github_app
            env = [
                _ref_env(ENV_GIT_GITHUB_APP_ID, app.app_id, "githubApp.appID"),
                _ref_env(
                    ENV_GIT_GITHUB_APP_INSTALLATION_ID,
                    app.installation_id,
                    "githubApp.installationID",
                ),
                inline.ref_env(
                    ENV_GIT_GITHUB_APP_PRIVATE_KEY, app.private_key, "githubApp.privateKey"
                ),
            ]
            return env, GitAuthEnv.model_validate(
                {
                    "githubAppIDEnv": ENV_GIT_GITHUB_APP_ID,
                    "githubAppInstallationIDEnv": ENV_GIT_GITHUB_APP_INSTALLATION_ID,
                    "githubAppPrivateKeyEnv": ENV_GIT_GITHUB_APP_PRIVATE_KEY,
                }
            )
        if auth.ssh_auth is not None:
            env = [
                inline.ref_env(ENV_GIT_SSH_PRIVATE_KEY, auth.ssh_auth.ssh_private_key, "sshAuth")
            ]
            names: dict[str, str] = {"sshPrivateKeyEnv": ENV_GIT_SSH_PRIVATE_KEY}
            if auth.ssh_auth.password is not None:
                env.append(
                    inline.ref_env(ENV_GIT_SSH_PASSPHRASE, auth.ssh_auth.password, "sshAuth")
                )
                names["sshPassphraseEnv"] = ENV_GIT_SSH_PASSPHRASE
            return env, GitAuthEnv.model_validate(names)
        if auth.access_token is not None:
            env = [inline.ref_env(ENV_GIT_TOKEN, auth.access_token, "spec.gitAuth.accessToken")]
            return env, GitAuthEnv.model_validate({"tokenEnv": ENV_GIT_TOKEN})
        if auth.basic_auth is not None:
            env = [
                _ref_env(ENV_GIT_USERNAME, auth.basic_auth.user_name, "basicAuth.userName"),
                inline.ref_env(ENV_GIT_PASSWORD, auth.basic_auth.password, "basicAuth.password"),
            ]
            return env, GitAuthEnv.model_validate(
                {"usernameEnv": ENV_GIT_USERNAME, "passwordEnv": ENV_GIT_PASSWORD}
            )
        return [], None
    if spec.git_auth_secret:
        # Deprecated form: the runner picks ssh, then token, then basic by which keys exist.
        secret = spec.git_auth_secret
        env = [
            {"name": ENV_GIT_SSH_PRIVATE_KEY, "valueFrom": _secret_ref(secret, "sshPrivateKey")},
            {"name": ENV_GIT_PASSWORD, "valueFrom": _secret_ref(secret, "password")},
            {"name": ENV_GIT_TOKEN, "valueFrom": _secret_ref(secret, "accessToken")},
            {"name": ENV_GIT_USERNAME, "valueFrom": _secret_ref(secret, "username")},
        ]
        return env, GitAuthEnv.model_validate(
            {
                "sshPrivateKeyEnv": ENV_GIT_SSH_PRIVATE_KEY,
                "sshPassphraseEnv": ENV_GIT_PASSWORD,
                "tokenEnv": ENV_GIT_TOKEN,
                "usernameEnv": ENV_GIT_USERNAME,
                "passwordEnv": ENV_GIT_PASSWORD,
            }
        )
    return [], None


# ---------------------------------------------------------------------------------------
# The Job
# ---------------------------------------------------------------------------------------


def build_snapshot(
    stack: Mapping[str, Any],
    spec: StackSpec,
    run: Run,
    name: str,
    project_info: ProjectInfo | None,
    config_from_env: dict[str, ValueFromEnv],
    git_auth: GitAuthEnv | None,
    secrets_from_env: dict[str, str],
    source: Mapping[str, Any] | None = None,
    ended_runs: Sequence[str] = (),
) -> RunSnapshot:
    """``source`` is the observed Program (spec.programRef) or Flux source (spec.fluxSource)."""
    meta = stack.get("metadata") or {}
    manifest = without_inline_secrets(spec.to_manifest())
    if run.trigger.startswith(REMEDIATE_TRIGGER_PREFIX):
        manifest["refresh"] = True
    return RunSnapshot(
        operation=run.operation,
        drift_check=run.kind == "drift",
        stack=StackRef(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", "")),
        job_name=name,
        generation=run.generation,
        reconcile_request=run.reconcile_request,
        spec=manifest,
        commit=run.commit,
        project_info=project_info,
        config_from_env=config_from_env,
        secrets_from_env=secrets_from_env,
        git_auth=git_auth,
        program=program_snapshot(source)
        if source is not None and spec.program_ref is not None
        else None,
        flux=flux_artifact(source) if source is not None and spec.flux_source is not None else None,
        result_config_map=name,
        ended_runs=list(ended_runs),
        save_plan=PlanRef(secret=plan_secret_name(name)) if run.kind == "approval" else None,
        apply_plan=PlanRef(secret=run.plan_secret, id=run.plan) if run.plan else None,
    )


def flux_artifact(source: Mapping[str, Any]) -> FluxArtifact | None:
    """The artifact of an observed Flux source (None: it has none)."""
    artifact = (source.get("status") or {}).get("artifact") or {}
    if not artifact.get("url") or not artifact.get("revision"):
        return None
    return FluxArtifact(
        kind=str(source.get("kind") or ""),
        name=str((source.get("metadata") or {}).get("name") or ""),
        url=str(artifact["url"]),
        revision=str(artifact["revision"]),
        digest=str(artifact.get("digest") or ""),
    )


def program_snapshot(program: Mapping[str, Any]) -> ProgramSnapshot:
    """The observed Program, rendered for the run (``JobBuildError`` when it cannot be)."""
    name = str((program.get("metadata") or {}).get("name") or "")
    try:
        project = render_project(name, program.get("program") or {})
    except ValueError as exc:
        raise JobBuildError(
            f"Program {name} is not a valid Pulumi YAML program: {exc}; fix the Program"
        ) from None
    return ProgramSnapshot(name=name, revision=program_revision(program), project=project)


def _pulumi_container(pod_spec: JSON) -> JSON:
    for container in pod_spec.get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            return dict(container)
    raise JobBuildError(f"the Job template has no container named {CONTAINER_NAME!r}")


def _replace_container(pod_spec: JSON, container: JSON) -> None:
    pod_spec["containers"] = [
        container if c.get("name") == CONTAINER_NAME else c for c in pod_spec["containers"]
    ]


@dataclass(frozen=True)
class RunObjects:
    """A run's Job, and the inputs its pod reads that do not fit into it (usually none)."""

    job: JSON
    # Created right after the Job, owned by it (``owned_by_job``); the pod waits for them.
    inputs: tuple[JSON, ...] = ()


def build_job(
    stack: Mapping[str, Any],
    spec: StackSpec,
    run: Run,
    settings: JobSettings,
    template: Mapping[str, Any],
    project_info: ProjectInfo | None = None,
    insecure_http_git_hosts: Sequence[str] = (),
    source: Mapping[str, Any] | None = None,
    ended_runs: Sequence[str] = (),
) -> JSON:
    """The Job alone (see ``build_run``), for callers that only look at it."""
    return build_run(
        stack,
        spec,
        run,
        settings,
        template,
        project_info,
        insecure_http_git_hosts,
        source,
        ended_runs,
    ).job


def build_run(
    stack: Mapping[str, Any],
    spec: StackSpec,
    run: Run,
    settings: JobSettings,
    template: Mapping[str, Any],
    project_info: ProjectInfo | None = None,
    insecure_http_git_hosts: Sequence[str] = (),
    source: Mapping[str, Any] | None = None,
    ended_runs: Sequence[str] = (),
) -> RunObjects:
    """The Job for ``run`` of ``stack`` (whose parsed, valid spec is ``spec``), and its inputs.

    ``insecure_http_git_hosts`` are the hosts to which the operator lets git credentials
    travel over plain ``http://`` (``Settings.insecure_http_git_hosts``). ``source`` is the
    observed ``Program`` of a Stack with ``spec.programRef`` (rendered into the snapshot, so
    the run uses exactly that version) or its Flux source (whose artifact URL, revision and
    digest go into the snapshot). ``ended_runs``: the Stack's finished Jobs, whose
    stale Pulumi locks the run may remove.
    """
    meta = stack.get("metadata") or {}
    stack_name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    name = job_name(stack_name, uid, run)
    labels = run_labels(stack, run.operation)
    workspace = spec.workspace_template.spec if spec.workspace_template else None
    _check_git_transport(spec, insecure_http_git_hosts)
    workspace_env = copy.deepcopy((workspace.env if workspace else None) or [])
    inline = _InlineSecrets(run_secret_name(name), {})
    environment = _environment(spec, workspace_env, inline)
    snapshot = build_snapshot(
        stack,
        spec,
        run,
        name,
        project_info,
        environment.config_from_env,
        environment.git_auth,
        environment.secrets_from_env,
        source,
        ended_runs,
    )
    annotations = {JOB_STACK_UID_ANNOTATION: uid, RUN_ANNOTATION: run.to_annotation()}
    if labels[STACK_LABEL] != stack_name:
        annotations[STACK_NAME_ANNOTATION] = stack_name

    job: JSON = copy.deepcopy(dict(template))
    pod_template: JSON = job.setdefault("spec", {}).setdefault("template", {})
    pod_spec: JSON = pod_template.setdefault("spec", {})
    container = _pulumi_container(pod_spec)

    container["image"] = (workspace.image if workspace else None) or settings.image
    container["imagePullPolicy"] = (
        workspace.image_pull_policy if workspace else None
    ) or settings.image_pull_policy
    if workspace is not None and workspace.resources is not None:
        container["resources"] = copy.deepcopy(workspace.resources)
    container["env"] = [
        *(container.get("env") or []),
        *workspace_env,
        *environment.env,
    ]
    container["envFrom"] = [
        *(container.get("envFrom") or []),
        *copy.deepcopy((workspace.env_from if workspace else None) or []),
        *environment.env_from,
    ]
    if not container["envFrom"]:
        del container["envFrom"]
    _replace_container(pod_spec, container)
    pod_spec["serviceAccountName"] = (
        spec.service_account_name
        or (workspace.service_account_name if workspace else None)
        or settings.service_account
    )
    pod_spec["terminationGracePeriodSeconds"] = int(
        settings.termination_grace_period.total_seconds()
    )
    _check_service_account(spec)

    if workspace is not None and workspace.pod_template:
        patched = merge_named(pod_template, workspace.pod_template)
        pod_template.clear()
        pod_template.update(patched)
    job_template = spec.job_template
    if job_template is not None:
        if job_template.spec:
            pod_template["spec"] = merge_named(pod_template.get("spec") or {}, job_template.spec)
        if job_template.metadata is not None:
            for field in ("labels", "annotations"):
                extra = getattr(job_template.metadata, field) or {}
                for target in (
                    job.setdefault("metadata", {}),
                    pod_template.setdefault("metadata", {}),
                ):
                    target[field] = {**(target.get(field) or {}), **extra}

    _apply_invariants(job, pod_template, name, namespace, labels, annotations, stack_name, uid)
    job_spec = job["spec"]
    deadline = spec.timeout_seconds or settings.active_deadline.total_seconds()
    # Within the CRD's bound even for a spec stored before it existed: a huge deadline
    # overflows the Job controller, which then fails every run as DeadlineExceeded.
    job_spec["activeDeadlineSeconds"] = int(min(max(deadline, 1), MAX_SPEC_SECONDS))
    if run.kind == "approval":
        # Its plan Secret lives as long as the Job: the controller deletes the Job when the
        # plan is used, superseded or rejected (it has no right to delete Secrets itself).
        job_spec.pop("ttlSecondsAfterFinished", None)
    else:
        job_spec["ttlSecondsAfterFinished"] = int(settings.ttl_after_finished.total_seconds())
    runner = _pulumi_container(pod_template["spec"])
    # The runner scrubs the values of these variables from everything it writes.
    secret_env = sorted(
        {
            str(e["name"])
            for e in runner.get("env") or []
            if "secretKeyRef" in (e.get("valueFrom") or {})
        }
    )
    snapshot = snapshot.model_copy(
        update={
            "secret_env": secret_env,
            "insecure_http_git_hosts": list(insecure_http_git_hosts),
        }
    )
    runner["command"] = _runner_command(pod_template["spec"], runner, settings)
    _writable_tmp(pod_template["spec"], runner)
    input_labels = {**labels, RUN_INPUT_LABEL: name}
    del input_labels[MANAGED_BY_LABEL]
    runner["args"], inputs = snapshot_transport(
        snapshot.model_dump_json(by_alias=True, exclude_none=True), name, namespace, input_labels
    )
    if inline.values:
        inputs.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": inline.secret_name,
                    "namespace": namespace,
                    "labels": input_labels,
                },
                "type": "Opaque",
                "immutable": True,
                "stringData": inline.values,
            }
        )
    # The runner's cancellation budget is the grace period the pod really gets.
    grace = pod_template["spec"].get("terminationGracePeriodSeconds")
    owned = {ENV_GRACE_PERIOD, JOB_UID_ENV, TERMINATION_MESSAGE_PATH_ENV}
    runner["env"] = [
        *(e for e in runner.get("env") or [] if e.get("name") not in owned),
        {"name": ENV_GRACE_PERIOD, "value": str(grace)},
        {
            "name": JOB_UID_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_UID_LABEL}']"}},
        },
        # The runner vouches for its result there; the controller reads it from the pod's
        # status (docs/security.md), so no template may move it.
        {"name": TERMINATION_MESSAGE_PATH_ENV, "value": TERMINATION_MESSAGE_PATH},
    ]
    runner["terminationMessagePath"] = TERMINATION_MESSAGE_PATH
    _replace_container(pod_template["spec"], runner)
    _share_dynamic_env(pod_template["spec"])
    _check_pod_security(pod_template, settings.pod_security_level, template)
    return RunObjects(job, tuple(inputs))


def snapshot_transport(
    text: str, job: str, namespace: str, labels: Mapping[str, str]
) -> tuple[list[str], list[JSON]]:
    """The runner's arguments for snapshot ``text``, and the ConfigMaps that hold it when it
    is too large to be an argument itself (then the arguments name them and its SHA-256)."""
    if len(text.encode("utf-8")) <= MAX_INLINE_SNAPSHOT_BYTES:
        return [SNAPSHOT_FLAG, text], []
    args: list[str] = []
    configmaps: list[JSON] = []
    for index, part in enumerate(split_snapshot(text)):
        name = f"{job}-snapshot-{index}"
        args += [SNAPSHOT_CONFIGMAP_FLAG, f"{namespace}/{name}"]
        configmaps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "immutable": True,
                "data": {SNAPSHOT_KEY: part},
            }
        )
    return [*args, SNAPSHOT_SHA256_FLAG, snapshot_sha256(text)], configmaps


def owned_by_job(obj: Mapping[str, Any], job_name: str, job_uid: str) -> JSON:
    """Run input ``obj`` owned by its Job, so the garbage collector removes it with the Job."""
    owned: JSON = copy.deepcopy(dict(obj))
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name,
            "uid": job_uid,
            "controller": True,
        }
    ]
    return owned


def _check_git_transport(spec: StackSpec, allowed_hosts: Sequence[str]) -> None:
    url = spec.project_repo or ""
    if credentials_allowed(url, allowed_hosts):
        return
    if has_url_credentials(url):
        raise JobBuildError(refusal_message(url, "the user name and password in spec.projectRepo"))
    if spec.git_auth is not None or spec.git_auth_secret:
        what = "spec.gitAuth" if spec.git_auth is not None else "spec.gitAuthSecret"
        raise JobBuildError(refusal_message(url, f"the git credentials of {what}"))


def _check_service_account(spec: StackSpec) -> None:
    """The templates may not give the run another ServiceAccount, or take its token away.

    A template may repeat the ServiceAccount the Stack names, nothing else (not the
    controller's default either: the CRD's CEL rule, which cannot know it, decides alike).
    """
    workspace = spec.workspace_template.spec if spec.workspace_template else None
    named = spec.service_account_name or (workspace.service_account_name if workspace else "")
    pod_template = (workspace.pod_template if workspace else None) or {}
    layers = (
        ("spec.workspaceTemplate.spec.podTemplate.spec", pod_template.get("spec")),
        ("spec.jobTemplate.spec", spec.job_template.spec if spec.job_template else None),
    )
    for path, pod_spec in layers:
        if not isinstance(pod_spec, Mapping):
            continue
        for field in SERVICE_ACCOUNT_FIELDS:
            value = pod_spec.get(field)
            if value is not None and (not named or value != named):
                raise JobBuildError(
                    f"{path}.{field} is {value!r}, but a run's ServiceAccount comes only from "
                    "spec.serviceAccountName (or spec.workspaceTemplate.spec."
                    f"serviceAccountName): set it there and remove {path}.{field}"
                )
        automount = pod_spec.get("automountServiceAccountToken")
        if automount is not None and automount is not True:
            raise JobBuildError(
                f"{path}.automountServiceAccountToken is {automount!r}: the run writes its "
                "result with its ServiceAccount's token; remove the field"
            )


def _check_pod_security(pod_template: JSON, level: Level, template: Mapping[str, Any]) -> None:
    violations = check_pod(pod_template.get("metadata") or {}, pod_template["spec"], level)
    if not violations:
        return
    # What the controller's own template already breaks is the operator's to fix. (The
    # fields build_run sets before the Stack's own — image, env, resources, the
    # ServiceAccount, the grace period — are none that Pod Security looks at.)
    controller_pod = (template.get("spec") or {}).get("template") or {}
    template_fields = {
        v.field
        for v in check_pod(
            controller_pod.get("metadata") or {}, controller_pod.get("spec") or {}, level
        )
    }
    from_stack = [v for v in violations if v.field not in template_fields]
    if from_stack:
        raise JobBuildError(
            f"the run's pod would break Pod Security level {level!r} ({POD_SECURITY_SETTING}): "
            f"{_quote(from_stack)}; remove or change these fields in spec.jobTemplate.spec or "
            "spec.workspaceTemplate.spec.podTemplate"
        )
    raise JobBuildError(
        f"the controller's Job template breaks Pod Security level {level!r} "
        f"({POD_SECURITY_SETTING}): {_quote(violations)}; the operator must fix "
        f"PKOBATCH_JOB__TEMPLATE_FILE or choose another level"
    )


def _quote(violations: list[Violation]) -> str:
    shown = "; ".join(f"pod {v}" for v in violations[:MAX_REPORTED_VIOLATIONS])
    more = len(violations) - MAX_REPORTED_VIOLATIONS
    return shown + (f"; and {more} more" if more > 0 else "")


def _with_named(items: list[JSON] | None, item: JSON, *, first: bool = False) -> list[JSON]:
    """``items`` with ``item`` in place of the one of the same name, else added."""
    others = [i for i in items or [] if i.get("name") != item["name"]]
    return [item, *others] if first else [*others, item]


def _share_dynamic_env(pod_spec: JSON) -> None:
    """PKO's dynamic environment, so its manifests work unchanged: the ``share`` emptyDir
    (unless a template defines that volume), mounted in the run container where PKO mounts
    it, and ``$PULUMI_ENV`` naming the file on it in every container and init container, as
    PKO sets it after merging the pod template."""
    if not any(v.get("name") == SHARE_VOLUME for v in pod_spec.get("volumes") or []):
        pod_spec["volumes"] = [
            *(pod_spec.get("volumes") or []),
            {"name": SHARE_VOLUME, "emptyDir": {}},
        ]
    runner = _pulumi_container(pod_spec)
    mounts = runner.get("volumeMounts") or []
    if not any(
        m.get("name") == SHARE_VOLUME or m.get("mountPath") == SHARE_MOUNT_PATH for m in mounts
    ):
        runner["volumeMounts"] = [*mounts, {"name": SHARE_VOLUME, "mountPath": SHARE_MOUNT_PATH}]
    _replace_container(pod_spec, runner)
    variable = {"name": DYNAMIC_ENV_VAR, "value": DYNAMIC_ENV_FILE}
    for kind in ("initContainers", "containers"):
        for container in pod_spec.get(kind) or []:
            container["env"] = _with_named(container.get("env"), variable)


def _runner_command(pod_spec: JSON, runner: JSON, settings: JobSettings) -> list[str]:
    """The run container's command. In the runner image it is ``settings.command``; in any
    other image it is the runner bundle, which an init container from the runner image
    copies into an ``emptyDir`` shared with the run container (added to ``pod_spec`` and
    ``runner`` here). The init container gets the run container's resources, so the pod's
    effective request does not grow and a quota that requires requests admits it. Unless a
    template names a user, the run container runs as PKO runs workspace pods (uid/gid 1000)."""
    if runner.get("image") == settings.image:
        return list(settings.command)
    mount = {"name": BUNDLE_VOLUME, "mountPath": BUNDLE_MOUNT_PATH}
    init: JSON = {
        "name": BUNDLE_INIT_CONTAINER,
        "image": settings.bundle_image or settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["cp", "-R", settings.runner_bundle, INJECTED_BUNDLE],
        "volumeMounts": [mount],
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY_CONTEXT),
    }
    if runner.get("resources"):
        init["resources"] = copy.deepcopy(runner["resources"])
    pod_spec["initContainers"] = _with_named(pod_spec.get("initContainers"), init, first=True)
    pod_spec["volumes"] = _with_named(
        pod_spec.get("volumes"), {"name": BUNDLE_VOLUME, "emptyDir": {}}
    )
    runner["volumeMounts"] = _with_named(runner.get("volumeMounts"), {**mount, "readOnly": True})
    pod_context = pod_spec.get("securityContext") or {}
    context = runner.setdefault("securityContext", {})
    if "runAsUser" not in pod_context and "runAsUser" not in context:
        context["runAsUser"] = PKO_RUN_AS_USER
        if "runAsGroup" not in pod_context:
            context.setdefault("runAsGroup", PKO_RUN_AS_USER)
    return [INJECTED_RUNNER, *JOB_RUN_ARGS]


def _writable_tmp(pod_spec: JSON, runner: JSON) -> None:
    """A run container whose root filesystem is read-only (``readOnlyRootFilesystem``, set
    by a template) gets an ``emptyDir`` at ``/tmp`` unless a template mounts something there,
    and ``TMPDIR`` and ``HOME`` set to it unless its ``env`` sets them: the runner's
    workspace, Pulumi's home and the CLI's temporary files need a writable directory."""
    if not (runner.get("securityContext") or {}).get("readOnlyRootFilesystem"):
        return
    mounts = runner.get("volumeMounts") or []
    if not any(m.get("mountPath", "").rstrip("/") == TMP_DIR for m in mounts):
        pod_spec["volumes"] = _with_named(
            pod_spec.get("volumes"), {"name": TMP_VOLUME, "emptyDir": {}}
        )
        runner["volumeMounts"] = _with_named(mounts, {"name": TMP_VOLUME, "mountPath": TMP_DIR})
    named = {e.get("name") for e in runner.get("env") or []}
    runner["env"] = [
        *(runner.get("env") or []),
        *({"name": name, "value": TMP_DIR} for name in ("TMPDIR", "HOME") if name not in named),
    ]


def _apply_invariants(
    job: JSON,
    pod_template: JSON,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    stack_name: str,
    uid: str,
) -> None:
    job["apiVersion"] = "batch/v1"
    job["kind"] = "Job"
    metadata = job.setdefault("metadata", {})
    for transient in ("resourceVersion", "uid", "creationTimestamp", "generateName"):
        metadata.pop(transient, None)
    metadata["name"] = name
    metadata["namespace"] = namespace
    metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    if SHARD_LABEL not in labels:
        # Not even spec.jobTemplate may move the run out of its Stack's shard.
        metadata["labels"].pop(SHARD_LABEL, None)
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    metadata["ownerReferences"] = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": stack_name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod_meta = pod_template.setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
    if SHARD_LABEL not in labels:
        pod_meta["labels"].pop(SHARD_LABEL, None)
    job["spec"]["backoffLimit"] = 0
    job["spec"].pop("selector", None)
    job["spec"].pop("manualSelector", None)
    pod_template.setdefault("spec", {})["restartPolicy"] = "Never"
