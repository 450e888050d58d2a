"""The Job of one run, built by a pure function from the template, settings and Stack.

Layers, each applied over the previous one, each a function of ``build_run``:

1. the Job template (``job_template.yaml`` in this package, or ``Settings.job.template_file``);
2. what the controller owns: image, ServiceAccount, grace period and the environment that
   carries credentials, where ``spec.workspaceTemplate.spec`` (PKO's mappable fields: image,
   pull policy, resources, env, envFrom, and ``securityProfile: baseline``, which takes the
   restricted parts out of the template's security context) comes first (layers 1 and 2:
   ``_base_job``);
3. ``spec.workspaceTemplate.spec.podTemplate`` (``_apply_workspace_template``), then the
   labels and annotations of ``workspaceTemplate.metadata`` and ``updateTemplate.metadata``
   on the Job only, as PKO puts them on its Workspace and Update objects, not on its pod
   (``_apply_template_metadata``);
4. ``spec.jobTemplate`` (pkobatch: labels, annotations, pod spec fields;
   ``_apply_job_template``);

   both merged as the API server applies a strategic merge patch
   (``pkobatch.api.strategic_merge``: merge keys, ``$patch`` directives), as PKO merges its
   pod template. The parts of PKO's workspace pod that pkobatch's pod has under the same name
   (container ``pulumi``, volume ``share``) mean the same there; PKO's init containers
   ``bootstrap`` and ``fetch`` have no counterpart, and a pod template that names them is
   refused (``PKO_INIT_CONTAINERS``);
5. the invariants again (name, labels, owner, ``restartPolicy: Never``, ``backoffLimit: 0``:
   ``_apply_invariants``; deadline and TTL, the latter from
   ``updateTemplate.spec.ttlAfterCompleted`` when set: ``_apply_run_bounds``), so no template
   can break the run contract;
6. the runner's inputs on the final pod (``_apply_runner_inputs``): its command, its
   ``RunSnapshot``, the variables it owns; a run container a template made read-only
   (``readOnlyRootFilesystem``) gets a writable ``/tmp``; with the run cache enabled, the
   cache the controller chose (``run_cache``: the namespace's claim or an ``emptyDir``).

Three modules hold the parts: ``run_credentials`` (the environment that carries
credentials), ``run_snapshot`` (the ``RunSnapshot`` and how it reaches the runner) and
``run_pod`` (the run container, the injected runner, PKO's share volume).

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
runtimes, executes that copy (``run_pod.runner_command``). This is decided last, on the final
image, so no layer can leave a run without a runner.

Secrets never reach the Job as values: every credential becomes a ``secretKeyRef`` or
``envFrom.secretRef`` resolved by the kubelet (``run_credentials``), and the snapshot names
the environment variables that hold them.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from importlib import resources
from typing import Any, Final

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
    RUN_CONTAINER_NAME,
    SHARD_LABEL,
    STACK_LABEL,
    STACK_NAME_ANNOTATION,
)
from pkobatch.api.durations import parse_duration
from pkobatch.api.git_transport import credentials_allowed, has_url_credentials, refusal_message
from pkobatch.api.objects import JSON
from pkobatch.api.pod_security import Level, Violation, check_pod
from pkobatch.api.run import (
    JOB_UID_ENV,
    JOB_UID_LABEL,
    MAX_UNTAR_SIZE_ENV,
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_PATH_ENV,
    ProjectInfo,
    Run,
    RunSnapshot,
)
from pkobatch.api.stack.base import MAX_SPEC_SECONDS
from pkobatch.api.stack.spec import JobTemplate, StackSpec, WorkspaceTemplateSpec
from pkobatch.api.strategic_merge import (
    DIRECTIVE,
    POD_SPEC,
    POD_TEMPLATE,
    SET_ELEMENT_ORDER,
    Path,
    StrategicMergeError,
    strategic_merge,
)
from pkobatch.config import JobSettings
from pkobatch.controller.run_cache import CacheChoice, mount_cache
from pkobatch.controller.run_credentials import (
    InlineSecrets,
    RunEnvironment,
    run_environment,
    run_secret_name,
)
from pkobatch.controller.run_pod import (
    BUNDLE_INIT_CONTAINER,
    JobBuildError,
    replace_run_container,
    run_container,
    runner_command,
    share_dynamic_env,
    writable_tmp,
)
from pkobatch.controller.run_snapshot import build_snapshot, snapshot_transport

TEMPLATE_RESOURCE: Final = "job_template.yaml"
MAX_NAME_LENGTH: Final = 63
# Pod Security violations quoted in one message (the rest are counted).
MAX_REPORTED_VIOLATIONS: Final = 5
POD_SECURITY_SETTING: Final = "PKOBATCH_JOB__POD_SECURITY_LEVEL"
SERVICE_ACCOUNT_FIELDS: Final = ("serviceAccountName", "serviceAccount")
_HASH_LENGTH: Final = 10

# Read by the runner (pkobatch.runner.cancel) to pace a clean Pulumi cancellation.
ENV_GRACE_PERIOD: Final = "PKOBATCH_GRACE_PERIOD_SECONDS"
# The label that ties a run input (Secret, snapshot ConfigMap) to its Job. Inputs carry no
# managed-by label: the controller's ConfigMap cache (managed-by selector) must not hold them.
RUN_INPUT_LABEL: Final = f"{PREFIX}/run-input-of"
WORKSPACE_POD_TEMPLATE: Final = "spec.workspaceTemplate.spec.podTemplate"
JOB_POD_SPEC: Final = "spec.jobTemplate.spec"
WORKSPACE_METADATA: Final = "spec.workspaceTemplate.metadata"
UPDATE_METADATA: Final = "spec.updateTemplate.metadata"
# What PKO's restricted security profile adds and its baseline profile lacks.
BASELINE_RELAXED_POD_FIELDS: Final = ("runAsNonRoot",)
BASELINE_RELAXED_CONTAINER_FIELDS: Final = (
    "runAsNonRoot",
    "allowPrivilegeEscalation",
    "capabilities",
)
# A shorter TTL could delete a finished Job and its result before a busy or restarting
# controller has folded them (the run would end as vanished).
MIN_FINISHED_JOB_TTL: Final = timedelta(minutes=10)
# PKO's init containers (its workspace pod, operator/internal/controller/auto/
# workspace_controller.go): what each does, and what a template writes for pkobatch instead.
PKO_INIT_CONTAINERS: Final = {
    "bootstrap": (
        "copies PKO's agent into the pod; pkobatch's runner needs no agent (an image other than "
        f"the runner image gets the runner from the init container {BUNDLE_INIT_CONTAINER!r}, "
        "which takes the run container's resources and a restricted security context)"
    ),
    "fetch": (
        "fetches the source; pkobatch fetches it inside the run container "
        f"{RUN_CONTAINER_NAME!r}: put what the fetch needs (env, envFrom, volumeMounts) on "
        f"containers[name={RUN_CONTAINER_NAME}] or in spec.workspaceTemplate.spec.env"
    ),
}


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
    if not any(isinstance(c, dict) and c.get("name") == RUN_CONTAINER_NAME for c in containers):
        raise JobBuildError(f"{source}: needs a container named {RUN_CONTAINER_NAME!r}")
    return data


def builtin_template() -> JSON:
    return parse_template(_builtin_template_text(), f"pkobatch/controller/{TEMPLATE_RESOURCE}")


@dataclass(frozen=True)
class RunObjects:
    """A run's Job, and the inputs its pod reads that do not fit into it (usually none)."""

    job: JSON
    # Created right after the Job, owned by it (``owned_by_job``); the pod waits for them.
    inputs: tuple[JSON, ...] = ()


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
    cache: CacheChoice | None = None,
) -> RunObjects:
    """The Job for ``run`` of ``stack`` (whose parsed, valid spec is ``spec``), and its inputs.

    ``insecure_http_git_hosts`` are the hosts to which the operator lets git credentials
    travel over plain ``http://`` (``Settings.insecure_http_git_hosts``). ``source`` is the
    observed ``Program`` of a Stack with ``spec.programRef`` (rendered into the snapshot, so
    the run uses exactly that version) or its Flux source (whose artifact URL, revision and
    digest go into the snapshot). ``ended_runs``: the Stack's finished Jobs, whose
    stale Pulumi locks the run may remove. ``cache``: the run cache to mount (None: the run
    cache is disabled, the pod gets none).
    """
    meta = stack.get("metadata") or {}
    stack_name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    name = job_name(stack_name, uid, run)
    labels = run_labels(stack, run.operation)
    workspace = spec.workspace_template.spec if spec.workspace_template else None
    _check_git_transport(spec, insecure_http_git_hosts)
    workspace_env = copy.deepcopy((workspace.env if workspace else None) or [])
    inline = InlineSecrets(run_secret_name(name), {})
    environment = run_environment(spec, workspace_env, inline)
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
        insecure_http_git_hosts,
    )
    annotations = {JOB_STACK_UID_ANNOTATION: uid, RUN_ANNOTATION: run.to_annotation()}
    if labels[STACK_LABEL] != stack_name:
        annotations[STACK_NAME_ANNOTATION] = stack_name

    job = _base_job(template, spec, workspace, workspace_env, environment, settings)
    _check_service_account(spec)
    _apply_workspace_template(job, workspace)
    _apply_template_metadata(job, spec)
    _apply_job_template(job, spec.job_template)
    _apply_invariants(job, name, namespace, labels, annotations, stack, uid)
    _apply_run_bounds(job, spec, run, settings)
    inputs = _apply_runner_inputs(job, snapshot, inline, labels, settings, cache)
    _check_pod_security(job["spec"]["template"], settings.pod_security_level, template)
    return RunObjects(job, inputs)


