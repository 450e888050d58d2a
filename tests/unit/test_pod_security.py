"""Every Pod Security Standards control of pkobatch.api.pod_security, at every level.

Each case is a pod that breaks exactly one control: it must pass at the levels below the
control's and be refused, naming the field, at the control's level and above. The
compliant pods (the run's own default pod, a restricted pod) pass everywhere.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.pod_security import (
    BASELINE_CAPABILITIES,
    CONTROLS,
    LEVELS,
    RESTRICTED_VOLUME_TYPES,
    SAFE_SYSCTLS,
    SELINUX_TYPES,
    Level,
    check_pod,
    controls_for,
)

JSON = dict[str, Any]


def restricted_pod(**spec: Any) -> JSON:
    """A pod that meets the restricted level (the shape of the run's own pod)."""
    base: JSON = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "pulumi",
                "image": "runner",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    base.update(spec)
    return base


def with_container(pod: JSON, **security: Any) -> JSON:
    pod = copy.deepcopy(pod)
    pod["containers"][0]["securityContext"].update(security)
    return pod


def with_init(pod: JSON, container: JSON) -> JSON:
    pod = copy.deepcopy(pod)
    pod["initContainers"] = [container]
    return pod


def with_pod_security(pod: JSON, **security: Any) -> JSON:
    pod = copy.deepcopy(pod)
    pod["securityContext"] = {**pod["securityContext"], **security}
    return pod


OK = restricted_pod()
# (case id, control level, metadata, pod spec, field that must be named)
CASES: list[tuple[str, Level, JSON, JSON, str]] = [
    (
        "host-process-pod",
        "baseline",
        {},
        with_pod_security(OK, windowsOptions={"hostProcess": True}),
        "spec.securityContext.windowsOptions.hostProcess",
    ),
    (
        "host-process-container",
        "baseline",
        {},
        with_container(OK, windowsOptions={"hostProcess": True}),
        "spec.containers[pulumi].securityContext.windowsOptions.hostProcess",
    ),
    ("host-network", "baseline", {}, restricted_pod(hostNetwork=True), "spec.hostNetwork"),
    ("host-pid", "baseline", {}, restricted_pod(hostPID=True), "spec.hostPID"),
    ("host-ipc", "baseline", {}, restricted_pod(hostIPC=True), "spec.hostIPC"),
    (
        "privileged",
        "baseline",
        {},
        with_container(OK, privileged=True),
        "spec.containers[pulumi].securityContext.privileged",
    ),
    (
        "privileged-init-container",
        "baseline",
        {},
        with_init(OK, {"name": "setup", "securityContext": {"privileged": True}}),
        "spec.initContainers[setup].securityContext.privileged",
    ),
    (
        "capability-sys-admin",
        "baseline",
        {},
        with_container(OK, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        "spec.containers[pulumi].securityContext.capabilities.add",
    ),
    (
        "capability-net-raw",
        "baseline",
        {},
        with_container(OK, capabilities={"drop": ["ALL"], "add": ["NET_RAW"]}),
        "spec.containers[pulumi].securityContext.capabilities.add",
    ),
    (
        "host-path",
        "baseline",
        {},
        restricted_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "spec.volumes[root].hostPath",
    ),
    (
        "host-port",
        "baseline",
        {},
        restricted_pod(
            containers=[{**OK["containers"][0], "ports": [{"containerPort": 80, "hostPort": 80}]}]
        ),
        "spec.containers[pulumi].ports[0].hostPort",
    ),
    (
        "probe-host",
        "baseline",
        {},
        restricted_pod(
            containers=[
                {
                    **OK["containers"][0],
                    "livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80}},
                }
            ]
        ),
        "spec.containers[pulumi].livenessProbe.httpGet.host",
    ),
    (
        "lifecycle-host",
        "baseline",
        {},
        restricted_pod(
            containers=[
                {
                    **OK["containers"][0],
                    "lifecycle": {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}},
                }
            ]
        ),
        "spec.containers[pulumi].lifecycle.preStop.tcpSocket.host",
    ),
    (
        "apparmor-unconfined",
        "baseline",
        {},
        with_container(OK, appArmorProfile={"type": "Unconfined"}),
        "spec.containers[pulumi].securityContext.appArmorProfile.type",
    ),
    (
        "apparmor-annotation",
        "baseline",
        {"annotations": {"container.apparmor.security.beta.kubernetes.io/pulumi": "unconfined"}},
        OK,
        "metadata.annotations[container.apparmor.security.beta.kubernetes.io/pulumi]",
    ),
    (
        "selinux-type",
        "baseline",
        {},
        with_pod_security(OK, seLinuxOptions={"type": "spc_t"}),
        "spec.securityContext.seLinuxOptions.type",
    ),
    (
        "selinux-user",
        "baseline",
        {},
        with_container(OK, seLinuxOptions={"user": "system_u"}),
        "spec.containers[pulumi].securityContext.seLinuxOptions.user",
    ),
    (
        "proc-mount",
        "baseline",
        {},
        with_container(OK, procMount="Unmasked"),
        "spec.containers[pulumi].securityContext.procMount",
    ),
    (
        "seccomp-unconfined",
        "baseline",
        {},
        with_pod_security(OK, seccompProfile={"type": "Unconfined"}),
        "spec.securityContext.seccompProfile.type",
    ),
    (
        "sysctl",
        "baseline",
        {},
        with_pod_security(OK, sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
        "spec.securityContext.sysctls[0].name",
    ),
    (
        "proc-mount-in-user-namespace",
        "restricted",
        {},
        {**with_container(OK, procMount="Unmasked"), "hostUsers": False},
        "spec.containers[pulumi].securityContext.procMount",
    ),
    (
        "volume-nfs",
        "restricted",
        {},
        restricted_pod(volumes=[{"name": "share", "nfs": {"server": "nfs", "path": "/"}}]),
        "spec.volumes[share].nfs",
    ),
    (
        "privilege-escalation-unset",
        "restricted",
        {},
        restricted_pod(
            containers=[{"name": "pulumi", "securityContext": {"capabilities": {"drop": ["ALL"]}}}]
        ),
        "spec.containers[pulumi].securityContext.allowPrivilegeEscalation",
    ),
    (
        "run-as-non-root-false",
        "restricted",
        {},
        with_container(OK, runAsNonRoot=False),
        "spec.containers[pulumi].securityContext.runAsNonRoot",
    ),
    (
        "run-as-non-root-unset",
        "restricted",
        {},
        restricted_pod(securityContext={"seccompProfile": {"type": "RuntimeDefault"}}),
        "spec.containers[pulumi].securityContext.runAsNonRoot",
    ),
    (
        "run-as-user-root",
        "restricted",
        {},
        with_pod_security(OK, runAsUser=0),
        "spec.securityContext.runAsUser",
    ),
    (
        "seccomp-unset",
        "restricted",
        {},
        restricted_pod(securityContext={"runAsNonRoot": True}),
        "spec.containers[pulumi].securityContext.seccompProfile.type",
    ),
    (
        "capabilities-not-dropped",
        "restricted",
        {},
        with_container(OK, capabilities={}),
        "spec.containers[pulumi].securityContext.capabilities.drop",
    ),
    (
        "capability-default-set",
        "restricted",
        {},
        with_container(OK, capabilities={"drop": ["ALL"], "add": ["CHOWN"]}),
        "spec.containers[pulumi].securityContext.capabilities.add",
    ),
    (
        "init-container-not-hardened",
        "restricted",
        {},
        with_init(
            OK,
            {
                "name": "extra",
                "image": "busybox",
                "securityContext": {"capabilities": {"drop": ["ALL"]}},
            },
        ),
        "spec.initContainers[extra].securityContext.allowPrivilegeEscalation",
    ),
]


def _above(level: Level) -> list[Level]:
    return list(LEVELS[LEVELS.index(level) :])


@pytest.mark.parametrize(
    ("metadata", "spec", "level", "field"),
    [pytest.param(m, s, lv, f, id=case) for case, lv, m, s, f in CASES],
)
def test_each_control_refuses_from_its_level(
    metadata: JSON, spec: JSON, level: Level, field: str
) -> None:
    for judged in LEVELS:
        violations = check_pod(metadata, spec, judged)
        fields = [v.field for v in violations]
        if judged == level:
            assert fields == [field]
            assert field in str(violations[0]) and repr(level) in str(violations[0])
        elif judged in _above(level):
            assert field in fields, judged  # a stricter level may find more
        else:
            assert fields == [], judged


def test_every_control_has_a_case() -> None:
    names = {(c.name, c.level) for c in CONTROLS}
    covered = set()
    for _, level, metadata, spec, _ in CASES:
        for violation in check_pod(metadata, spec, level):
            covered.add((violation.control, violation.level))
    assert names == covered


@pytest.mark.parametrize("level", LEVELS)
def test_compliant_pods_pass(level: Level) -> None:
    assert check_pod({}, OK, level) == []
    # Allowed values of each control.
    allowed = restricted_pod(
        hostNetwork=False,
        volumes=[
            {"name": "cache", "emptyDir": {}},
            {"name": "token", "projected": {"sources": []}},
            {"name": "creds", "secret": {"secretName": "x"}},
        ],
        securityContext={
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
            "seLinuxOptions": {"type": "container_t", "level": "s0:c1"},
            "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
            "appArmorProfile": {"type": "RuntimeDefault"},
        },
    )
    allowed = with_container(
        allowed, capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}, procMount="Default"
    )
    annotations = {"container.apparmor.security.beta.kubernetes.io/pulumi": "runtime/default"}
    assert check_pod({"annotations": annotations}, allowed, level) == []


def test_baseline_allows_the_default_minimal_pod() -> None:
    # What a plain `kubectl run` gives: no security context at all.
    assert check_pod({}, {"containers": [{"name": "c", "image": "x"}]}, "baseline") == []
    assert check_pod({}, {"containers": [{"name": "c", "image": "x"}]}, "restricted") != []


def test_user_namespaces_relax_root_and_proc_mount_like_the_standard() -> None:
    pod = with_container(OK, runAsNonRoot=False, runAsUser=0, procMount="Unmasked")
    pod["hostUsers"] = False
    assert check_pod({}, pod, "baseline") == []
    # At restricted, only the /proc mount stays forbidden.
    assert [v.control for v in check_pod({}, pod, "restricted")] == ["/proc Mount Type"]


def test_windows_pods_are_exempt_from_linux_only_restricted_controls() -> None:
    pod = {
        "os": {"name": "windows"},
        "securityContext": {"runAsNonRoot": True},
        "containers": [{"name": "c", "image": "x"}],
    }
    assert check_pod({}, pod, "restricted") == []


def test_restricted_replaces_baseline_controls_so_each_fault_is_reported_once() -> None:
    pod = restricted_pod(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    assert [v.control for v in check_pod({}, pod, "restricted")] == ["Volume Types"]
    names = [c.name for c in controls_for("restricted")]
    assert len(names) == len(set(names))


def test_malformed_values_are_not_trusted() -> None:
    assert check_pod({}, restricted_pod(hostPID="yes"), "baseline") != []
    assert check_pod({}, with_container(OK, privileged=1), "baseline") != []
    # Containers that are not objects are judged as empty containers, never skipped.
    assert check_pod({}, {"containers": ["junk"]}, "restricted") != []


def test_docs_list_every_control_and_allowed_value() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    rows = re.findall(r"^\| ([^|`]+?) \| (baseline|restricted)\b", text, flags=re.MULTILINE)
    assert set(rows) == {(c.name, c.level) for c in CONTROLS}
    for value in (*SAFE_SYSCTLS, *BASELINE_CAPABILITIES, *RESTRICTED_VOLUME_TYPES):
        assert f"`{value}`" in text, value
    for kind in SELINUX_TYPES - {""}:
        assert f"`{kind}`" in text, kind
