"""PKO's ``auto.pulumi.com`` Workspace and Update, run as Jobs (pure decisions).

In PKO a Workspace is a long-lived pod and an Update one call into it. Here an Update is one
Job, built by the Stack's own Job builder (``job_builder.build_run``) from the Stack spec that
says the same thing (``stack_spec_manifest``): the Workspace's source, image, env, envFrom,
resources, podTemplate, ServiceAccount, securityProfile, pulumiLogLevel and its entry of
``spec.stacks`` become the Stack's fields and ``workspaceTemplate.spec``; the Update's
options become ``updateTemplate.spec``, which the runner already honours. The run's result
is folded by the Stack's own rules (``outcome.job_outcome``: a result only its pod vouches
for, else the Job's and pod's failure).

**Workspace.** There is no pod to be ready. ``Ready=True`` (reason ``Succeeded``) means
that Updates can run against it: its spec translates into a valid run (exactly one source,
every field either mapped or reported). Otherwise ``Ready=False`` and ``Stalled=True`` with
reason ``SpecInvalid`` and a message naming the fields to change. ``serviceTemplate``, which
has nothing to apply to, is reported in condition ``FieldsIgnored``
(``NotApplicableToJobs``), as on Stacks.

**Update.** Its status follows PKO's update controller: ``startTime`` when its Job is
created, then ``Progressing=True``; once the Job has finished, ``endTime``, ``message``,
``permalink``, ``projectInfo``, ``Progressing=False``, ``Complete=True`` and ``Failed``
(``False``/``UpdateSucceeded``, or ``True`` with ``UpdateFailed`` or the result's reason,
e.g. ``UpdateConflict``). A successful run's outputs go into the immutable Secret
``<update>-stack-outputs`` named by ``status.outputs`` — with secret outputs as
``[secret]``: the controller never holds a secret value (PKO's Secret holds the values; the
keys of secret outputs are listed in annotation ``pulumi.com/secrets`` as PKO lists them).
An Update that cannot run (its spec, its Workspace's spec, a Job the builder refuses) is
completed as failed at once with reason ``SpecInvalid`` and a message saying what to fix.
``spec.ttlAfterCompleted`` deletes a completed Update that long after its ``endTime``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError

from pkobatch.api.conditions import ConditionStatus, find_condition, set_condition
from pkobatch.api.constants import (
    AUTO_GROUP,
    AUTO_VERSION,
    CONDITION_FIELDS_IGNORED,
    CONDITION_READY,
    CONDITION_STALLED,
    FIELDS_IGNORED_REASON,
    OPERATIONS,
    STALLED_SPEC_INVALID_REASON,
    Operation,
)
from pkobatch.api.durations import parse_duration
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import JSON
from pkobatch.api.run import Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.stack.status import Condition
from pkobatch.api.stack.validation import validate_stack_spec
from pkobatch.api.timestamps import format_time, parse_time
from pkobatch.api.update import UPDATE_KIND
from pkobatch.config import JobSettings
from pkobatch.controller.fold import sanitize_output_key
from pkobatch.controller.job_builder import RunObjects, build_run, job_name
from pkobatch.controller.outcome import Outcome, job_outcome
from pkobatch.controller.run_pod import JobBuildError

AUTO_API_VERSION: Final = f"{AUTO_GROUP}/{AUTO_VERSION}"
# PKO's names: the outputs Secret and its labels and annotation.
OUTPUTS_SECRET_SUFFIX: Final = "-stack-outputs"
SECRETS_ANNOTATION: Final = "pulumi.com/secrets"
COMPONENT_LABEL: Final = "auto.pulumi.com/component"
UPDATE_NAME_LABEL: Final = "auto.pulumi.com/update-name"
# PKO's Update conditions and reasons.
CONDITION_PROGRESSING: Final = "Progressing"
CONDITION_COMPLETE: Final = "Complete"
CONDITION_FAILED: Final = "Failed"
PROGRESSING_REASON: Final = "Progressing"
COMPLETE_REASON: Final = "Complete"
UPDATED_REASON: Final = "Updated"
SUCCEEDED_REASON: Final = "UpdateSucceeded"
FAILED_REASON: Final = "UpdateFailed"
WAITING_REASON: Final = "WaitingForWorkspace"
WORKSPACE_READY_REASON: Final = "Succeeded"
WORKSPACE_READY_MESSAGE: Final = "the spec is valid: its Updates run as Jobs"
# The Job's run trigger: an Update runs once (its name and generation make the Job's name).
UPDATE_TRIGGER: Final = "update"
WORKSPACE_POLL: Final = timedelta(seconds=30)
_COMMIT_SHA: Final = re.compile(r"[0-9a-f]{40}")
# Workspace fields copied into the Stack's workspaceTemplate.spec as they are.
TEMPLATE_FIELDS: Final = (
    "image",
    "imagePullPolicy",
    "serviceAccountName",
    "resources",
    "env",
    "envFrom",
    "podTemplate",
    "pulumiLogLevel",
    "local",
    "securityProfile",
)
# Update fields the runner reads from updateTemplate.spec.
UPDATE_OPTIONS: Final = (
    "parallel",
    "message",
    "expectNoChanges",
    "continueOnError",
    "replace",
    "target",
    "targetDependents",
    "refresh",
    "runProgram",
    "remove",
    "ttlAfterCompleted",
)
# Workspace fields with nothing to apply to (reported in FieldsIgnored).
IGNORED_WORKSPACE_FIELDS: Final = {
    "serviceTemplate": "there is no workspace Service: the controller does not call into a pod",
}
# The Flux kind a Workspace's flux artifact is reported as (the runner only downloads it).
_FLUX_SOURCE_REF: Final = {
    "apiVersion": "source.toolkit.fluxcd.io/v1",
    "kind": "GitRepository",
}


def _secret_ref(selector: Mapping[str, Any]) -> JSON:
    return {
        "type": "Secret",
        "secret": {"name": str(selector.get("name") or ""), "key": str(selector["key"])},
    }


def _git_auth(auth: Mapping[str, Any]) -> JSON:
    """A Workspace's ``git.auth`` (Secret keys) as the Stack's ``gitAuth``."""
    if auth.get("githubApp"):
        app = auth["githubApp"]
        return {
            "githubApp": {
                "appID": _secret_ref(app["appID"]),
                "installationID": _secret_ref(app["installationID"]),
                "privateKey": _secret_ref(app["privateKey"]),
            }
        }
    if auth.get("sshPrivateKey"):
        ssh: JSON = {"sshPrivateKey": _secret_ref(auth["sshPrivateKey"])}
        if auth.get("password"):
            ssh["password"] = _secret_ref(auth["password"])
        return {"sshAuth": ssh}
    if auth.get("token"):
        return {"accessToken": _secret_ref(auth["token"])}
    return {
        "basicAuth": {
            "userName": _secret_ref(auth.get("username") or {"key": ""}),
            "password": _secret_ref(auth.get("password") or {"key": ""}),
        }
    }


def _source(spec: Mapping[str, Any], problems: list[str]) -> JSON:
    """The Stack fields of a Workspace's source (git, flux or local; exactly one)."""
    if spec.get("projectInfo"):
        problems.append(
            "spec.projectInfo is not supported (PKO sets it on the Workspaces it makes to "
            "destroy without a source): remove it and set spec.git, spec.flux or spec.local"
        )
    sources = [name for name in ("git", "flux", "local") if spec.get(name)]
    if len(sources) > 1:
        problems.append(f"spec sets {' and '.join(sources)}: set exactly one source")
        return {}
    if not sources:
        problems.append("spec has no source: set spec.git, spec.flux or spec.local")
        return {}
    fields: JSON = {}
    git = spec.get("git") or {}
    if git:
        if not git.get("url") or not git.get("ref"):
            problems.append("spec.git needs url and ref (a branch, tag or commit SHA)")
            return {}
        ref = str(git["ref"])
        fields["projectRepo"] = git["url"]
        fields["commit" if _COMMIT_SHA.fullmatch(ref) else "branch"] = ref
        for source, target in (("dir", "repoDir"), ("shallow", "shallow")):
            if git.get(source) is not None:
                fields[target] = git[source]
        if git.get("auth"):
            fields["gitAuth"] = _git_auth(git["auth"])
    flux = spec.get("flux") or {}
    if flux:
        if not flux.get("url"):
            problems.append("spec.flux needs url (the artifact to download)")
            return {}
        fields["fluxSource"] = {"sourceRef": {**_FLUX_SOURCE_REF, "name": "workspace"}}
        if flux.get("dir") is not None:
            fields["fluxSource"]["dir"] = flux["dir"]
    return fields


