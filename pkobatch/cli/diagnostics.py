"""``pkobatch check`` and ``pkobatch version``: is everything installed, current and allowed?

The comparisons are pure functions (``crd_differences``, ``lease_state``,
``leader_election``, ``permission_checks``) so that each verdict is unit-tested; the commands
only fetch.

A controller elects a leader only with ``PKOBATCH_LEADER_ELECTION__ENABLED`` (off by default;
deploy/ turns it on): ``check`` reads that from the controller's Deployment and expects a
held Lease only where it is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import click
from rich.text import Text

from pkobatch import __version__
from pkobatch.api.constants import CRD_NAME, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from pkobatch.api.crd import generate_crd
from pkobatch.api.objects import JSON
from pkobatch.api.timestamps import parse_time
from pkobatch.cli.runs import read_result
from pkobatch.cli.session import Session, command, describe_unreachable, exit_failed, now
from pkobatch.cli.text_format import human_duration
from pkobatch.kube.client import (
    CONFIGMAPS,
    CRDS,
    DEPLOYMENTS,
    LEASES,
    SELF_SUBJECT_ACCESS_REVIEWS,
    Forbidden,
    Kube,
    KubeError,
    NotFound,
    Unreachable,
)
from pkobatch.kube.rbac import access_review

CONTROLLER_NAMESPACE: Final = "pkobatch-system"
# The Lease of the main controller; a shard's is CONTROLLER_LEASE-<shard>. Fixed: the chart's
# fullnameOverride renames the Deployment, not the Lease.
CONTROLLER_LEASE: Final = "pkobatch-controller"
# How deploy/ labels the controller's Deployments and pods, main and shards (docs/sharding.md);
# found by these labels, not by name, as the chart's fullnameOverride renames them.
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
CONTROLLER_COMPONENT: Final = "controller"
SHARD_COMPONENT: Final = "controller-shard"
CONTROLLER_SHARD_LABEL: Final = "pkobatch.io/controller-shard"
CONTROLLER_CONTAINER: Final = "controller"
CONTROLLER_SELECTOR: Final = (
    "app.kubernetes.io/part-of=pkobatch,"
    f"{COMPONENT_LABEL} in ({CONTROLLER_COMPONENT},{SHARD_COMPONENT})"
)
LEADER_ELECTION_ENV: Final = "PKOBATCH_LEADER_ELECTION__ENABLED"
# The words pydantic reads as true (the controller's settings parse this variable so).
TRUE_WORDS: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
OK: Final = "ok"
WARNING: Final = "warning"
FAIL: Final = "FAIL"
CONTROLLER_NAMESPACE_OPTION = click.option(
    "--controller-namespace",
    metavar="NS",
    default=CONTROLLER_NAMESPACE,
    show_default=True,
    help="Namespace of the pkobatch controller.",
)

# What each command needs (API group, resource, verb); `check` asks the API server which
# of these the current user may do, in the namespace the command would work in.
COMMAND_PERMISSIONS: Final[Mapping[str, tuple[tuple[str, str, str], ...]]] = {
    "get, describe, outputs, schedule, plan": (
        ("pulumi.com", "stacks", "get"),
        ("pulumi.com", "stacks", "list"),
        ("pulumi.com", "stacks", "watch"),
    ),
    "up, preview, refresh, destroy, cancel, unlock, reconcile, suspend, resume, approve, reject": (
        ("pulumi.com", "stacks", "patch"),
    ),
    "history": (("batch", "jobs", "list"), ("", "configmaps", "list")),
    "logs": (("", "pods", "list"), ("", "pods/log", "get")),
    "events": (("", "events", "list"), ("", "events", "watch")),
}


@dataclass(frozen=True)
class Check:
    name: str
    result: str
    detail: str

    def to_json(self) -> JSON:
        return {"check": self.name, "result": self.result, "detail": self.detail}


def _comparable_version(version: Mapping[str, Any]) -> JSON:
    keys = ("served", "storage", "deprecated", "schema", "subresources", "additionalPrinterColumns")
    return {key: version.get(key) for key in keys if version.get(key) not in (None, False)}


def crd_differences(installed: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """What differs between the installed CRD and the one this CLI generates."""
    problems = []
    spec, wanted = installed.get("spec") or {}, expected["spec"]
    for key in ("group", "scope"):
        if spec.get(key) != wanted[key]:
            problems.append(f"spec.{key} is {spec.get(key)!r}, expected {wanted[key]!r}")
    names = spec.get("names") or {}
    for key, value in wanted["names"].items():
        if names.get(key) != value:
            problems.append(f"spec.names.{key} is {names.get(key)!r}, expected {value!r}")
    have = {v.get("name"): v for v in spec.get("versions") or []}
    for version in wanted["versions"]:
        current = have.get(version["name"])
        if current is None:
            problems.append(f"version {version['name']} is missing")
            continue
        mine, theirs = _comparable_version(version), _comparable_version(current)
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                problems.append(f"version {version['name']}: {key} differs")
    return problems


@dataclass(frozen=True)
class LeaseState:
    holder: str
    renewed: datetime | None
    duration: timedelta
    expired: bool


def lease_state(lease: Mapping[str, Any], now: datetime) -> LeaseState:
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    holder = str(spec.get("holderIdentity") or "")
    expired = not holder or renewed is None or renewed + duration < now
    return LeaseState(holder, renewed, duration, expired)


def image_tag(image: str) -> str:
    """The tag (or digest) of an image reference; "latest" when it has neither."""
    if "@" in image:
        return image.split("@", 1)[1]
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else "latest"


def controller_container(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    chosen = next((c for c in containers if c.get("name") == CONTROLLER_CONTAINER), None)
    return chosen or (containers[0] if containers else {})


def controller_image(deployment: Mapping[str, Any]) -> str:
    return str(controller_container(deployment).get("image") or "")


def leader_election(deployment: Mapping[str, Any]) -> bool | None:
    """Whether the Deployment's controller elects a leader; None when its Deployment does
    not say (the variable comes from a reference or an ``envFrom`` source)."""
    container = controller_container(deployment)
    for variable in container.get("env") or []:
        if variable.get("name") == LEADER_ELECTION_ENV:
            value = variable.get("value")
            return None if value is None else str(value).strip().lower() in TRUE_WORDS
    return None if container.get("envFrom") else False


# -- checks -------------------------------------------------------------------------------


def _api_server_check(kube: Kube) -> Check:
    version = kube.request("GET", "/version")
    return Check("api server", OK, f"{version.get('gitVersion', '?')} at {kube.host}")


def _crd_checks(kube: Kube) -> list[Check]:
    try:
        installed = kube.get(CRDS, CRD_NAME)
    except NotFound:
        return [
            Check(
                "crd",
                FAIL,
                f"{CRD_NAME} is not installed: `pkobatch crds | kubectl apply -f -`",
            )
        ]
    except Forbidden:
        return [Check("crd", WARNING, f"not allowed to read the CRD {CRD_NAME}")]
    problems = crd_differences(installed, generate_crd())
    if problems:
        return [
            Check(
                "crd",
                FAIL,
                f"{CRD_NAME} differs from this CLI's ({'; '.join(problems[:3])}): "
                "re-apply it with `pkobatch crds | kubectl apply --server-side -f -`",
            )
        ]
    return [Check("crd", OK, f"{CRD_NAME} is installed and current")]


@dataclass(frozen=True)
class ControllerDeployments:
    """The controller Deployments of a namespace: the main one (None if absent) and each
    shard's, by shard name."""

    main: JSON | None
    shards: list[tuple[str, JSON]]


