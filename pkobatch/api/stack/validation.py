"""Semantic checks of a Stack spec (layer 3 of ``pkobatch.api.stack``), and ``load_stack_spec``.

``validate_stack_spec`` returns the problems PKO reports as ``Stalled/SpecInvalid`` rather than
rejecting at admission; ``load_stack_spec`` runs model validation and these checks and returns
everything the controller needs to set ``Stalled/SpecInvalid`` or emit an alias Event.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pkobatch.api.constants import FLUX_SOURCE_GROUP
from pkobatch.api.stack.base import to_snake
from pkobatch.api.stack.normalize import SpecAliasError, normalize_spec
from pkobatch.api.stack.spec import (
    DEPRECATED_REF_TYPES,
    GIT_AUTH_METHODS,
    GIT_SOURCE_FIELDS,
    REF_TYPE_FIELDS,
    ResourceRef,
    StackSpec,
)


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