def flux_source(workspace: Mapping[str, Any]) -> JSON | None:
    """A Workspace's ``spec.flux`` as the observed Flux source the snapshot takes its
    artifact from (its digest also serves as revision, which Flux would report)."""
    flux = (workspace.get("spec") or {}).get("flux") or {}
    if not flux.get("url"):
        return None
    digest = str(flux.get("digest") or "")
    return {
        "kind": _FLUX_SOURCE_REF["kind"],
        "metadata": {"name": (workspace.get("metadata") or {}).get("name")},
        "status": {"artifact": {"url": flux["url"], "revision": digest, "digest": digest}},
    }


def _stack_fields(stack: Mapping[str, Any], where: str, problems: list[str]) -> JSON:
    """The Stack fields of one entry of a Workspace's ``spec.stacks``."""
    fields: JSON = {}
    if stack.get("create") is False:
        fields["useLocalStackOnly"] = True
    if stack.get("secretsProvider"):
        fields["secretsProvider"] = stack["secretsProvider"]
    if stack.get("environment"):
        fields["environment"] = list(stack["environment"])
    config: JSON = {}
    secrets: JSON = {}
    for item in stack.get("config") or []:
        key = str(item.get("key"))
        if item.get("valueFrom"):
            problems.append(
                f"{where}.config[{key}].valueFrom is not supported: set the value inline, or "
                "use a Stack with configRef/secretsRef"
            )
        elif item.get("path"):
            problems.append(
                f"{where}.config[{key}].path is not supported: give the whole top-level value "
                "of the key instead (structured values are accepted)"
            )
        elif item.get("secret"):
            if not isinstance(item.get("value"), str):
                problems.append(f"{where}.config[{key}]: a secret value must be a string")
            secrets[key] = item.get("value")
        else:
            config[key] = item.get("value")
    if config:
        fields["config"] = config
    if secrets:
        fields["secrets"] = secrets
    return fields