def controller_deployments(deployments: Sequence[JSON]) -> ControllerDeployments:
    """Sorts Deployments labelled ``CONTROLLER_SELECTOR`` into the main controller (the first
    by name, should a namespace hold two) and the shards (by their shard label)."""
    main: list[JSON] = []
    shards: dict[str, JSON] = {}
    for deployment in sorted(deployments, key=lambda d: str(d["metadata"]["name"])):
        labels = deployment["metadata"].get("labels") or {}
        component = labels.get(COMPONENT_LABEL)
        if component == CONTROLLER_COMPONENT:
            main.append(deployment)
        elif component == SHARD_COMPONENT and labels.get(CONTROLLER_SHARD_LABEL):
            shards.setdefault(str(labels[CONTROLLER_SHARD_LABEL]), deployment)
    return ControllerDeployments(main[0] if main else None, sorted(shards.items()))


def _find_controller_deployments(kube: Kube, namespace: str) -> ControllerDeployments:
    deployments, _ = kube.list_objects(DEPLOYMENTS, namespace, label_selector=CONTROLLER_SELECTOR)
    return controller_deployments(deployments)


def _controller_checks(kube: Kube, namespace: str, now: datetime) -> list[Check]:
    checks = []
    found = ControllerDeployments(None, [])
    try:
        found = _find_controller_deployments(kube, namespace)
    except Forbidden:
        checks.append(Check("controller deployment", WARNING, "not allowed to read it"))
    deployment = found.main
    if deployment is not None:
        name = deployment["metadata"]["name"]
        status = deployment.get("status") or {}
        ready, wanted = (
            int(status.get("readyReplicas") or 0),
            int((deployment.get("spec") or {}).get("replicas") or 0),
        )
        image = controller_image(deployment)
        checks.append(
            Check(
                "controller deployment",
                OK if ready >= 1 else FAIL,
                f"{namespace}/{name}: {ready}/{wanted} ready, image {image}",
            )
        )
    elif not checks:
        checks.append(
            Check(
                "controller deployment",
                WARNING,
                f"no controller Deployment in {namespace} (labelled {CONTROLLER_SELECTOR}; "
                "fine if the controller runs elsewhere; else pass --controller-namespace)",
            )
        )
    checks.append(
        _leader_check(kube, namespace, CONTROLLER_LEASE, "controller leader", now, deployment)
    )
    for shard, shard_deployment in found.shards:
        lease = f"{CONTROLLER_LEASE}-{shard}"
        checks.append(
            _leader_check(kube, namespace, lease, f"shard {shard} leader", now, shard_deployment)
        )
    return checks


