"""A real Kubernetes node beside the local control plane: containerd with the host's runc,
kubelet, kube-proxy (iptables mode) and kube-scheduler, built by ``scripts/tools.sh node
containerd cni_plugins crictl`` (docs/development.md). Pods are scheduled on their requests
and run in real containers: their image, user, security context, limits and volumes apply.

containerd, kubelet and kube-proxy run in the node's network namespace
(``pkobatch.dev.node_network``; only the network namespace: they share the host's mounts
and cgroups), kube-scheduler on the host. Each authenticates with a client certificate of
the control plane's CA (``system:node:<name>`` in ``system:nodes``, ``system:kube-proxy``,
``system:kube-scheduler``), so the API server's Node authorizer and RBAC apply as on a
cluster. No registry is reachable: the sandbox image (upstream's ``pause``, built with the
node) and any other image are imported (``import_image``) into containerd's ``k8s.io``
namespace, where pods with ``imagePullPolicy: IfNotPresent`` or ``Never`` find them.

What this host needs, and how it is set: cgroup v1 works only with the kubelet's
``failCgroupV1: false`` (v1.35+, KEP-5573); the cgroup driver is ``cgroupfs`` (no systemd
manages cgroups here) in both containerd and the kubelet; swap is not refused
(``failSwapOn: false``) and never used by pods (``NoSwap``); no DNS server is given to pods
(``resolvConf: ""``), so nothing resolves names outside the node; eviction thresholds are
low so a full shared disk does not taint the node. The kubelet sets the kernel settings it
sets on any node (``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``,
...) on the host.

Layout: ``<state>/node/`` (emptied at each start: a fresh node, as etcd's data makes a fresh
cluster) holds the configuration, certificates, logs (``logs/*.log``), the kubelet's root
directory, containerd's root and state (its images too: import them after each start), the
CNI configuration and its address allocations, and the pods' logs. Sockets live in
``/run/pkobatch-node/<id>/`` (containerd wants its shims' socket directory under 42
characters), runc's state there too; the pods' cgroups under ``/pkobatch-<id>`` of each
cgroup hierarchy. ``stop()`` removes the pods, then
the processes, mounts, cgroups and the runtime directory (``remove_node_leftovers``), which
a start, and ``pkobatch dev down``, also run for what a killed environment of the same state
directory left.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from pkobatch.dev import processes
from pkobatch.dev.components import ComponentError, Components, unverified_tls
from pkobatch.dev.controlplane import ControlPlane
from pkobatch.dev.kubeconfig import certificate_user, kubeconfig, write_kubeconfig
from pkobatch.dev.node_network import NodeNetwork, environment_id
from pkobatch.dev.oci import (
    ImageConfig,
    LayerEntry,
    cached_archive,
    go_arch,
    write_oci_archive,
)
from pkobatch.dev.pki import client_certificate, write_serving_certificate
from pkobatch.dev.tools import Tools, versions
from pkobatch.kube.client import NODES, PODS, Kube

log = logging.getLogger("pkobatch.dev")

NODE_NAME: Final = "pkobatch-node"
NODE_CONTROLLERS: Final = (
    # Removes the not-ready taint a new Node gets once it reports Ready.
    "node-lifecycle-controller",
    # Endpoints of Services for kube-proxy (the API server keeps `kubernetes`'s itself).
    "endpointslice-controller",
    # kube-root-ca.crt in every namespace: the CA of a pod's projected ServiceAccount token.
    "root-ca-certificate-publisher-controller",
    # Binds PersistentVolumeClaims to PersistentVolumes (hostPath volumes on this node).
    "persistentvolume-binder-controller",
    # Deployments' pods, as pkobatch's own install (its controller is a Deployment) and the
    # programs' workloads need.
    "deployment-controller",
    "replicaset-controller",
)
PAUSE_IMAGE: Final = f"registry.k8s.io/pause:{versions()['PAUSE_VERSION']}"
KUBELET_PORT: Final = 10250
KUBELET_HEALTHZ_PORT: Final = 10248
KUBE_PROXY_HEALTHZ_PORT: Final = 10256
CRI_NAMESPACE: Final = "k8s.io"
_RUNTIME_ROOT: Final = Path("/run/pkobatch-node")
_CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
_MNT_DETACH: Final = 2
# A unix socket path has room for 107 bytes; the kubelet listens on this one under its root.
_KUBELET_SOCKET: Final = "device-plugins/kubelet.sock"
_SOCKET_PATH_MAX: Final = 107


class NodeError(ComponentError):
    """A node component failed to start, or the host lacks what the node needs; the message
    says which and what to do."""


def find_runc() -> str:
    """The host's runc (the Debian package ``runc``)."""
    found = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    if found is None:
        raise NodeError("runc is not installed: apt-get install runc")
    return found


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: each v1 controller's, the named and the unified ones
    under /sys/fs/cgroup, or /sys/fs/cgroup itself on a v2-only host."""
    if (_CGROUP_ROOT / "cgroup.procs").exists():
        return [_CGROUP_ROOT]
    return sorted(
        entry
        for entry in _CGROUP_ROOT.iterdir()
        if not entry.is_symlink() and (entry / "cgroup.procs").exists()
    )


def _unescape_mount_path(text: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)


def _mount_points_under(roots: list[Path]) -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(_unescape_mount_path(line.split()[4]))
        if any(point == root or root in point.parents for root in roots):
            found.append(point)
    return found


@dataclass(frozen=True)
class NodePaths:
    """Where the real node of the environment in ``state_dir`` keeps what it creates."""

    state_dir: Path

    @property
    def ident(self) -> str:
        return environment_id(self.state_dir)

    @property
    def directory(self) -> Path:
        return self.state_dir / "node"

    @property
    def runtime_dir(self) -> Path:
        return _RUNTIME_ROOT / self.ident

    @property
    def containerd_socket(self) -> Path:
        return self.runtime_dir / "containerd.sock"

    @property
    def cgroup_name(self) -> str:
        return f"pkobatch-{self.ident}"


def ctr_command(tools: Tools, socket: Path, *args: str) -> list[str]:
    """A ``ctr`` command line against the containerd at ``socket``, namespace ``k8s.io``
    (the one the kubelet's pods find their images in)."""
    return [
        tools.binary("containerd", "ctr"),
        f"--address={socket}",
        f"--namespace={CRI_NAMESPACE}",
        *args,
    ]


def import_image(tools: Tools, socket: Path, archive: Path) -> str:
    """Import an OCI or Docker image archive into the containerd at ``socket`` (namespace
    ``k8s.io``, unpacked for its snapshotter) under the names the archive gives; what ``ctr``
    reports."""
    platform = f"--platform=linux/{go_arch()}"
    result = subprocess.run(
        ctr_command(tools, socket, "images", "import", "--local", platform, str(archive)),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise NodeError(
            f"importing {archive} into the node's containerd failed: "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout


def remove_node_leftovers(state_dir: Path) -> None:
    """Remove what the real node of ``state_dir`` (running no more, or killed) left: shim
    and container processes, mounts under its directories, its cgroups and runtime
    directory. Nothing happens to what is not its own."""
    paths = NodePaths(state_dir.resolve())
    _kill_shims(paths.runtime_dir)
    _remove_cgroups(paths.cgroup_name)
    libc = ctypes.CDLL(None, use_errno=True)
    mounts = _mount_points_under([paths.directory, paths.runtime_dir])
    for point in sorted(mounts, key=lambda p: len(p.parts), reverse=True):
        if libc.umount2(str(point).encode(), _MNT_DETACH) != 0:
            log.warning("cannot unmount %s: %s", point, os.strerror(ctypes.get_errno()))
    shutil.rmtree(paths.runtime_dir, ignore_errors=True)


def _kill_shims(runtime_dir: Path) -> None:
    # A shim outlives containerd by design; its command line names containerd's socket.
    marker = str(runtime_dir).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def _groups_under(hierarchy: Path, name: str) -> list[Path]:
    """Cgroup ``/name`` of ``hierarchy`` and every group below it, deepest first."""
    top = hierarchy / name
    if not top.is_dir():
        return []
    groups = sorted(
        (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    )
    return [*groups, top]


def _kill_group(group: Path) -> None:
    for pid in (group / "cgroup.procs").read_text().split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(name: str, attempts: int = 50) -> None:
    """Kill every process in cgroup ``/name`` (and below) of each hierarchy and remove the
    groups, deepest first."""
    for hierarchy in _cgroup_hierarchies():
        for group in _groups_under(hierarchy, name):
            for _ in range(attempts):
                _kill_group(group)
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)  # killed processes leave their group a moment later
            else:
                log.warning("cannot remove cgroup %s", group)


def _make_cgroups(name: str) -> None:
    for hierarchy in _cgroup_hierarchies():
        group = hierarchy / name
        group.mkdir(exist_ok=True)
        # A v1 cpuset group takes no task until it has CPUs and memory nodes.
        for setting in ("cpuset.cpus", "cpuset.mems"):
            if (group / setting).exists() and not (group / setting).read_text().strip():
                (group / setting).write_text((hierarchy / setting).read_text())


class RealNode:
    """Start with ``start()``; ``stop()`` leaves no process, mount, cgroup or socket."""

    def __init__(
        self,
        control_plane: ControlPlane,
        network: NodeNetwork,
        tools: Tools,
        *,
        max_pods: int = 110,
        node_name: str = NODE_NAME,
    ) -> None:
        self.control_plane = control_plane
        self.network = network
        self.tools = tools
        self.max_pods = max_pods
        self.node_name = node_name
        self.paths = NodePaths(control_plane.state_dir)
        self.directory = self.paths.directory
        self.runtime_dir = self.paths.runtime_dir
        self.cgroup_name = self.paths.cgroup_name
        self.kubelet_dir = self.directory / "kubelet"
        self.pod_log_dir = self.directory / "pod-logs"
        self.log_dir = self.directory / "logs"
        self._components = Components(self.log_dir, NodeError)
        self._kube: Kube | None = None

    # -- paths ------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.paths.containerd_socket

    @property
    def cri_endpoint(self) -> str:
        return f"unix://{self.containerd_socket}"

    @property
    def pids(self) -> dict[str, int]:
        return self._components.pids

    def crictl(self, *args: str) -> list[str]:
        return [
            self.tools.binary("crictl", "crictl"),
            f"--runtime-endpoint={self.cri_endpoint}",
            f"--image-endpoint={self.cri_endpoint}",
            "--timeout=60s",
            *args,
        ]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        socket_path = self.kubelet_dir / _KUBELET_SOCKET
        if len(str(socket_path)) > _SOCKET_PATH_MAX:
            raise NodeError(
                f"the state directory {self.control_plane.state_dir} is too long for the "
                f"kubelet's sockets ({socket_path} exceeds {_SOCKET_PATH_MAX} bytes); "
                "use a shorter --state-dir"
            )
        runc = find_runc()
        remove_node_leftovers(self.paths.state_dir)
        # Each start is a fresh node, as each start of the control plane is a fresh cluster.
        shutil.rmtree(self.directory, ignore_errors=True)
        started = time.monotonic()
        try:
            _make_cgroups(self.cgroup_name)
            self.directory.mkdir(parents=True, exist_ok=True)
            self.runtime_dir.mkdir(parents=True, mode=0o700)
            self._kube = self.control_plane.admin()
            self._start_containerd(runc, timeout)
            self.import_image(self._pause_archive())
            self._start_kubelet(timeout)
            self._start_kube_proxy(timeout)
            self._start_scheduler(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("real node %s ready in %.1fs", self.node_name, time.monotonic() - started)

    def stop(self) -> None:
        """Stop the scheduler, kube-proxy and kubelet, remove every pod sandbox (its
        containers stop, its network is torn down), stop containerd, then remove what is
        left (``remove_node_leftovers``)."""
        for name in ("kube-scheduler", "kube-proxy", "kubelet"):
            self._components.stop(name)
        if "containerd" in self._components.pids:
            removed = subprocess.run(
                self.crictl("rmp", "--all", "--force"),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if removed.returncode != 0:
                log.warning("removing the pods failed: %s", removed.stderr.strip())
            self._components.stop("containerd")
        if self._kube is not None:
            self._kube.close()
            self._kube = None
        remove_node_leftovers(self.paths.state_dir)

    def restart_runtime(self, timeout: float = 180.0) -> None:
        """Stop the kubelet and containerd (SIGTERM) and start both again with the same
        configuration, as an upgrade of a node's runtime does: the containers' shims run in
        process groups of their own and keep the containers running meanwhile."""
        self._components.stop("kubelet")
        self._components.stop("containerd")
        self._components.start_again("containerd", timeout=timeout)
        self._components.start_again("kubelet", timeout=timeout)
        processes.wait_until(
            self._node_ready, timeout=timeout, what=f"Node {self.node_name} to be Ready again"
        )

    def crash_runtime(self, timeout: float = 180.0) -> None:
        """What a reboot does to the node's runtime: stop the kubelet and containerd, kill
        every shim and every process of the node's pods (SIGKILL), and start containerd and
        the kubelet again; the pods' sandboxes and containers are gone."""
        self._components.stop("kubelet")
        self._components.stop("containerd")
        _kill_shims(self.runtime_dir)
        for hierarchy in _cgroup_hierarchies():
            for group in _groups_under(hierarchy, self.cgroup_name):
                _kill_group(group)
        self._components.start_again("containerd", timeout=timeout)
        self._components.start_again("kubelet", timeout=timeout)
        processes.wait_until(
            self._node_ready, timeout=timeout, what=f"Node {self.node_name} to be Ready again"
        )

    def exited(self) -> dict[str, int]:
        return self._components.exited()

    def running(self) -> list[str]:
        """``namespace/name`` of the pods running on this node now."""
        if self._kube is None:
            return []
        pods, _ = self._kube.list_objects(
            PODS, field_selector=f"spec.nodeName={self.node_name},status.phase=Running"
        )
        return sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods)

    # -- images -------------------------------------------------------------------------------

    def import_image(self, archive: Path) -> None:
        """Import an OCI or Docker image archive (``import_image``)."""
        import_image(self.tools, self.containerd_socket, archive)

    def _pause_archive(self) -> Path:
        pause = Path(self.tools.binary("node", "pause"))
        return cached_archive(
            "pause",
            [PAUSE_IMAGE.encode(), pause.read_bytes()],
            lambda path: write_oci_archive(
                path,
                PAUSE_IMAGE,
                [LayerEntry("pause", mode=0o755, source=pause)],
                # As upstream's Dockerfile: the sandbox's process runs as nobody.
                ImageConfig(entrypoint=["/pause"], user="65535:65535", env=()),
            ),
        )

    # -- components -----------------------------------------------------------------------------

    def _kubeconfig(self, name: str, user: str, group: str | None = None) -> Path:
        cert, key = client_certificate(self.control_plane.pki, user, group)
        return write_kubeconfig(
            self.directory / f"{name}.kubeconfig",
            kubeconfig(
                self.control_plane.server,
                self.control_plane.ca_file.read_bytes(),
                user,
                certificate_user(cert, key),
            ),
        )

    def _write(self, name: str, text: str) -> Path:
        path = self.directory / name
        path.write_text(text)
        return path

    def _start_containerd(self, runc: str, timeout: float) -> None:
        cni_conf = self.directory / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-pkobatch.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = self._write("containerd.toml", self._containerd_config(runc, cni_conf))
        self._components.start(
            "containerd",
            self.network.inside(
                [self.tools.binary("containerd", "containerd"), f"--config={config}"]
            ),
            self._containerd_ready,
            f"containerd's CRI at {self.cri_endpoint}",
            timeout,
        )

    def _containerd_ready(self) -> bool:
        probe = subprocess.run(
            self.crictl("info"), capture_output=True, text=True, timeout=30, check=False
        )
        return probe.returncode == 0

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "pkobatch",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    # Pod traffic to the host (the API server) leaves with the node's
                    # address, so the host needs no route to the pod network.
                    "ipMasq": True,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.network.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.directory / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _containerd_config(self, runc: str, cni_conf: Path) -> str:
        def q(value: object) -> str:
            return json.dumps(value)

        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        return "\n".join(
            [
                "version = 4",
                f"root = {q(str(self.directory / 'containerd' / 'root'))}",
                f"state = {q(str(self.directory / 'containerd' / 'state'))}",
                "imports = []",
                # NRI's socket and /opt/containerd are host-wide: one containerd each.
                "disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.opt']",
                "[plugins.'io.containerd.server.v1.grpc']",
                f"  address = {q(str(self.containerd_socket))}",
                "[plugins.'io.containerd.server.v1.ttrpc']",
                f"  address = {q(str(self.containerd_socket) + '.ttrpc')}",
                "[plugins.'io.containerd.shim.v1.manager']",
                f"  socket_dir = {q(str(self.runtime_dir / 's'))}",
                "[plugins.'io.containerd.cri.v1.images']",
                "  snapshotter = 'overlayfs'",
                "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
                f"  sandbox = {q(PAUSE_IMAGE)}",
                f"[{runtime}]",
                "  netns_mounts_under_state_dir = true",
                # Without CAP_SYS_RESOURCE (this host's root lacks it) no process may lower
                # its OOM score below its parent's: containers keep at least containerd's.
                "  restrict_oom_score_adj = true",
                "  cdi_spec_dirs = []",
                f"[{runtime}.cni]",
                f"  bin_dirs = [{q(str(self.tools.bin_dir('cni_plugins')))}]",
                f"  conf_dir = {q(str(cni_conf))}",
                f"[{runtime}.containerd.runtimes.runc]",
                "  runtime_type = 'io.containerd.runc.v2'",
                # Not a shim found on PATH: Debian's containerd package brings an older one.
                f"  runtime_path = {q(self.tools.binary('containerd', 'containerd-shim-runc-v2'))}",
                f"[{runtime}.containerd.runtimes.runc.options]",
                f"  BinaryName = {q(runc)}",
                f"  Root = {q(str(self.runtime_dir / 'runc'))}",
                "  SystemdCgroup = false",
                "[plugins.'io.containerd.grpc.v1.cri']",
                "  stream_server_address = '127.0.0.1'",
                "  stream_server_port = '0'",
                "",
            ]
        )

    def _start_kubelet(self, timeout: float) -> None:
        pki = self.directory / "pki"
        pki.mkdir(exist_ok=True)
        write_serving_certificate(
            self.control_plane.pki,
            self.node_name,
            [self.network.node_address],
            pki / "kubelet.crt",
            pki / "kubelet.key",
        )
        kubeconfig_path = self._kubeconfig(
            "kubelet", f"system:node:{self.node_name}", "system:nodes"
        )
        config = self._write("kubelet.yaml", yaml.safe_dump(self._kubelet_config(pki)))
        self._components.start_http(
            "kubelet",
            self.network.inside(
                [
                    self.tools.binary("node", "kubelet"),
                    f"--config={config}",
                    f"--kubeconfig={kubeconfig_path}",
                    f"--root-dir={self.kubelet_dir}",
                    f"--hostname-override={self.node_name}",
                    f"--node-ip={self.network.node_address}",
                    "--v=1",
                ]
            ),
            f"http://{self.network.node_address}:{KUBELET_HEALTHZ_PORT}/healthz",
            None,
            timeout,
        )
        processes.wait_until(
            self._node_ready, timeout=timeout, what=f"Node {self.node_name} to be Ready"
        )

    def _node_ready(self) -> bool:
        self._components.check_alive()
        assert self._kube is not None
        node = self._kube.get_or_none(NODES, self.node_name)
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        taints = ((node or {}).get("spec") or {}).get("taints") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        # The node-lifecycle controller lifts the not-ready taint shortly after.
        return ready and not taints

    def _kubelet_config(self, pki: Path) -> dict[str, Any]:
        address = self.network.node_address
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_name}",
            "containerRuntimeEndpoint": self.cri_endpoint,
            "imageServiceEndpoint": self.cri_endpoint,
            "address": address,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": address,
            "healthzPort": KUBELET_HEALTHZ_PORT,
            "tlsCertFile": str(pki / "kubelet.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.control_plane.ca_file)},
            },
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False,
            "memorySwap": {"swapBehavior": "NoSwap"},
            "resolvConf": "",
            "clusterDomain": "cluster.local",
            "podLogsDir": str(self.pod_log_dir),
            "maxPods": self.max_pods,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            # Imported images cannot be pulled again: never collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "staticPodPath": "",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
        }

    def _start_kube_proxy(self, timeout: float) -> None:
        kubeconfig_path = self._kubeconfig("kube-proxy", "system:kube-proxy")
        address = self.network.node_address
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig_path)},
            "hostnameOverride": self.node_name,
            "bindAddress": address,
            "healthzBindAddress": f"{address}:{KUBE_PROXY_HEALTHZ_PORT}",
            "metricsBindAddress": "127.0.0.1:10249",
            "clusterCIDR": self.network.pod_cidr,
            "detectLocalMode": "ClusterCIDR",
            # Leave the host's conntrack table settings alone (not all are per namespace).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        path = self._write("kube-proxy.yaml", yaml.safe_dump(config))
        self._components.start_http(
            "kube-proxy",
            self.network.inside([self.tools.binary("node", "kube-proxy"), f"--config={path}"]),
            f"http://{address}:{KUBE_PROXY_HEALTHZ_PORT}/healthz",
            None,
            timeout,
        )

    def _start_scheduler(self, timeout: float) -> None:
        kubeconfig_path = self._kubeconfig("kube-scheduler", "system:kube-scheduler")
        port = processes.free_port()
        certs = self.directory / "kube-scheduler-certs"
        certs.mkdir(exist_ok=True)
        self._components.start_http(
            "kube-scheduler",
            [
                self.tools.binary("node", "kube-scheduler"),
                f"--kubeconfig={kubeconfig_path}",
                f"--authentication-kubeconfig={kubeconfig_path}",
                f"--authorization-kubeconfig={kubeconfig_path}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={certs}",
                "--profiling=false",
            ],
            f"https://127.0.0.1:{port}/healthz",
            unverified_tls(),
            timeout,
        )
