"""Controller settings, from the environment (``PKOBATCH_`` prefix) and command-line flags.

Nested groups use ``__``: ``PKOBATCH_JOB__IMAGE``, ``PKOBATCH_LEADER_ELECTION__LEASE_DURATION``.
Durations are Go-style strings ("30s", "5m", "1h30m"), the same syntax as in Stack specs.
Priority is flags > environment > defaults: the click layer passes only the flags the user
actually gave as keyword arguments to ``load_settings``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from pkobatch import __version__
from pkobatch.api.constants import FLUX_SOURCE_GROUP, FLUX_SOURCE_KINDS, SHARD_LABEL
from pkobatch.api.durations import parse_duration
from pkobatch.api.label_selector import InvalidSelector, LabelSelector, parse_selector
from pkobatch.api.quantity import parse_quantity

# A shard name is part of its Lease name and of its Deployment name in deploy/
# (pkobatch-controller-<shard>, which must stay a DNS label: at most 63 characters).
SHARD_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
# RFC 1918, shared address space (RFC 6598) and IPv6 unique local addresses: where a
# cluster's services, pods and nodes usually are (PKOBATCH_NOTIFICATIONS__DENIED_CIDRS).
PRIVATE_NETWORKS: Final = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
)
# A receiver's name is part of its URL and the key of its secret in a Secret.
RECEIVER_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
RECEIVER_KINDS: Final = ("github", "gitlab", "generic")
# A Kubernetes kind: the CRD's rule on spec.fluxSource.sourceRef.kind is the same.
KIND_NAME: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")


def _duration(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def _host_port(value: str) -> str:
    if value in ("", "0"):
        return value
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{value!r} is not HOST:PORT or :PORT (use '0' to disable)")
    return value


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    return value


Duration = Annotated[timedelta, BeforeValidator(_duration)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_list)]


class JobSettings(BaseModel):
    """How the controller builds each run's Job."""

    image: str = Field(default=f"pkobatch/runner:{__version__}", description="default runner image")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str = Field(
        default="pkobatch-runner",
        description="ServiceAccount of runs whose Stack names none (must be bound to the "
        "pkobatch-runner ClusterRole in the Stack's namespace)",
    )
    ttl_after_finished: Duration = Field(default=timedelta(hours=24))
    active_deadline: Duration = Field(
        default=timedelta(hours=1), description="per-run deadline unless spec.timeoutSeconds"
    )
    termination_grace_period: Duration = Field(default=timedelta(minutes=2))
    history_limit: int = Field(default=5, ge=1, description="Jobs and results kept per Stack")
    template_file: str = Field(
        default="", description="Job template YAML replacing the built-in jobs/job-template.yaml"
    )
    pod_security_level: Literal["baseline", "restricted", "privileged"] = Field(
        default="baseline",
        description="Pod Security Standard every run's pod must meet, after the Stack's "
        "spec.jobTemplate and spec.workspaceTemplate.spec.podTemplate are merged in "
        "(docs/security.md); 'privileged' turns the check off",
    )
    flux_max_untar_size_bytes: int | None = Field(
        default=None,
        ge=-1,
        description="largest unpacked size of a Flux artifact, given to the runs of Stacks with "
        "spec.fluxSource as FLUX_MAX_UNTAR_SIZE_BYTES (PKO's setting; -1: no bound; a Stack's "
        "own spec.workspaceTemplate.spec.env entry wins); unset: PKOBATCH_MAX_ARTIFACT_BYTES "
        "of the run, 512 MiB by default",
    )
    # Runner command: overridden in development to run the local interpreter.
    command: CommaList = Field(default_factory=lambda: ["pkobatch", "job", "run"])
    runner_bundle: AbsolutePath = Field(
        default="/opt/pkobatch/runner",
        description="absolute path of the runner bundle directory (jobs/build-runner-bundle.sh) "
        "in the image it is copied from: a run whose image is not `image` executes a copy of "
        "its launcher, pkobatch-runner",
    )
    bundle_image: str = Field(
        default="",
        description="image an init container copies the runner bundle from (empty: `image`; "
        "target runner-bundle of jobs/Dockerfile is a small one)",
    )