def _leader_check(
    kube: Kube,
    namespace: str,
    lease_name: str,
    check: str,
    now: datetime,
    deployment: Mapping[str, Any] | None,
) -> Check:
    """The leader of ``lease_name`` holds its Lease, unless ``deployment`` (the controller's,
    when readable) runs it without leader election."""
    if deployment is not None and leader_election(deployment) is False:
        replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
        if replicas > 1:
            return Check(
                check,
                WARNING,
                f"leader election is off ({LEADER_ELECTION_ENV}) with {replicas} replicas: "
                "each of them runs the same Stacks; set it to true",
            )
        return Check(check, OK, f"none needed: leader election is off ({LEADER_ELECTION_ENV})")
    try:
        lease = lease_state(kube.get(LEASES, lease_name, namespace), now)
    except NotFound:
        return Check(
            check,
            FAIL,
            f"no Lease {namespace}/{lease_name}: the controller is not running "
            "(or runs without leader election, or in another --controller-namespace)",
        )
    except Forbidden:
        return Check(check, WARNING, "not allowed to read its Lease")
    if lease.expired:
        return Check(
            check, FAIL, f"Lease {namespace}/{lease_name} is not held: no controller is running"
        )
    since = human_duration(now - lease.renewed) if lease.renewed else "?"
    return Check(check, OK, f"{lease.holder} (renewed {since} ago)")


def _permission_checks(kube: Kube, namespace: str | None) -> list[Check]:
    where = f"namespace {namespace}" if namespace else "all namespaces"
    checks = []
    for commands, needs in COMMAND_PERMISSIONS.items():
        denied = []
        for group, resource, verb in needs:
            review = kube.create(
                SELF_SUBJECT_ACCESS_REVIEWS, access_review(group, resource, verb, namespace)
            )
            if not (review.get("status") or {}).get("allowed"):
                denied.append(f"{verb} {resource}")
        checks.append(
            Check(
                f"rbac: {commands}",
                FAIL if denied else OK,
                f"cannot {', '.join(denied)} in {where}" if denied else f"allowed in {where}",
            )
        )
    return checks


def _check_rows(checks: Sequence[Check]) -> list[list[Text | str]]:
    style = {OK: "green", WARNING: "yellow", FAIL: "red"}
    return [[c.name, Text(c.result, style=style[c.result]), c.detail] for c in checks]


