"""The Kubernetes Pod Security Standards, as a pure check of one pod (metadata and spec).

A Stack's templates (``spec.jobTemplate``, ``spec.workspaceTemplate.spec.podTemplate``) are
merged into the pod of every run, and the controller creates that Job with its own rights.
So the controller must refuse a pod the Stack's author could not create under the
namespace's Pod Security level: ``check_pod`` judges the *final* pod against a level.

The controls follow the published standard (kubernetes.io "Pod Security Standards") as the
Pod Security admission of Kubernetes v1.37 enforces it, field by field, including its
relaxations: a pod in a user namespace (``hostUsers: false``) may run as root and set
``procMount``, and a Windows pod (``spec.os.name: windows``) is exempt from the restricted
seccomp, privilege-escalation and capability controls. Where a restricted control replaces
a baseline one (capabilities, volume types, seccomp, ``/proc`` mount), only the restricted
form is checked at that level, so one fault is reported once. The optional "non-root
groups" control, which the admission plugin does not enforce, is not checked either.

The input is plain JSON (what the Job builder produces); values of the wrong type count as
set, so a malformed pod is refused here rather than trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Level = Literal["privileged", "baseline", "restricted"]
LEVELS: Final[tuple[Level, ...]] = ("privileged", "baseline", "restricted")
JSON = Mapping[str, Any]

BASELINE_CAPABILITIES: Final = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES: Final = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS: Final = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
SELINUX_TYPES: Final = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
RESTRICTED_VOLUME_TYPES: Final = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
PROFILE_TYPES: Final = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX: Final = "container.apparmor.security.beta.kubernetes.io/"
PROBES: Final = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HANDLERS: Final = ("postStart", "preStop")
CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class Violation:
    """One field of the pod that the level forbids."""

    control: str
    level: Level
    field: str
    value: str
    allowed: str

    def __str__(self) -> str:
        return (
            f"{self.field}: {self.value} is not allowed at Pod Security level "
            f"{self.level!r} (control {self.control!r}; allowed: {self.allowed})"
        )


@dataclass(frozen=True)
class Control:
    name: str
    level: Level
    fields: str
    allowed: str
    check: Callable[[JSON, JSON], Iterator[Violation]]
    # A restricted control that takes the place of a baseline one at the restricted level.
    replaces: str = ""


def _map(value: Any) -> JSON:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: JSON) -> Iterator[tuple[str, JSON]]:
    """(field path, container) of every container, init and ephemeral container."""
    for kind in CONTAINER_LISTS:
        for index, container in enumerate(_list(spec.get(kind))):
            item = _map(container)
            name = item.get("name")
            label = name if isinstance(name, str) and name else str(index)
            yield f"spec.{kind}[{label}]", item


def _set(value: Any) -> bool:
    return value is not None


def _true(value: Any) -> bool:
    """Set to anything but ``false`` (a non-boolean is not trusted to mean false)."""
    return value is not None and value is not False


def _user_namespace(spec: JSON) -> bool:
    return spec.get("hostUsers") is False


def _windows(spec: JSON) -> bool:
    return _map(spec.get("os")).get("name") == "windows"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------------------------------
# Baseline
# ---------------------------------------------------------------------------------------

_HOST_PROCESS = "HostProcess"
_HOST_NAMESPACES = "Host Namespaces"
_PRIVILEGED = "Privileged Containers"
_CAPABILITIES = "Capabilities"
_HOST_PATH = "HostPath Volumes"
_HOST_PORTS = "Host Ports"
_HOST_PROBES = "Host Probes / Lifecycle Hooks"
_APPARMOR = "AppArmor"
_SELINUX = "SELinux"
_PROC_MOUNT = "/proc Mount Type"
_SECCOMP = "Seccomp"
_SYSCTLS = "Sysctls"


def _violation(control: str, level: Level, field: str, value: Any, allowed: str) -> Violation:
    return Violation(control, level, field, _show(value), allowed)


def _host_process(meta: JSON, spec: JSON) -> Iterator[Violation]:
    allowed = "unset or false"
    pod = _map(_map(spec.get("securityContext")).get("windowsOptions")).get("hostProcess")
    if _true(pod):
        yield _violation(
            _HOST_PROCESS,
            "baseline",
            "spec.securityContext.windowsOptions.hostProcess",
            pod,
            allowed,
        )
    for path, container in _containers(spec):
        value = _map(_map(container.get("securityContext")).get("windowsOptions")).get(
            "hostProcess"
        )
        if _true(value):
            yield _violation(
                _HOST_PROCESS,
                "baseline",
                f"{path}.securityContext.windowsOptions.hostProcess",
                value,
                allowed,
            )


def _host_namespaces(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if _true(spec.get(field)):
            yield _violation(
                _HOST_NAMESPACES, "baseline", f"spec.{field}", spec[field], "unset or false"
            )


def _privileged(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for path, container in _containers(spec):
        value = _map(container.get("securityContext")).get("privileged")
        if _true(value):
            yield _violation(
                _PRIVILEGED,
                "baseline",
                f"{path}.securityContext.privileged",
                value,
                "unset or false",
            )


def _added_capabilities(container: JSON) -> list[Any]:
    return _list(_map(_map(container.get("securityContext")).get("capabilities")).get("add"))


def _capabilities_baseline(meta: JSON, spec: JSON) -> Iterator[Violation]:
    allowed = "unset, or a subset of " + ", ".join(sorted(BASELINE_CAPABILITIES))
    for path, container in _containers(spec):
        extra = [c for c in _added_capabilities(container) if c not in BASELINE_CAPABILITIES]
        if extra:
            yield _violation(
                _CAPABILITIES,
                "baseline",
                f"{path}.securityContext.capabilities.add",
                ", ".join(map(str, extra)),
                allowed,
            )


def _host_path(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for index, volume in enumerate(_list(spec.get("volumes"))):
        item = _map(volume)
        if _set(item.get("hostPath")):
            name = item.get("name") or index
            yield _violation(
                _HOST_PATH,
                "baseline",
                f"spec.volumes[{name}].hostPath",
                _map(item.get("hostPath")).get("path", "set"),
                "unset",
            )


def _host_ports(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for path, container in _containers(spec):
        for index, port in enumerate(_list(container.get("ports"))):
            value = _map(port).get("hostPort")
            if value not in (None, 0):
                yield _violation(
                    _HOST_PORTS,
                    "baseline",
                    f"{path}.ports[{index}].hostPort",
                    value,
                    "unset or 0",
                )


def _host_probes(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for path, container in _containers(spec):
        handlers = [(f"{path}.{p}", _map(container.get(p))) for p in PROBES]
        lifecycle = _map(container.get("lifecycle"))
        handlers += [(f"{path}.lifecycle.{h}", _map(lifecycle.get(h))) for h in LIFECYCLE_HANDLERS]
        for where, handler in handlers:
            for action in ("httpGet", "tcpSocket"):
                host = _map(handler.get(action)).get("host")
                if host not in (None, ""):
                    yield _violation(
                        _HOST_PROBES, "baseline", f"{where}.{action}.host", host, "unset or empty"
                    )


def _apparmor(meta: JSON, spec: JSON) -> Iterator[Violation]:
    allowed = "unset, RuntimeDefault or Localhost"
    pod = _map(_map(spec.get("securityContext")).get("appArmorProfile"))
    if pod and pod.get("type") not in PROFILE_TYPES:
        yield _violation(
            _APPARMOR,
            "baseline",
            "spec.securityContext.appArmorProfile.type",
            pod.get("type"),
            allowed,
        )
    for path, container in _containers(spec):
        profile = _map(_map(container.get("securityContext")).get("appArmorProfile"))
        if profile and profile.get("type") not in PROFILE_TYPES:
            yield _violation(
                _APPARMOR,
                "baseline",
                f"{path}.securityContext.appArmorProfile.type",
                profile.get("type"),
                allowed,
            )
    for key, value in sorted(_map(meta.get("annotations")).items()):
        if not str(key).startswith(APPARMOR_ANNOTATION_PREFIX):
            continue
        text = str(value)
        if text and text != "runtime/default" and not text.startswith("localhost/"):
            yield _violation(
                _APPARMOR,
                "baseline",
                f"metadata.annotations[{key}]",
                text,
                "unset, empty, runtime/default or localhost/*",
            )


def _selinux_options(where: str, options: JSON) -> Iterator[Violation]:
    kind = options.get("type", "")
    if kind not in SELINUX_TYPES:
        yield _violation(
            _SELINUX,
            "baseline",
            f"{where}.seLinuxOptions.type",
            kind,
            "unset, " + ", ".join(sorted(t for t in SELINUX_TYPES if t)),
        )
    for field in ("user", "role"):
        if options.get(field) not in (None, ""):
            yield _violation(
                _SELINUX,
                "baseline",
                f"{where}.seLinuxOptions.{field}",
                options[field],
                "unset or empty",
            )


def _selinux(meta: JSON, spec: JSON) -> Iterator[Violation]:
    yield from _selinux_options(
        "spec.securityContext", _map(_map(spec.get("securityContext")).get("seLinuxOptions"))
    )
    for path, container in _containers(spec):
        options = _map(_map(container.get("securityContext")).get("seLinuxOptions"))
        yield from _selinux_options(f"{path}.securityContext", options)


def _proc_mount(level: Level, relax: bool) -> Callable[[JSON, JSON], Iterator[Violation]]:
    def check(meta: JSON, spec: JSON) -> Iterator[Violation]:
        if relax and _user_namespace(spec):
            return
        for path, container in _containers(spec):
            value = _map(container.get("securityContext")).get("procMount")
            if value not in (None, "Default"):
                yield _violation(
                    _PROC_MOUNT,
                    level,
                    f"{path}.securityContext.procMount",
                    value,
                    "unset or Default"
                    + (" (any value with spec.hostUsers: false)" if relax else ""),
                )

    return check


def _seccomp_baseline(meta: JSON, spec: JSON) -> Iterator[Violation]:
    allowed = "unset, RuntimeDefault or Localhost"
    pod = _map(_map(spec.get("securityContext")).get("seccompProfile"))
    if pod and pod.get("type") not in PROFILE_TYPES:
        yield _violation(
            _SECCOMP,
            "baseline",
            "spec.securityContext.seccompProfile.type",
            pod.get("type"),
            allowed,
        )
    for path, container in _containers(spec):
        profile = _map(_map(container.get("securityContext")).get("seccompProfile"))
        if profile and profile.get("type") not in PROFILE_TYPES:
            yield _violation(
                _SECCOMP,
                "baseline",
                f"{path}.securityContext.seccompProfile.type",
                profile.get("type"),
                allowed,
            )


def _sysctls(meta: JSON, spec: JSON) -> Iterator[Violation]:
    for index, sysctl in enumerate(_list(_map(spec.get("securityContext")).get("sysctls"))):
        name = _map(sysctl).get("name")
        if name not in SAFE_SYSCTLS:
            yield _violation(
                _SYSCTLS,
                "baseline",
                f"spec.securityContext.sysctls[{index}].name",
                name,
                "unset, or one of " + ", ".join(sorted(SAFE_SYSCTLS)),
            )


# ---------------------------------------------------------------------------------------
# Restricted
# ---------------------------------------------------------------------------------------

_VOLUME_TYPES = "Volume Types"
_PRIVILEGE_ESCALATION = "Privilege Escalation"
_NON_ROOT = "Running as Non-root"
_NON_ROOT_USER = "Running as Non-root user"


def _volume_types(meta: JSON, spec: JSON) -> Iterator[Violation]:
    allowed = "volumes of type " + ", ".join(sorted(RESTRICTED_VOLUME_TYPES))
    for index, volume in enumerate(_list(spec.get("volumes"))):
        item = _map(volume)
        name = item.get("name") or index
        for source in sorted(k for k in item if k != "name" and k not in RESTRICTED_VOLUME_TYPES):
            yield _violation(
                _VOLUME_TYPES, "restricted", f"spec.volumes[{name}].{source}", "set", allowed
            )


def _privilege_escalation(meta: JSON, spec: JSON) -> Iterator[Violation]:
    if _windows(spec):
        return
    for path, container in _containers(spec):
        value = _map(container.get("securityContext")).get("allowPrivilegeEscalation")
        if value is not False:
            yield _violation(
                _PRIVILEGE_ESCALATION,
                "restricted",
                f"{path}.securityContext.allowPrivilegeEscalation",
                "unset" if value is None else value,
                "false",
            )


def _non_root(meta: JSON, spec: JSON) -> Iterator[Violation]:
    if _user_namespace(spec):
        return
    allowed = "true (on the pod, or on every container); any value with spec.hostUsers: false"
    pod = _map(spec.get("securityContext")).get("runAsNonRoot")
    if pod is not None and pod is not True:
        yield _violation(_NON_ROOT, "restricted", "spec.securityContext.runAsNonRoot", pod, allowed)
    for path, container in _containers(spec):
        value = _map(container.get("securityContext")).get("runAsNonRoot")
        if (value is None and pod is not True) or (value is not None and value is not True):
            yield _violation(
                _NON_ROOT,
                "restricted",
                f"{path}.securityContext.runAsNonRoot",
                "unset" if value is None else value,
                allowed,
            )


def _non_root_user(meta: JSON, spec: JSON) -> Iterator[Violation]:
    if _user_namespace(spec):
        return
    allowed = "unset or non-zero (any value with spec.hostUsers: false)"
    pod = _map(spec.get("securityContext")).get("runAsUser")
    if pod == 0 and not isinstance(pod, bool):
        yield _violation(_NON_ROOT_USER, "restricted", "spec.securityContext.runAsUser", 0, allowed)
    for path, container in _containers(spec):
        value = _map(container.get("securityContext")).get("runAsUser")
        if value == 0 and not isinstance(value, bool):
            yield _violation(
                _NON_ROOT_USER, "restricted", f"{path}.securityContext.runAsUser", 0, allowed
            )


def _seccomp_restricted(meta: JSON, spec: JSON) -> Iterator[Violation]:
    if _windows(spec):
        return
    allowed = "RuntimeDefault or Localhost, on the pod or on every container"
    pod = _map(spec.get("securityContext")).get("seccompProfile")
    pod_type = _map(pod).get("type")
    if pod is not None and pod_type not in PROFILE_TYPES:
        yield _violation(
            _SECCOMP, "restricted", "spec.securityContext.seccompProfile.type", pod_type, allowed
        )
    pod_ok = pod_type in PROFILE_TYPES
    for path, container in _containers(spec):
        profile = _map(container.get("securityContext")).get("seccompProfile")
        if profile is None:
            if not pod_ok:
                yield _violation(
                    _SECCOMP,
                    "restricted",
                    f"{path}.securityContext.seccompProfile.type",
                    "unset",
                    allowed,
                )
        elif _map(profile).get("type") not in PROFILE_TYPES:
            yield _violation(
                _SECCOMP,
                "restricted",
                f"{path}.securityContext.seccompProfile.type",
                _map(profile).get("type"),
                allowed,
            )


def _capabilities_restricted(meta: JSON, spec: JSON) -> Iterator[Violation]:
    windows = _windows(spec)
    for path, container in _containers(spec):
        capabilities = _map(_map(container.get("securityContext")).get("capabilities"))
        if not windows and "ALL" not in _list(capabilities.get("drop")):
            yield _violation(
                _CAPABILITIES,
                "restricted",
                f"{path}.securityContext.capabilities.drop",
                "without ALL",
                "a list that includes ALL",
            )
        extra = [c for c in _list(capabilities.get("add")) if c not in RESTRICTED_CAPABILITIES]
        if extra and not windows:
            yield _violation(
                _CAPABILITIES,
                "restricted",
                f"{path}.securityContext.capabilities.add",
                ", ".join(map(str, extra)),
                "unset or NET_BIND_SERVICE",
            )


CONTROLS: Final[tuple[Control, ...]] = (
    Control(
        _HOST_PROCESS,
        "baseline",
        "spec.securityContext.windowsOptions.hostProcess, "
        "spec.*Containers[*].securityContext.windowsOptions.hostProcess",
        "unset or false",
        _host_process,
    ),
    Control(
        _HOST_NAMESPACES,
        "baseline",
        "spec.hostNetwork, spec.hostPID, spec.hostIPC",
        "unset or false",
        _host_namespaces,
    ),
    Control(
        _PRIVILEGED,
        "baseline",
        "spec.*Containers[*].securityContext.privileged",
        "unset or false",
        _privileged,
    ),
    Control(
        _CAPABILITIES,
        "baseline",
        "spec.*Containers[*].securityContext.capabilities.add",
        "unset, or a subset of " + ", ".join(sorted(BASELINE_CAPABILITIES)),
        _capabilities_baseline,
    ),
    Control(_HOST_PATH, "baseline", "spec.volumes[*].hostPath", "unset", _host_path),
    Control(
        _HOST_PORTS,
        "baseline",
        "spec.*Containers[*].ports[*].hostPort",
        "unset or 0",
        _host_ports,
    ),
    Control(
        _HOST_PROBES,
        "baseline",
        "spec.*Containers[*].{liveness,readiness,startup}Probe."
        "{httpGet,tcpSocket}.host, spec.*Containers[*].lifecycle.{postStart,preStop}."
        "{httpGet,tcpSocket}.host",
        "unset or empty",
        _host_probes,
    ),
    Control(
        _APPARMOR,
        "baseline",
        "spec.securityContext.appArmorProfile.type, "
        "spec.*Containers[*].securityContext.appArmorProfile.type; "
        "metadata.annotations['container.apparmor.security.beta.kubernetes.io/*']",
        "unset, RuntimeDefault or Localhost; annotations: unset, runtime/default or localhost/*",
        _apparmor,
    ),
    Control(
        _SELINUX,
        "baseline",
        "spec.securityContext.seLinuxOptions.{type,user,role}, "
        "spec.*Containers[*].securityContext.seLinuxOptions.{type,user,role}",
        "type: unset, "
        + ", ".join(sorted(t for t in SELINUX_TYPES if t))
        + "; user and role: unset",
        _selinux,
    ),
    Control(
        _PROC_MOUNT,
        "baseline",
        "spec.*Containers[*].securityContext.procMount",
        "unset or Default (any value with spec.hostUsers: false)",
        _proc_mount("baseline", True),
    ),
    Control(
        _SECCOMP,
        "baseline",
        "spec.securityContext.seccompProfile.type, "
        "spec.*Containers[*].securityContext.seccompProfile.type",
        "unset, RuntimeDefault or Localhost",
        _seccomp_baseline,
    ),
    Control(
        _SYSCTLS,
        "baseline",
        "spec.securityContext.sysctls[*].name",
        "unset, or one of " + ", ".join(sorted(SAFE_SYSCTLS)),
        _sysctls,
    ),
    Control(
        _VOLUME_TYPES,
        "restricted",
        "spec.volumes[*]",
        "only " + ", ".join(sorted(RESTRICTED_VOLUME_TYPES)),
        _volume_types,
        replaces=_HOST_PATH,
    ),
    Control(
        _PRIVILEGE_ESCALATION,
        "restricted",
        "spec.*Containers[*].securityContext.allowPrivilegeEscalation",
        "false (Windows pods exempt)",
        _privilege_escalation,
    ),
    Control(
        _NON_ROOT,
        "restricted",
        "spec.securityContext.runAsNonRoot, spec.*Containers[*].securityContext.runAsNonRoot",
        "true on the pod or every container (any value with spec.hostUsers: false)",
        _non_root,
    ),
    Control(
        _NON_ROOT_USER,
        "restricted",
        "spec.securityContext.runAsUser, spec.*Containers[*].securityContext.runAsUser",
        "unset or non-zero (any value with spec.hostUsers: false)",
        _non_root_user,
    ),
    Control(
        _SECCOMP,
        "restricted",
        "spec.securityContext.seccompProfile.type, "
        "spec.*Containers[*].securityContext.seccompProfile.type",
        "RuntimeDefault or Localhost on the pod or every container (Windows pods exempt)",
        _seccomp_restricted,
        replaces=_SECCOMP,
    ),
    Control(
        _CAPABILITIES,
        "restricted",
        "spec.*Containers[*].securityContext.capabilities.{drop,add}",
        "drop includes ALL; add: unset or NET_BIND_SERVICE (Windows pods exempt)",
        _capabilities_restricted,
        replaces=_CAPABILITIES,
    ),
    Control(
        _PROC_MOUNT,
        "restricted",
        "spec.*Containers[*].securityContext.procMount",
        "unset or Default",
        _proc_mount("restricted", False),
        replaces=_PROC_MOUNT,
    ),
)


def controls_for(level: Level) -> list[Control]:
    """The controls a pod must pass at ``level`` (restricted ones replace their baseline)."""
    if level == "privileged":
        return []
    if level == "baseline":
        return [c for c in CONTROLS if c.level == "baseline"]
    replaced = {c.replaces for c in CONTROLS if c.replaces}
    return [c for c in CONTROLS if c.level == "restricted" or c.name not in replaced]


def check_pod(metadata: JSON, spec: JSON, level: Level) -> list[Violation]:
    """Every field of the pod (``metadata``, ``spec``) that ``level`` forbids, in order."""
    return [v for control in controls_for(level) for v in control.check(metadata, spec)]
