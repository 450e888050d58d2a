"""The ``RunSnapshot`` of one run, and how it reaches the runner.

The snapshot is everything the run needs, frozen when its Job is built: the Stack's spec with
every inline secret value blanked (``without_inline_secrets``), the observed Program or Flux
artifact, and the variables that hold credentials. One that does not fit into an argument
travels in ConfigMaps (``snapshot_transport``), named with its SHA-256 in the Job's arguments.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pkobatch.api.objects import JSON
from pkobatch.api.program import program_revision, render_project
from pkobatch.api.run import (
    MAX_INLINE_SNAPSHOT_BYTES,
    REMEDIATE_TRIGGER_PREFIX,
    SECRET_PLACEHOLDER,
    SNAPSHOT_CONFIGMAP_FLAG,
    SNAPSHOT_FLAG,
    SNAPSHOT_KEY,
    SNAPSHOT_SHA256_FLAG,
    FluxArtifact,
    GitAuthEnv,
    PlanRef,
    ProgramSnapshot,
    ProjectInfo,
    Run,
    RunSnapshot,
    StackRef,
    ValueFromEnv,
    snapshot_configmap_name,
    snapshot_sha256,
    split_snapshot,
)
from pkobatch.api.stack.spec import StackSpec
from pkobatch.controller.run_pod import JobBuildError


def plan_secret_name(job: str) -> str:
    """The Secret a preview of kind "approval" saves its plan in (owned by that Job)."""
    return f"{job}-plan"


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
    insecure_http_git_hosts: Sequence[str] = (),
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
        insecure_http_git_hosts=list(insecure_http_git_hosts),
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
        checksum=str(artifact.get("checksum") or ""),
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
        name = snapshot_configmap_name(job, index)
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