class RunCacheSettings(BaseModel):
    """The run cache: one PersistentVolumeClaim per namespace, created by the controller and
    mounted into every run Job of that namespace at ``path`` (``PKOBATCH_CACHE_DIR``), so
    plugins, package caches and virtualenvs survive between runs (docs/operations.md#run-cache)."""

    enabled: bool = Field(
        default=False,
        description="create a cache PVC per namespace and mount it into every run of it",
    )
    claim_name: str = Field(
        default="pkobatch-run-cache",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="name of the PersistentVolumeClaim in each namespace",
    )
    storage_class: str | None = Field(
        default=None,
        description="storageClassName of the PVC (unset: the cluster's default class; an "
        "empty string: no class, for statically provisioned volumes); the class must bind "
        "Immediately, as the controller mounts only a Bound PVC",
    )
    size: str = Field(default="10Gi", description="requested storage of the PVC")
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany",
        description="ReadWriteMany: every run of the namespace mounts the cache; "
        "ReadWriteOnce: one run of a namespace at a time does, the others use an emptyDir",
    )
    path: AbsolutePath = Field(
        default="/var/cache/pkobatch", description="mount path in the run pod"
    )

    @field_validator("size")
    @classmethod
    def _quantity(cls, value: str) -> str:
        try:
            parse_quantity(value)
        except ValueError:
            raise ValueError(
                f"{value!r}: not a storage quantity (e.g. 10Gi or 500Mi, as in a "
                "PersistentVolumeClaim's resources.requests.storage)"
            ) from None
        return value


class RetrySettings(BaseModel):
    """Failure backoff: base x 3^failures, capped (PKO's schedule)."""

    base: Duration = Field(default=timedelta(seconds=10))
    cap: Duration = Field(default=timedelta(hours=24))
    max_failures: int = Field(default=3, ge=1)


class NotificationSettings(BaseModel):
    """Delivery of notifications (docs/notifications.md): off the reconcile path, bounded."""

    max_attempts: int = Field(default=8, ge=1, description="attempts per event and receiver")
    backoff_base: Duration = Field(
        default=timedelta(seconds=1), description="wait after the first failed attempt"
    )
    backoff_cap: Duration = Field(
        default=timedelta(minutes=1), description="longest wait between two attempts"
    )
    timeout: Duration = Field(
        default=timedelta(seconds=10),
        description="socket timeout of an attempt: the connect, and each wait for the answer's "
        "bytes",
    )
    senders: int = Field(
        default=4, ge=1, le=64, description="deliveries in flight at once (threads)"
    )
    denied_cidrs: CommaList = Field(
        default_factory=lambda: list(PRIVATE_NETWORKS),
        description="address ranges no notification is sent to: the cluster's own service, "
        "pod and node ranges (default: every private range); loopback, link-local, "
        "unspecified, multicast and reserved addresses are refused besides these",
    )
    allowed_cidrs: CommaList = Field(
        default_factory=list,
        description="address ranges notifications may be sent to although refused otherwise "
        "(internal receivers, e.g. 10.20.0.0/16; docs/security.md)",
    )

    @field_validator("denied_cidrs", "allowed_cidrs")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        wrong = []
        for text in value:
            try:
                ipaddress.ip_network(text)
            except ValueError:
                wrong.append(text)
        if wrong:
            raise ValueError(
                f"{', '.join(map(repr, wrong))}: not an address range (CIDR, e.g. 10.0.0.0/8 "
                "or fd00::/8, with no host bits set)"
            )
        return value