@command(
    "check",
    short_help="Check the CRD, the controller and your permissions.",
    epilog="""\b
Examples:
  pkobatch check
  pkobatch check -n team-payments --controller-namespace pkobatch""",
)
@CONTROLLER_NAMESPACE_OPTION
def check_command(controller_namespace: str) -> None:
    """Check that the API server answers, the Stack CRD is installed and matches this CLI,
    the controller runs and — where its Deployment enables leader election, as deploy/
    does — holds its leader Lease (as does each controller shard), and what you may do in
    the namespace. Exits 1 if any check fails."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    kube = session.kube
    try:
        checks = [_api_server_check(kube)]
    except Unreachable as exc:
        checks = [Check("api server", FAIL, describe_unreachable(exc, kube.host))]
    else:
        checks += _crd_checks(kube)
        checks += _controller_checks(kube, controller_namespace, now())
        checks += _permission_checks(kube, session.list_namespace)
    if session.output in ("json", "yaml"):
        session.print_data([c.to_json() for c in checks])
    else:
        session.print_table(["check", "result", "detail"], _check_rows(checks))
    if any(c.result == FAIL for c in checks):
        exit_failed()


# -- version ------------------------------------------------------------------------------


def _controller_version(kube: Kube, namespace: str) -> tuple[str, str]:
    try:
        deployment = _find_controller_deployments(kube, namespace).main
        if deployment is not None:
            image = controller_image(deployment)
            name = deployment["metadata"]["name"]
            return image_tag(image), f"Deployment {namespace}/{name} runs {image}"
    except Forbidden:
        pass
    try:
        lease = kube.get(LEASES, CONTROLLER_LEASE, namespace)
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        return "unknown", f"leader {holder}" if holder else "no leader"
    except (NotFound, Forbidden):
        return "unknown", f"no controller found in namespace {namespace}"


def _crd_version(kube: Kube) -> tuple[str, str]:
    try:
        installed = kube.get(CRDS, CRD_NAME)
    except NotFound:
        return "not installed", "`pkobatch crds | kubectl apply -f -`"
    except Forbidden:
        return "unknown", "not allowed to read the CRD"
    served = [v.get("name") for v in (installed.get("spec") or {}).get("versions") or []]
    current = not crd_differences(installed, generate_crd())
    return ", ".join(map(str, served)), "matches this CLI" if current else "differs from this CLI"


def _pulumi_version(kube: Kube, namespace: str | None) -> tuple[str, str]:
    try:
        configmaps, _ = kube.list_objects(
            CONFIGMAPS, namespace, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
        )
    except Forbidden:
        return "unknown", "not allowed to list run results"
    results = [r for r in map(read_result, configmaps) if r is not None and r.pulumi_version]
    if not results:
        where = f"namespace {namespace}" if namespace else "the cluster"
        return "unknown", f"no run results in {where}"
    latest = max(
        results,
        key=lambda r: (r.end_time is not None, r.end_time or datetime.min.replace(tzinfo=UTC)),
    )
    return latest.pulumi_version, f"used by run {latest.job_name}"


@command(
    "version",
    short_help="Show the versions of the CLI, controller, CRD and Pulumi.",
    epilog="""\b
Examples:
  pkobatch version
  pkobatch version --client
  pkobatch version -o json""",
)
@CONTROLLER_NAMESPACE_OPTION
@click.option("--client", "client_only", is_flag=True, help="Only the CLI's version.")
def version_command(controller_namespace: str, client_only: bool) -> None:
    """Show the versions of this CLI, the controller (its image tag), the installed CRD,
    and Pulumi (as reported by the most recent run in the namespace)."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    rows: list[tuple[str, str, str]] = [("cli", __version__, "")]
    failed = False
    if not client_only:
        kube = session.kube
        try:
            server = str(kube.request("GET", "/version").get("gitVersion", "?"))
            rows.append(("kubernetes", server, kube.host))
            rows.append(("controller", *_controller_version(kube, controller_namespace)))
            rows.append(("crd", *_crd_version(kube)))
            rows.append(("pulumi", *_pulumi_version(kube, session.list_namespace)))
        except KubeError as exc:
            failed = True
            detail = (
                describe_unreachable(exc, kube.host)
                if isinstance(exc, Unreachable)
                else " ".join(exc.message.split())
            )
            rows.append(("cluster", "unavailable", detail))
    if session.output in ("json", "yaml"):
        session.print_data(
            {name: {"version": version, "detail": detail} for name, version, detail in rows}
        )
    else:
        session.print_table(["component", "version", "detail"], [list(r) for r in rows])
    if failed:
        exit_failed()
