"""The ``pulumi.com/v1`` Program API (PKO v2.9's schema) and how a Program becomes a project.

A Program is an inline Pulumi YAML program that a Stack names in ``spec.programRef``. Its
body sits at the top level under ``program`` (not under ``spec``), as in PKO.

How a Program reaches a run, and why:

- The **revision** of a Program is its ``metadata.generation`` (as PKO records it in
  ``lastAttemptedCommit``). A Stack's run for revision N carries that revision as its
  commit, so a Program edit (new generation) is a new revision and re-runs each Stack using
  it once — the same rule as a new git commit.
- The controller renders the Program it observed into ``Pulumi.yaml`` (``render_project``)
  and puts it into the run's snapshot. The Job is self-contained: the runner never reads
  the Program, so an edit during a run cannot change that run, and a Stack never runs a
  half-applied version (a Program is one API object, read at one generation). A large
  program rides along with the snapshot wherever the snapshot goes.
- For tools outside pkobatch (Flux-aware tools, PKO-style consumers) the controller keeps
  every Program's ``status.artifact`` as PKO's program-controller does, and serves the
  artifact over HTTP (``pkobatch.controller.program_artifacts``): a ``.tar.gz`` holding
  only ``Pulumi.yaml`` (``program_tarball``), at
  ``<base url>/programs/<namespace>/<name>/<generation>``. ``revision`` is the generation,
  ``digest``/``size`` those of the tarball, ``path`` is
  ``programs/<namespace>/<name>/<generation>.tar.gz`` (PKO's forms). The tarball is
  deterministic — fixed mtime, owner and mode, no gzip timestamp or file name — so the
  digest in the status is the sha256 of every download of that generation, and nothing is
  stored: it is rebuilt from the cached Program on each request.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal

import yaml
from pydantic import Field

from pkobatch.api.stack.base import ApiModel, Int64
from pkobatch.api.timestamps import format_time

PROGRAM_KIND: Final = "Program"
PROGRAM_LIST_KIND: Final = "ProgramList"
PROGRAM_PLURAL: Final = "programs"
PROGRAM_SINGULAR: Final = "program"
# The runtime of every Program (a Pulumi YAML project).
PROGRAM_RUNTIME: Final = "yaml"
# The one file of a Program's artifact.
PROJECT_FILE: Final = "Pulumi.yaml"
# Where a Program's artifact is served, under the server's base URL (PKO's layout).
PROGRAMS_PATH: Final = "programs"

ConfigurationType = Literal["String", "Number", "List<Number>", "List<String>"]


class Configuration(ApiModel):
    type: ConfigurationType | None = Field(
        default=None, description="Type of the config value (String, Number, List<...>)."
    )
    default: Any = Field(default=None, description="Default value of the config key.")


class CustomTimeouts(ApiModel):
    create: str | None = Field(default=None, description="Create timeout (e.g. 5m).")
    delete: str | None = Field(default=None, description="Delete timeout.")
    update: str | None = Field(default=None, description="Update timeout.")


class ResourceOptions(ApiModel):
    additional_secret_outputs: list[str] | None = Field(
        default=None, description="Outputs to mark secret."
    )
    aliases: list[str] | None = Field(default=None, description="Former names of the resource.")
    custom_timeouts: CustomTimeouts | None = Field(default=None, description="Timeouts.")
    delete_before_replace: bool | None = Field(
        default=None, description="Delete before creating the replacement."
    )
    depends_on: list[Any] | None = Field(default=None, description="Explicit dependencies.")
    ignore_changes: list[str] | None = Field(default=None, description="Properties to ignore.")
    import_: str | None = Field(default=None, alias="import", description="ID to import.")
    parent: Any = Field(default=None, description="Parent resource.")
    protect: bool | None = Field(default=None, description="Refuse to delete the resource.")
    provider: Any = Field(default=None, description="Explicit provider.")
    providers: dict[str, Any] | None = Field(default=None, description="Providers by package.")
    version: str | None = Field(default=None, description="Provider plugin version.")


class Getter(ApiModel):
    id: str = Field(description="ID of the existing resource to read.")
    state: dict[str, Any] | None = Field(default=None, description="State to look it up by.")


class ProgramResource(ApiModel):
    type: str = Field(description="Resource type token, e.g. kubernetes:core/v1:ConfigMap.")
    properties: dict[str, Any] | None = Field(default=None, description="Inputs.")
    options: ResourceOptions | None = Field(default=None, description="Resource options.")
    get: Getter | None = Field(default=None, description="Read an existing resource.")


class ProgramBody(ApiModel):
    configuration: dict[str, Configuration] | None = Field(
        default=None, description="Typed config keys with defaults."
    )
    resources: dict[str, ProgramResource] | None = Field(
        default=None, description="Resources by logical name."
    )
    variables: dict[str, Any] | None = Field(default=None, description="Named expressions.")
    outputs: dict[str, Any] | None = Field(default=None, description="Stack outputs.")
    packages: dict[str, str] | None = Field(
        default=None, description="Package name -> version or source (parameterized providers)."
    )


class Artifact(ApiModel):
    digest: str | None = Field(default=None, description="sha256:<hex> of the artifact.")
    last_update_time: str = Field(description="When the artifact was last updated.")
    metadata: dict[str, str] | None = Field(default=None, description="Artifact metadata.")
    path: str = Field(description="Relative path of the artifact.")
    revision: str = Field(description="Revision of the artifact (the Program's generation).")
    size: Int64 | None = Field(default=None, description="Size of the artifact in bytes.")
    url: str = Field(description="Where the artifact is.")


class ProgramStatus(ApiModel):
    artifact: Artifact | None = Field(default=None, description="The program's artifact.")
    observed_generation: Int64 | None = Field(
        default=None, description="Last generation the controller rendered."
    )


def program_revision(program: Mapping[str, Any]) -> str:
    """The revision a run of a Stack using this Program deploys: its generation."""
    return str((program.get("metadata") or {}).get("generation") or 0)


def render_project(name: str, body: Mapping[str, Any]) -> str:
    """``Pulumi.yaml`` of a Program: its body as a Pulumi YAML project named ``name``.

    ``body`` is validated first, so a Program stored before the CRD existed cannot smuggle
    project keys (``runtime``, ``main``) into the project.
    """
    checked = ProgramBody.model_validate(body).model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    project = {"name": name, "runtime": PROGRAM_RUNTIME, **checked}
    return yaml.safe_dump(project, sort_keys=False)


def program_tarball(program: Mapping[str, Any]) -> bytes:
    """A Program's artifact: ``Pulumi.yaml`` in a gzipped tar, the same bytes every time
    for the same name and body (see the module docstring).

    Raises ``ValueError`` for a body outside PKO's schema (``render_project``)."""
    name = str((program.get("metadata") or {}).get("name") or "")
    project = render_project(name, program.get("program") or {}).encode()
    entry = tarfile.TarInfo(PROJECT_FILE)
    entry.size, entry.mode, entry.mtime = len(project), 0o644, 0
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = ""
    packed = io.BytesIO()
    with (
        gzip.GzipFile(filename="", fileobj=packed, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        tar.addfile(entry, io.BytesIO(project))
    return packed.getvalue()


def program_artifact_path(namespace: str, name: str, generation: str) -> str:
    """The URL path, below the server's base URL, of a Program generation's artifact."""
    return f"{PROGRAMS_PATH}/{namespace}/{name}/{generation}"


def program_artifact(program: Mapping[str, Any], base_url: str, now: datetime) -> Artifact:
    """The ``status.artifact`` of a Program served under ``base_url`` (see the module
    docstring). Raises ``ValueError`` for a body outside PKO's schema."""
    meta = program.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    tarball = program_tarball(program)
    revision = program_revision(program)
    path = program_artifact_path(namespace, name, revision)
    return Artifact(
        digest="sha256:" + hashlib.sha256(tarball).hexdigest(),
        last_update_time=format_time(now),
        path=f"{path}.tar.gz",
        revision=revision,
        size=len(tarball),
        url=f"{base_url.rstrip('/')}/{path}",
    )