class ReceiverSettings(BaseModel):
    """The push receiver (docs/operations.md#push-webhooks): off unless ``addr`` is set."""

    addr: str = Field(
        default="",
        description="HOST:PORT or :PORT the push receiver listens on (only while this replica "
        "leads); empty or '0': no receiver",
    )
    receivers: CommaList = Field(
        default_factory=list,
        description="the receivers, NAME=KIND (KIND: github, gitlab or generic), comma "
        "separated; each is served at /hooks/NAME",
    )
    secrets_dir: str = Field(
        default="/etc/pkobatch/receivers",
        description="directory holding one file per receiver, named after it, with its "
        "secret (a mounted Secret with one key per receiver); read on every request",
    )
    rate: float = Field(
        default=1.0, gt=0, description="requests per second each receiver accepts, on average"
    )
    burst: int = Field(
        default=10, ge=1, description="requests each receiver accepts at once above the rate"
    )

    @field_validator("addr")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value)

    @field_validator("receivers")
    @classmethod
    def _receivers(cls, value: list[str]) -> list[str]:
        names: set[str] = set()
        for entry in value:
            name, sep, kind = entry.partition("=")
            if not sep or not RECEIVER_NAME.fullmatch(name) or kind not in RECEIVER_KINDS:
                raise ValueError(
                    f"{entry!r} is not NAME=KIND (NAME: lowercase letters, digits and '-', "
                    f"at most 63 characters; KIND: {', '.join(RECEIVER_KINDS)})"
                )
            if name in names:
                raise ValueError(f"receiver {name!r} is named twice")
            names.add(name)
        return value

    @model_validator(mode="after")
    def _some_receiver(self) -> ReceiverSettings:
        if self.enabled and not self.receivers:
            raise ValueError(
                "the receiver has an address but no receivers: set PKOBATCH_RECEIVER__RECEIVERS "
                "(e.g. infra=github), or leave PKOBATCH_RECEIVER__ADDR empty"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.addr not in ("", "0")

    @property
    def kinds(self) -> dict[str, str]:
        """Receiver name -> kind."""
        return dict(entry.split("=", 1) for entry in self.receivers)


class ProgramServerSettings(BaseModel):
    """Where Programs' artifacts are served, and the URL their ``status.artifact`` gives
    (docs/api.md#program): ``http://<service>.<service_namespace>.svc:<service_port>``."""

    addr: str = Field(
        default="0",
        description="HOST:PORT or :PORT the Program artifact server listens on (only while "
        "this replica leads; the install manifests set :9090, PKO's port); empty or '0': "
        "artifacts are not served, status.artifact is still kept",
    )
    service: str = Field(
        default="pkobatch-controller",
        description="the Service in front of the artifact server: the host of status.artifact.url",
    )
    service_namespace: str = Field(
        default="", description="the Service's namespace; default: the controller pod's"
    )
    service_port: int = Field(default=80, ge=1, le=65535, description="the Service's port")

    @field_validator("addr")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value)

    @property
    def enabled(self) -> bool:
        return self.addr not in ("", "0")