def _base_job(
    template: Mapping[str, Any],
    spec: StackSpec,
    workspace: WorkspaceTemplateSpec | None,
    workspace_env: list[JSON],
    environment: RunEnvironment,
    settings: JobSettings,
) -> JSON:
    """Layers 1 and 2: the Job template with the fields the controller owns, where
    ``workspaceTemplate.spec`` fills the run container's image, pull policy, resources, env
    and envFrom and the ServiceAccount before the controller's defaults."""
    job: JSON = copy.deepcopy(dict(template))
    pod_template: JSON = job.setdefault("spec", {}).setdefault("template", {})
    pod_spec: JSON = pod_template.setdefault("spec", {})
    container = run_container(pod_spec)

    container["image"] = (workspace.image if workspace else None) or settings.image
    container["imagePullPolicy"] = (
        workspace.image_pull_policy if workspace else None
    ) or settings.image_pull_policy
    if workspace is not None and workspace.resources is not None:
        container["resources"] = copy.deepcopy(workspace.resources)
    # The controller's default bound comes first: a later entry of the same name (the
    # template's, the Stack's) wins in the pod.
    untar_limit = settings.flux_max_untar_size_bytes
    container["env"] = [
        *(
            [{"name": MAX_UNTAR_SIZE_ENV, "value": str(untar_limit)}]
            if spec.flux_source is not None and untar_limit is not None
            else []
        ),
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
    replace_run_container(pod_spec, container)
    if workspace is not None and workspace.security_profile == "baseline":
        _relax_to_baseline(pod_spec)
    pod_spec["serviceAccountName"] = (
        spec.service_account_name
        or (workspace.service_account_name if workspace else None)
        or settings.service_account
    )
    pod_spec["terminationGracePeriodSeconds"] = int(
        settings.termination_grace_period.total_seconds()
    )
    return job


def _relax_to_baseline(pod_spec: JSON) -> None:
    """PKO's ``securityProfile: baseline``: its workspace pod keeps only the pod's
    RuntimeDefault seccomp profile; the restricted profile's non-root user, no privilege
    escalation and dropped capabilities are not applied. Here they come from the Job
    template, so they are taken out of it; the templates merged later may set them again."""
    pod_context = pod_spec.setdefault("securityContext", {})
    for field in BASELINE_RELAXED_POD_FIELDS:
        pod_context.pop(field, None)
    pod_context["seccompProfile"] = {"type": "RuntimeDefault"}
    for container in [*(pod_spec.get("initContainers") or []), *pod_spec.get("containers", [])]:
        context = container.get("securityContext")
        if not isinstance(context, dict):
            continue
        for field in BASELINE_RELAXED_CONTAINER_FIELDS:
            context.pop(field, None)
        if not context:
            del container["securityContext"]


def _apply_template_metadata(job: JSON, spec: StackSpec) -> None:
    """``workspaceTemplate.metadata`` and then ``updateTemplate.metadata``: their labels and
    annotations go on the Job, the counterpart of PKO's Workspace and Update objects, and not
    on its pod, as PKO does not put them on its workspace pod (``podTemplate.metadata`` and
    ``jobTemplate.metadata`` reach the pod)."""
    metadata = job.setdefault("metadata", {})
    for field, template in (
        (WORKSPACE_METADATA, spec.workspace_template),
        (UPDATE_METADATA, spec.update_template),
    ):
        source = (template.metadata if template else None) or {}
        for kind in ("labels", "annotations"):
            extra = source.get(kind) or {}
            if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
                raise JobBuildError(
                    f"{field}.{kind} must map names to strings; quote numbers and booleans"
                )
            metadata[kind] = {**(metadata.get(kind) or {}), **extra}


def _apply_workspace_template(job: JSON, workspace: WorkspaceTemplateSpec | None) -> None:
    """Layer 3: ``spec.workspaceTemplate.spec.podTemplate`` merged over the pod template as
    PKO merges it over its workspace pod: a strategic merge in which the base's init
    containers stay ahead of the template's (PKO adds ``$setElementOrder/initContainers``)."""
    if workspace is None or not workspace.pod_template:
        return
    pod_template: JSON = job["spec"]["template"]
    patch = copy.deepcopy(workspace.pod_template)
    patch_spec = patch.get("spec")
    if isinstance(patch_spec, dict):
        _refuse_pko_init_containers(patch_spec)
        _base_init_containers_first(pod_template.get("spec") or {}, patch_spec)
    patched = _merged(pod_template, patch, WORKSPACE_POD_TEMPLATE, POD_TEMPLATE)
    pod_template.clear()
    pod_template.update(patched)


def _refuse_pko_init_containers(patch_spec: JSON) -> None:
    for item in patch_spec.get("initContainers") or []:
        name = item.get("name") if isinstance(item, dict) else None
        if name in PKO_INIT_CONTAINERS:
            raise JobBuildError(
                f"{WORKSPACE_POD_TEMPLATE}.spec.initContainers[name={name}]: PKO's init "
                f"container {name!r} {PKO_INIT_CONTAINERS[name]}; remove this entry"
            )


def _base_init_containers_first(base_spec: JSON, patch_spec: JSON) -> None:
    order_key = f"{SET_ELEMENT_ORDER}/initContainers"
    added = patch_spec.get("initContainers")
    if not isinstance(added, list) or order_key in patch_spec:
        return
    named = [
        item["name"]
        for item in [*(base_spec.get("initContainers") or []), *added]
        if isinstance(item, dict) and "name" in item and DIRECTIVE not in item
    ]
    patch_spec[order_key] = [{"name": name} for name in named]


def _merged(base: JSON, patch: JSON, field: str, root: Path) -> JSON:
    try:
        return strategic_merge(base, patch, root)
    except StrategicMergeError as exc:
        raise JobBuildError(
            f"{field} is not a valid strategic merge patch: {exc}; fix it "
            "(docs/api.md, 'Pod templates: the strategic merge')"
        ) from None


def _apply_job_template(job: JSON, job_template: JobTemplate | None) -> None:
    """Layer 4: ``spec.jobTemplate``'s pod spec merged over the pod's (a strategic merge, as
    layer 3), its labels and annotations added to the Job's and the pod's."""
    if job_template is None:
        return
    pod_template: JSON = job["spec"]["template"]
    if job_template.spec:
        pod_template["spec"] = _merged(
            pod_template.get("spec") or {}, job_template.spec, JOB_POD_SPEC, POD_SPEC
        )
    if job_template.metadata is not None:
        for field in ("labels", "annotations"):
            extra = getattr(job_template.metadata, field) or {}
            for target in (job.setdefault("metadata", {}), pod_template.setdefault("metadata", {})):
                target[field] = {**(target.get(field) or {}), **extra}


def _apply_run_bounds(job: JSON, spec: StackSpec, run: Run, settings: JobSettings) -> None:
    """The run's deadline and how long its finished Job stays."""
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
        job_spec["ttlSecondsAfterFinished"] = finished_job_ttl(spec, settings)


def finished_job_ttl(spec: StackSpec, settings: JobSettings) -> int:
    """Seconds a finished Job stays: ``updateTemplate.spec.ttlAfterCompleted`` (PKO's Update
    TTL) or the controller's setting, never under ``MIN_FINISHED_JOB_TTL``: the Job's result
    goes with it, and the controller must fold it into the status first."""
    update = spec.update_template.spec if spec.update_template else None
    ttl = (
        parse_duration(update.ttl_after_completed)
        if update is not None and update.ttl_after_completed is not None
        else settings.ttl_after_finished
    )
    return int(min(max(ttl, MIN_FINISHED_JOB_TTL).total_seconds(), MAX_SPEC_SECONDS))


def _apply_runner_inputs(
    job: JSON,
    snapshot: RunSnapshot,
    inline: InlineSecrets,
    labels: Mapping[str, str],
    settings: JobSettings,
    cache: CacheChoice | None,
) -> tuple[JSON, ...]:
    """The last layer, on the final pod: the runner's command (injected into a foreign
    image), its snapshot (as an argument or in ConfigMaps), the variables it owns, PKO's
    dynamic environment; returns the run inputs to create beside the Job."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    pod_spec: JSON = job["spec"]["template"]["spec"]
    runner = run_container(pod_spec)
    # The runner scrubs the values of these variables from everything it writes.
    secret_env = sorted(
        {
            str(e["name"])
            for e in runner.get("env") or []
            if "secretKeyRef" in (e.get("valueFrom") or {})
        }
    )
    snapshot = snapshot.model_copy(update={"secret_env": secret_env})
    runner["command"] = runner_command(pod_spec, runner, settings)
    writable_tmp(pod_spec, runner)
    if cache is not None:
        mount_cache(job, pod_spec, runner, cache)
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
    grace = pod_spec.get("terminationGracePeriodSeconds")
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
    replace_run_container(pod_spec, runner)
    share_dynamic_env(pod_spec)
    return tuple(inputs)


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


def _apply_invariants(
    job: JSON,
    name: str,
    namespace: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    owner: Mapping[str, Any],
    uid: str,
) -> None:
    """Layer 5: what no template may change (name, labels, owner, no retries, no restarts).

    The owner is the Stack, or the object a run is made for when it says what it is (its
    ``apiVersion`` and ``kind``: a PKO Update, ``controller.auto_runs``)."""
    pod_template: JSON = job["spec"]["template"]
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
            "apiVersion": str(owner.get("apiVersion") or API_VERSION),
            "kind": str(owner.get("kind") or KIND),
            "name": str(owner["metadata"]["name"]),
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
