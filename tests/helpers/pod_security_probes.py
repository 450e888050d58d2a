"""Probe pods for the Pod Security check: each breaks exactly one control.

Shared by tests/unit/test_pod_security.py (every control, every level) and
tests/integration/test_controller_security.py (the same pods against the API server's own
Pod Security admission). ``tests`` is on ``sys.path`` through the root conftest.
"""

from __future__ import annotations

import copy
from typing import Any

from pkobatch.api.pod_security import Level

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
        # allowPrivilegeEscalation: false with privileged: true is not a valid pod.
        with_container(OK, privileged=True, allowPrivilegeEscalation=True),
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
