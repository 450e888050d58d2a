"""PKO v2.9's ``auto.pulumi.com/v1alpha1`` Workspace: its schema, for the CRD.

In PKO a Workspace is a long-lived pod (a StatefulSet behind a Service) that runs Pulumi
operations for Update objects. The models here describe exactly PKO's property paths, with
one deliberate difference: ``spec.podTemplate.spec`` (a core/v1 PodSpec, some 1,250 property
paths) is a free-form object that declares only the identity fields, as in the Stack's
templates (``pkobatch.api.crd_hints.POD_TEMPLATE_SPEC``); the API server validates the pod
when a Job is created from it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import Field

from pkobatch.api.crd_hints import (
    ATOMIC_LIST,
    INT32,
    INT_OR_STRING,
    POD_SPEC_IDENTITY,
    PRESERVE_UNKNOWN,
    CrdHint,
    default,
    map_list,
)
from pkobatch.api.stack.base import ApiModel, Int64
from pkobatch.api.stack.status import Condition

WORKSPACE_KIND: Final = "Workspace"
WORKSPACE_LIST_KIND: Final = "WorkspaceList"
WORKSPACE_PLURAL: Final = "workspaces"
WORKSPACE_SINGULAR: Final = "workspace"

# core/v1 LocalObjectReference.name, which Kubernetes' generated CRDs default to "".
ReferenceName = Annotated[str, default("")]


class KeySelector(ApiModel):
    """core/v1 SecretKeySelector or ConfigMapKeySelector."""

    key: str = Field(description="The key to select.")
    name: ReferenceName | None = Field(default=None, description="Name of the object.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class ObjectFieldSelector(ApiModel):
    api_version: str | None = Field(default=None, description="Schema version of fieldPath.")
    field_path: str = Field(description="Path of the field to select.")


class ResourceFieldSelector(ApiModel):
    container_name: str | None = Field(default=None, description="Container name.")
    divisor: Annotated[str, INT_OR_STRING] | None = Field(
        default=None, description="Output format of the exposed resources."
    )
    resource: str = Field(description="Resource to select.")


class FileKeySelector(ApiModel):
    key: str = Field(description="The key within the env file.")
    optional: Annotated[bool, default(False)] | None = Field(
        default=None, description="Whether the file or key may be missing."
    )
    path: str = Field(description="Path of the env file within the volume.")
    volume_name: str = Field(description="Name of the volume mount holding the env file.")


class EnvVarSource(ApiModel):
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap key.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")
    file_key_ref: FileKeySelector | None = Field(default=None, description="A key of an env file.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A container resource."
    )
    secret_key_ref: KeySelector | None = Field(default=None, description="A Secret key.")


class EnvVar(ApiModel):
    """core/v1 EnvVar."""

    name: str = Field(description="Name of the environment variable.")
    value: str | None = Field(default=None, description="Its value.")
    value_from: EnvVarSource | None = Field(default=None, description="Where its value comes from.")


class ObjectReference(ApiModel):
    name: ReferenceName | None = Field(default=None, description="Name of the object.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class EnvFromSource(ApiModel):
    """core/v1 EnvFromSource."""

    config_map_ref: ObjectReference | None = Field(default=None, description="A ConfigMap.")
    prefix: str | None = Field(default=None, description="Prefix of every variable name.")
    secret_ref: ObjectReference | None = Field(default=None, description="A Secret.")


class ResourceClaim(ApiModel):
    name: str = Field(description="Name of a resource claim of the pod.")
    request: str | None = Field(default=None, description="Request of that claim.")


Quantity = Annotated[str, INT_OR_STRING]


class ResourceRequirements(ApiModel):
    """core/v1 ResourceRequirements."""

    claims: Annotated[list[ResourceClaim], map_list("name")] | None = Field(
        default=None, description="Dynamic resource claims used by the container."
    )
    limits: dict[str, Quantity] | None = Field(default=None, description="Resource limits.")
    requests: dict[str, Quantity] | None = Field(default=None, description="Resource requests.")


class GitHubAppAuth(ApiModel):
    app_id: KeySelector = Field(alias="appID", description="Secret key holding the App ID.")
    installation_id: KeySelector = Field(
        alias="installationID", description="Secret key holding the installation ID."
    )
    private_key: KeySelector = Field(description="Secret key holding the App's private key.")


class GitAuth(ApiModel):
    github_app: GitHubAppAuth | None = Field(default=None, description="GitHub App credentials.")
    password: KeySelector | None = Field(
        default=None, description="Password (with username) or SSH key passphrase."
    )
    ssh_private_key: KeySelector | None = Field(default=None, description="SSH private key.")
    token: KeySelector | None = Field(default=None, description="Personal access token.")
    username: KeySelector | None = Field(default=None, description="Username.")


class GitSource(ApiModel):
    auth: GitAuth | None = Field(default=None, description="Credentials of the clone.")
    dir: str | None = Field(default=None, description="Directory of Pulumi.yaml in the repository.")
    ref: str | None = Field(default=None, description="Tag, branch or commit SHA.")
    shallow: bool | None = Field(default=None, description="Clone without history.")
    url: str | None = Field(default=None, description="Repository URL.")


class FluxSource(ApiModel):
    digest: str | None = Field(default=None, description="Digest of the artifact.")
    dir: str | None = Field(default=None, description="Directory of Pulumi.yaml in the artifact.")
    url: str | None = Field(default=None, description="URL of the artifact.")


class LocalSource(ApiModel):
    dir: str | None = Field(default=None, description="Directory of Pulumi.yaml in the image.")


class ProjectInfoSource(ApiModel):
    name: str = Field(description="Project name of a minimal Pulumi.yaml.")
    runtime: str = Field(description="Runtime of that Pulumi.yaml.")


class EmbeddedObjectMeta(ApiModel):
    annotations: dict[str, str] | None = Field(default=None, description="Annotations.")
    labels: dict[str, str] | None = Field(default=None, description="Labels.")


POD_SPEC = CrdHint(
    schema={"type": "object", **PRESERVE_UNKNOWN, "properties": dict(POD_SPEC_IDENTITY)},
    extra={"required": ["containers"]},
)


class EmbeddedPodTemplateSpec(ApiModel):
    metadata: EmbeddedObjectMeta | None = Field(
        default=None, description="Labels and annotations of the pod."
    )
    spec: Annotated[dict[str, Any], POD_SPEC] | None = Field(
        default=None,
        description="core/v1 PodSpec merged into the run's pod (container 'pulumi' is the "
        "run's container).",
    )


class EmbeddedServiceTemplateSpec(ApiModel):
    metadata: EmbeddedObjectMeta | None = Field(
        default=None, description="Labels and annotations of the workspace's Service."
    )


class ConfigValueFrom(ApiModel):
    env: str | None = Field(default=None, description="Environment variable holding the value.")
    json_: bool | None = Field(default=None, alias="json", description="Parse the value as JSON.")
    path: str | None = Field(default=None, description="File holding the value.")


class ConfigItem(ApiModel):
    key: str = Field(description="Configuration key or path.")
    path: bool | None = Field(default=None, description="The key is a property path.")
    secret: bool | None = Field(default=None, description="The value is a secret.")
    value: Annotated[Any, CrdHint(schema=PRESERVE_UNKNOWN)] = Field(
        default=None, description="The value (any JSON)."
    )
    value_from: ConfigValueFrom | None = Field(
        default=None, description="Where the value comes from."
    )


class WorkspaceStack(ApiModel):
    config: Annotated[list[ConfigItem], map_list("key")] | None = Field(
        default=None, description="Configuration values of the stack."
    )
    create: bool | None = Field(default=None, description="Create the stack if it is missing.")
    environment: Annotated[list[str], ATOMIC_LIST] | None = Field(
        default=None, description="Pulumi ESC environments imported into the stack."
    )
    name: str = Field(description="Stack name.")
    secrets_provider: str | None = Field(default=None, description="Secrets provider.")


class WorkspaceSpec(ApiModel):
    env: Annotated[list[EnvVar], map_list("name")] | None = Field(
        default=None, description="Environment variables of the Pulumi container."
    )
    env_from: Annotated[list[EnvFromSource], ATOMIC_LIST] | None = Field(
        default=None, description="Environment sources of the Pulumi container."
    )
    flux: FluxSource | None = Field(default=None, description="A Flux source artifact.")
    git: GitSource | None = Field(default=None, description="A git repository.")
    image: str | None = Field(default=None, description="Image with the pulumi executable.")
    image_pull_policy: str | None = Field(default=None, description="Always, Never, IfNotPresent.")
    local: LocalSource | None = Field(default=None, description="A program inside the image.")
    pod_template: EmbeddedPodTemplateSpec | None = Field(
        default=None, description="Template of the workspace's pod."
    )
    project_info: ProjectInfoSource | None = Field(
        default=None, description="No source: a minimal Pulumi.yaml from name and runtime."
    )
    pulumi_log_level: Annotated[int, INT32] | None = Field(
        default=None, description="Verbosity of the Pulumi CLI."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Compute resources of the Pulumi container."
    )
    security_profile: Annotated[str, default("restricted")] | None = Field(
        default=None, description="baseline or restricted (Pod Security Standards)."
    )
    service_account_name: Annotated[str, default("default")] | None = Field(
        default=None, description="ServiceAccount of the workspace's pod."
    )
    service_template: EmbeddedServiceTemplateSpec | None = Field(
        default=None, description="Metadata of the workspace's Service."
    )
    stacks: Annotated[list[WorkspaceStack], map_list("name")] | None = Field(
        default=None, description="The stacks of the workspace."
    )


class WorkspaceStatus(ApiModel):
    address: str | None = Field(default=None, description="Address of the workspace's Service.")
    conditions: Annotated[list[Condition], map_list("type")] | None = Field(
        default=None, description="Ready and Stalled."
    )
    observed_generation: Annotated[Int64, CrdHint(extra={"minimum": 0})] | None = Field(
        default=None, description="Generation the status was set for."
    )
    pulumi_version: str | None = Field(default=None, description="Version of the Pulumi CLI.")