def stack_spec_manifest(
    workspace_spec: Mapping[str, Any], update_spec: Mapping[str, Any]
) -> tuple[JSON, list[str]]:
    """The Stack spec that runs ``update_spec`` in a Workspace of ``workspace_spec``, and
    what cannot be applied (each problem says what to change; empty: it runs as written)."""
    problems: list[str] = []
    stack_name = str(update_spec.get("stackName") or "")
    manifest: JSON = {"stack": stack_name, **_source(workspace_spec, problems)}
    for index, stack in enumerate(workspace_spec.get("stacks") or []):
        if stack.get("name") == stack_name:
            manifest.update(_stack_fields(stack, f"spec.stacks[{index}]", problems))
    template = {key: workspace_spec[key] for key in TEMPLATE_FIELDS if key in workspace_spec}
    if template:
        manifest["workspaceTemplate"] = {"spec": template}
    options = {key: update_spec[key] for key in UPDATE_OPTIONS if key in update_spec}
    if options:
        manifest["updateTemplate"] = {"spec": options}
    return manifest, problems


def workspace_problems(workspace_spec: Mapping[str, Any]) -> list[str]:
    """Why Updates cannot run against a Workspace (empty: they can), for each of its stacks."""
    names = [str(s.get("name") or "") for s in workspace_spec.get("stacks") or []] or ["dev"]
    problems: list[str] = []
    for name in names:
        manifest, found = stack_spec_manifest(workspace_spec, {"stackName": name})
        problems.extend(p for p in found if p not in problems)
        if not found:
            problems.extend(p for p in _spec_problems(manifest) if p not in problems)
    return problems


def _spec_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Why the run's Stack spec is invalid, each naming its field (in the Stack's terms:
    ``updateTemplate.spec.X`` is the Update's ``spec.X``, ``workspaceTemplate.spec.X`` the
    Workspace's)."""
    try:
        spec = StackSpec.model_validate(manifest)
    except ValidationError as error:
        return [
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}"
            for e in error.errors(include_url=False)
        ]
    return validate_stack_spec(spec)


def _conditions(status: Mapping[str, Any]) -> list[Condition]:
    return [Condition.model_validate(c) for c in status.get("conditions") or []]