class LeaderElectionSettings(BaseModel):
    enabled: bool = False
    lease_name: str = "pkobatch-controller"
    lease_namespace: str = Field(default="", description="default: the pod's namespace")
    lease_duration: Duration = Field(default=timedelta(seconds=35))
    renew_deadline: Duration = Field(default=timedelta(seconds=30))
    retry_period: Duration = Field(default=timedelta(seconds=5))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="PKOBATCH_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    kubeconfig: str = ""
    context: str = ""
    namespaces: CommaList = Field(default_factory=list, description="empty: all namespaces")
    namespace_selector: str = Field(
        default="",
        description="label selector of the namespaces whose Stacks are reconciled (e.g. "
        "pulumi=enabled); empty: every namespace of `namespaces`. Both set: the listed "
        "namespaces that match it (docs/install.md#watched-namespaces)",
    )
    label_selector: str = ""
    shard: str = Field(
        default="",
        description="this controller's shard: it reconciles only the Stacks labelled "
        "pkobatch.io/shard=<shard>, and takes the Lease <lease name>-<shard> (docs/sharding.md)",
    )
    sharded: bool = Field(
        default=False,
        description="part of a sharded install: without a shard, this controller reconciles "
        "only the Stacks that have no pkobatch.io/shard label (docs/sharding.md)",
    )
    workers: int = Field(default=4, ge=1, le=256)
    kube_qps: float = Field(
        default=200.0,
        gt=0,
        description="API requests per second the controller may send, on average (client-go's "
        "QPS; one token bucket shared by every request, watches included)",
    )
    kube_burst: int = Field(
        default=400,
        ge=1,
        description="API requests the controller may send at once above kube_qps after a "
        "quiet period (client-go's Burst)",
    )
    max_active_jobs: int = Field(
        default=50, ge=1, description="cap on running Jobs (cluster-wide; per shard when sharded)"
    )
    poll_interval: Duration = Field(
        default=timedelta(seconds=60),
        ge=timedelta(seconds=1),
        description="git branch polling interval (at least 1s; every interval costs one "
        "ls-remote per polled branch, so keep the default 60s outside tests)",
    )
    insecure_http_git_hosts: CommaList = Field(
        default_factory=list,
        description="hosts (host or host:port) to which git credentials may be sent over "
        "plain http://; by default credentials go only over https:// or ssh "
        "(docs/security.md)",
    )
    extra_flux_source_kinds: CommaList = Field(
        default_factory=list,
        description=f"kinds of {FLUX_SOURCE_GROUP} a Stack's spec.fluxSource may name besides "
        f"{', '.join(FLUX_SOURCE_KINDS)} (the controller also needs RBAC to get, list and "
        "watch them; docs/security.md)",
    )
    resync_period: Duration = Field(
        default=timedelta(hours=10),
        ge=timedelta(seconds=1),
        description="how often every cached Stack is reconciled again although nothing "
        "changed (controller-runtime's SyncPeriod); a reconcile of an idle Stack writes nothing",
    )
    schedule_starting_deadline: Duration = Field(
        default=timedelta(hours=1),
        description="a scheduled run or drift check missed for longer (controller down, "
        "Stack suspended) is skipped, like a CronJob's startingDeadlineSeconds",
    )
    job: JobSettings = Field(default_factory=JobSettings)
    run_cache: RunCacheSettings = Field(default_factory=RunCacheSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    notifications: NotificationSettings = Field(default_factory=NotificationSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    receiver: ReceiverSettings = Field(default_factory=ReceiverSettings)
    programs: ProgramServerSettings = Field(default_factory=ProgramServerSettings)
    metrics_addr: str = ":8080"
    metrics_secure: bool = Field(
        default=False,
        description="serve /metrics over HTTPS to callers whose ServiceAccount token may get "
        "/metrics (TokenReview, SubjectAccessReview; ClusterRole pkobatch-metrics-reader)",
    )
    metrics_cert_dir: str = Field(
        default="",
        description="directory with tls.crt and tls.key for secure metrics; empty: a "
        "self-signed certificate made at start-up",
    )
    health_addr: str = ":8081"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"

    @field_validator("shard")
    @classmethod
    def _shard_name(cls, value: str) -> str:
        if value and not SHARD_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a shard name: lowercase letters, digits and '-', starting "
                "and ending with a letter or digit, at most 40 characters"
            )
        return value

    @field_validator("extra_flux_source_kinds")
    @classmethod
    def _kind_names(cls, value: list[str]) -> list[str]:
        wrong = [kind for kind in value if not KIND_NAME.fullmatch(kind)]
        if wrong:
            raise ValueError(
                f"{', '.join(map(repr, wrong))}: not a kind name (e.g. HelmChart: a capital "
                "letter, then letters and digits)"
            )
        return value

    @field_validator("namespace_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        try:
            parse_selector(value)
        except InvalidSelector as exc:
            raise ValueError(f"not a label selector: {exc}") from None
        return value

    @property
    def namespace_filter(self) -> LabelSelector | None:
        """The namespace selector parsed (None: namespaces are not selected by label)."""
        return parse_selector(self.namespace_selector) if self.namespace_selector.strip() else None

    @property
    def flux_source_kinds(self) -> tuple[str, ...]:
        """The kinds of Flux sources a Stack may name (docs/security.md)."""
        return tuple(dict.fromkeys((*FLUX_SOURCE_KINDS, *self.extra_flux_source_kinds)))

    @property
    def shard_selector(self) -> str:
        """The label requirement on this controller's Stacks — and on their Jobs and
        results, which carry their Stack's shard label — ("" when not sharded)."""
        if self.shard:
            return f"{SHARD_LABEL}={self.shard}"
        return f"!{SHARD_LABEL}" if self.sharded else ""

    @property
    def stack_selector(self) -> str:
        """The label selector of the Stacks this controller reconciles."""
        return ",".join(part for part in (self.label_selector, self.shard_selector) if part)

    @property
    def lease_name(self) -> str:
        """One Lease per shard: shards elect their leaders independently."""
        base = self.leader_election.lease_name
        return f"{base}-{self.shard}" if self.shard else base

    def in_shard(self, labels: Mapping[str, str]) -> bool:
        """Does an object with ``labels`` belong to this controller's shard?"""
        if self.shard:
            return labels.get(SHARD_LABEL) == self.shard
        return SHARD_LABEL not in labels if self.sharded else True

    @field_validator("metrics_addr", "health_addr")
    @classmethod
    def _address(cls, value: str) -> str:
        return _host_port(value)


class SettingsInvalid(Exception):
    """Settings failed validation; the message lists every problem with its variable name."""


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with ``overrides`` (explicit flags) taking priority."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            path = "__".join(str(part) for part in error["loc"]).upper()
            problems.append(f"PKOBATCH_{path}: {error['msg']}")
        raise SettingsInvalid("invalid settings:\n  " + "\n  ".join(problems)) from exc