def _dump(conditions: Sequence[Condition]) -> list[JSON]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def _timeless(conditions: Any) -> list[Any]:
    return [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in conditions or []
        if isinstance(c, Mapping)
    ]


def workspace_status(workspace: Mapping[str, Any], now: datetime) -> JSON | None:
    """The status to write on ``workspace``; None when its status is current."""
    spec = workspace.get("spec") or {}
    status = workspace.get("status") or {}
    generation = (workspace.get("metadata") or {}).get("generation")
    conditions = _conditions(status)
    problems = workspace_problems(spec)
    if problems:
        message = "; ".join(problems)
        conditions = set_condition(
            conditions, CONDITION_READY, "False", STALLED_SPEC_INVALID_REASON, message, now=now
        )
        conditions = set_condition(
            conditions, CONDITION_STALLED, "True", STALLED_SPEC_INVALID_REASON, message, now=now
        )
    else:
        conditions = set_condition(
            conditions,
            CONDITION_READY,
            "True",
            WORKSPACE_READY_REASON,
            WORKSPACE_READY_MESSAGE,
            now=now,
        )
        conditions = [c for c in conditions if c.type != CONDITION_STALLED]
    ignored = [
        f"spec.{name}: {why}" for name, why in IGNORED_WORKSPACE_FIELDS.items() if spec.get(name)
    ]
    if ignored:
        conditions = set_condition(
            conditions,
            CONDITION_FIELDS_IGNORED,
            "True",
            FIELDS_IGNORED_REASON,
            "; ".join(ignored),
            now=now,
        )
    else:
        conditions = [c for c in conditions if c.type != CONDITION_FIELDS_IGNORED]
    written = _dump(conditions)
    if status.get("observedGeneration") == generation and _timeless(
        status.get("conditions")
    ) == _timeless(written):
        return None
    return {"observedGeneration": generation, "conditions": written}


def workspace_ready(workspace: Mapping[str, Any]) -> bool:
    """Whether ``workspace``'s status, for its current generation, says it is Ready."""
    status = workspace.get("status") or {}
    if status.get("observedGeneration") != (workspace.get("metadata") or {}).get("generation"):
        return False
    ready = find_condition(_conditions(status), CONDITION_READY)
    return ready is not None and ready.status == "True"


@dataclass
class UpdateObserved:
    """What one Update's decision reads: the Update, its Workspace, its Job (by the name
    ``update_run`` gives it), that Job's result ConfigMap and pods."""

    update: Mapping[str, Any]
    workspace: Mapping[str, Any] | None
    job: Mapping[str, Any] | None
    result: Mapping[str, Any] | None
    pods: Sequence[Mapping[str, Any]]
    now: datetime


@dataclass
class UpdateDecision:
    status: JSON | None = None
    create: RunObjects | None = None
    outputs_secret: JSON | None = None
    delete_update: bool = False
    requeue_after: timedelta | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)


def update_run(update: Mapping[str, Any]) -> Run | None:
    """The run of an Update (None when its ``spec.type`` is no operation)."""
    operation = (update.get("spec") or {}).get("type")
    if operation not in OPERATIONS:
        return None
    generation = int((update.get("metadata") or {}).get("generation") or 0)
    checked: Operation = operation
    return Run(checked, "sync", generation, "", "", UPDATE_TRIGGER)


def update_owner(update: Mapping[str, Any]) -> JSON:
    """The Update as ``build_run`` takes its owner: the Job is controlled by the Update."""
    meta = update.get("metadata") or {}
    return {
        "apiVersion": AUTO_API_VERSION,
        "kind": UPDATE_KIND,
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid", ""),
            "labels": meta.get("labels") or {},
        },
    }


def outputs_secret_name(update_name: str) -> str:
    return f"{update_name}{OUTPUTS_SECRET_SUFFIX}"


def _set(
    conditions: list[Condition],
    kind: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    return set_condition(conditions, kind, status, reason, message, now=now)


def _completed(obs: UpdateObserved, failed: bool, reason: str, message: str, extra: JSON) -> JSON:
    """The status of an Update that has ended."""
    now = obs.now
    conditions = _conditions(obs.update.get("status") or {})
    conditions = _set(conditions, CONDITION_PROGRESSING, "False", COMPLETE_REASON, "", now)
    conditions = _set(conditions, CONDITION_COMPLETE, "True", UPDATED_REASON, "", now)
    conditions = _set(
        conditions,
        CONDITION_FAILED,
        "True" if failed else "False",
        reason if failed else SUCCEEDED_REASON,
        message,
        now,
    )
    status = dict(obs.update.get("status") or {})
    status.update(extra)
    status.update(
        {
            "observedGeneration": (obs.update.get("metadata") or {}).get("generation"),
            "endTime": status.get("endTime") or format_time(now),
            "message": bound_message(message),
            "conditions": _dump(conditions),
        }
    )
    status.setdefault("startTime", format_time(now))
    return status


def _refused(obs: UpdateObserved, message: str) -> UpdateDecision:
    return UpdateDecision(
        status=_completed(obs, True, STALLED_SPEC_INVALID_REASON, message, {}),
        events=[("Warning", FAILED_REASON, message)],
    )


def _expiry(update: Mapping[str, Any], now: datetime) -> UpdateDecision:
    """A completed Update: deleted once ``spec.ttlAfterCompleted`` has passed."""
    ttl = (update.get("spec") or {}).get("ttlAfterCompleted")
    ended = parse_time((update.get("status") or {}).get("endTime"))
    if not ttl or ended is None:
        return UpdateDecision()
    try:
        expires = ended + parse_duration(str(ttl))
    except ValueError:
        return UpdateDecision()
    if now >= expires:
        return UpdateDecision(
            delete_update=True,
            events=[("Normal", "UpdateExpired", f"deleted {ttl} after it completed")],
        )
    return UpdateDecision(requeue_after=expires - now)


def _outputs_secret(update: Mapping[str, Any], outcome: Outcome) -> JSON | None:
    """PKO's outputs Secret of a successful run (secret outputs as ``[secret]``)."""
    result = outcome.result
    if result is None or outcome.state != "succeeded":
        return None
    if not result.outputs and result.operation != "up":
        return None
    meta = update.get("metadata") or {}
    name = str(meta.get("name"))
    secret_keys = sorted(sanitize_output_key(k) for k in result.secret_outputs)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": outputs_secret_name(name),
            "namespace": meta.get("namespace"),
            "labels": {COMPONENT_LABEL: "update", UPDATE_NAME_LABEL: name},
            "annotations": {SECRETS_ANNOTATION: json.dumps(secret_keys)},
            "ownerReferences": [
                {
                    "apiVersion": AUTO_API_VERSION,
                    "kind": UPDATE_KIND,
                    "name": name,
                    "uid": meta.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "type": "Opaque",
        "immutable": True,
        "stringData": {
            sanitize_output_key(key): json.dumps(value, separators=(",", ":"))
            for key, value in result.outputs.items()
        },
    }


def decide_update(
    obs: UpdateObserved,
    settings: JobSettings,
    template: Mapping[str, Any],
    insecure_http_git_hosts: Sequence[str] = (),
) -> UpdateDecision:
    """What to do for one Update: expire it, start its Job, wait, or fold its Job."""
    update = obs.update
    complete = find_condition(_conditions(update.get("status") or {}), CONDITION_COMPLETE)
    if complete is not None and complete.status == "True":
        return _expiry(update, obs.now)
    spec = update.get("spec") or {}
    run = update_run(update)
    if run is None:
        return _refused(
            obs, f"spec.type is {spec.get('type')!r}: use one of {', '.join(OPERATIONS)}"
        )
    if not spec.get("workspaceName") or not spec.get("stackName"):
        return _refused(obs, "spec.workspaceName and spec.stackName are required")
    uid = str((update.get("metadata") or {}).get("uid", ""))
    if obs.job is None:
        progressing = find_condition(_conditions(update.get("status") or {}), CONDITION_PROGRESSING)
        if progressing is None or progressing.status != "True":
            return _start(obs, run, settings, template, insecure_http_git_hosts)
        # Its Job was created and is gone (the shell looked it up live): one Update is one
        # run, never a second one.
        name = job_name(str(update["metadata"]["name"]), uid, run)
        outcome: Outcome | None = Outcome(
            "failed",
            "Interrupted",
            f"run {name} disappeared before reporting a result (its Job was deleted); create "
            "a new Update to run the operation again",
            obs.now,
        )
    else:
        outcome = job_outcome(obs.job, obs.result, uid, obs.now, obs.pods)
    if outcome is None:
        return UpdateDecision(status=_progressing(obs))
    extra: JSON = {}
    result = outcome.result
    if result is not None:
        if result.permalink:
            extra["permalink"] = result.permalink
        if result.project_info is not None:
            extra["projectInfo"] = result.project_info.model_dump(by_alias=True)
        if result.start_time is not None:
            extra["startTime"] = format_time(result.start_time)
        if result.end_time is not None:
            extra["endTime"] = format_time(result.end_time)
    secret = _outputs_secret(update, outcome)
    if secret is not None:
        extra["outputs"] = secret["metadata"]["name"]
    failed = outcome.state == "failed"
    reason = outcome.reason if outcome.reason in _AGENT_REASONS else FAILED_REASON
    message = outcome.message or ("" if failed else "the update succeeded")
    return UpdateDecision(
        status=_completed(obs, failed, reason, message, extra),
        outputs_secret=secret,
        events=[
            ("Warning", FAILED_REASON, message) if failed else ("Normal", SUCCEEDED_REASON, message)
        ],
    )


# The failure reasons PKO's agent reports as they are (others are UpdateFailed).
_AGENT_REASONS: Final = frozenset({"UpdateConflict", "InvalidAccessToken"})


def _progressing(obs: UpdateObserved) -> JSON | None:
    """The status of an Update whose Job runs; None when it says so already."""
    status = dict(obs.update.get("status") or {})
    conditions = _conditions(status)
    progressing = find_condition(conditions, CONDITION_PROGRESSING)
    if progressing is not None and progressing.status == "True" and status.get("startTime"):
        return None
    now = obs.now
    conditions = _set(conditions, CONDITION_PROGRESSING, "True", PROGRESSING_REASON, "", now)
    conditions = _set(conditions, CONDITION_COMPLETE, "False", PROGRESSING_REASON, "", now)
    conditions = _set(conditions, CONDITION_FAILED, "False", PROGRESSING_REASON, "", now)
    job_meta = (obs.job or {}).get("metadata") or {}
    status.update(
        {
            "observedGeneration": (obs.update.get("metadata") or {}).get("generation"),
            "startTime": status.get("startTime")
            or str(job_meta.get("creationTimestamp") or format_time(now)),
            "message": f"running as Job {job_meta.get('name')}",
            "conditions": _dump(conditions),
        }
    )
    return status


def _start(
    obs: UpdateObserved,
    run: Run,
    settings: JobSettings,
    template: Mapping[str, Any],
    insecure_http_git_hosts: Sequence[str],
) -> UpdateDecision:
    spec = obs.update.get("spec") or {}
    workspace = obs.workspace
    if workspace is None or not workspace_ready(workspace):
        message = (
            f"waiting for Workspace {spec.get('workspaceName')} to be Ready"
            if workspace is not None
            else f"Workspace {spec.get('workspaceName')} does not exist"
        )
        conditions = _conditions(obs.update.get("status") or {})
        conditions = _set(
            conditions, CONDITION_PROGRESSING, "False", WAITING_REASON, message, obs.now
        )
        status = {
            **(obs.update.get("status") or {}),
            "observedGeneration": (obs.update.get("metadata") or {}).get("generation"),
            "conditions": _dump(conditions),
        }
        if {**status, "conditions": _timeless(status["conditions"])} == {
            **(obs.update.get("status") or {}),
            "conditions": _timeless((obs.update.get("status") or {}).get("conditions")),
        }:
            return UpdateDecision(requeue_after=WORKSPACE_POLL)
        return UpdateDecision(status=status, requeue_after=WORKSPACE_POLL)
    manifest, problems = stack_spec_manifest(workspace.get("spec") or {}, spec)
    problems = problems or _spec_problems(manifest)
    if problems:
        return _refused(obs, "the Update cannot run: " + "; ".join(problems))
    stack_spec = StackSpec.model_validate(manifest)
    try:
        objects = build_run(
            update_owner(obs.update),
            stack_spec,
            run,
            settings,
            template,
            insecure_http_git_hosts=insecure_http_git_hosts,
            source=flux_source(workspace),
        )
    except JobBuildError as error:
        return _refused(obs, str(error))
    job = objects.job
    decision = UpdateDecision(create=objects)
    decision.status = _progressing(UpdateObserved(obs.update, workspace, job, None, (), obs.now))
    return decision
