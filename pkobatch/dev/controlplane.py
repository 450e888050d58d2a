"""A local Kubernetes control plane made of the real binaries: etcd, kube-apiserver and
kube-controller-manager (docs/development.md), listening on random free ports on 127.0.0.1 —
or, for the real node (``pkobatch.dev.node``), the API server on the node network's host
address, which pods reach as the ``kubernetes`` Service.

There is no kubelet and no scheduler here: ``pkobatch.dev.node_agent`` runs the Job
controller's pods, or the real node does. Layout of ``state_dir``::

    pki/                 CA, serving cert, admin client cert, service-account key (kept)
    etcd/                etcd data (wiped on every start: each start is a fresh cluster)
    control-plane/*.log  output of etcd, kube-apiserver, kube-controller-manager
    control-plane/audit.log  the API server's audit log of the requests of service accounts
                         of ``pkobatch-system`` (the controller's; JSON lines, one per request
                         as received): what tests count a controller's requests with
    kubeconfig           admin kubeconfig (client certificate in system:masters)

kube-controller-manager may send 200 requests per second (burst 400) instead of its default
20: at thousands of Stacks the Job controller's pod creations and status updates would
otherwise set the pace of every run, and a benchmark would measure that limit instead of
pkobatch.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from pkobatch.dev import processes
from pkobatch.dev.components import ComponentError, Components, unverified_tls
from pkobatch.dev.container_logs import KubeletTls
from pkobatch.dev.kubeconfig import (
    certificate_user,
    kubeconfig,
    request_token,
    service_account_user,
    write_kubeconfig,
)
from pkobatch.dev.pki import ADMIN_USER, Pki, ensure_pki
from pkobatch.dev.tools import Tools, find_tools
from pkobatch.kube.client import CRDS, SERVICEACCOUNTS, Kube, KubeError

CONTROLLERS: Final = (
    "job-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "namespace-controller",
    # Fills the built-in view/edit/admin ClusterRoles from the roles labelled to aggregate
    # into them, as in every real cluster (pkobatch-view and pkobatch-edit).
    "clusterrole-aggregation-controller",
)
FIELD_MANAGER: Final = "pkobatch-dev"
# Unused documentation address (RFC 5737) for hosts without a usable interface address.
_FALLBACK_ADVERTISE_ADDRESS: Final = "192.0.2.10"


COMPONENTS: Final = ("etcd", "kube-apiserver", "kube-controller-manager")
# Whose requests the API server's audit log records: the service accounts of the namespace
# the controller runs in (tests/helpers/controller_harness.py, deploy/kustomize/base).
AUDITED_NAMESPACE: Final = "pkobatch-system"
AUDIT_POLICY: Final = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One line per request, written when it is received (a watch is logged when it starts).
    "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
    "rules": [
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{AUDITED_NAMESPACE}"]},
        {"level": "None"},
    ],
}
KCM_API_QPS: Final = 200
KCM_API_BURST: Final = 400
LOOPBACK: Final = "127.0.0.1"
# The service network when none is given (nothing reaches it without a real node).
DEFAULT_SERVICE_CIDR: Final = "10.0.0.0/24"


class ControlPlaneError(ComponentError):
    """A component failed to start; the message carries the end of its log."""


def repo_root() -> Path | None:
    """The source checkout this package runs from (it has ``scripts/tools.sh``)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "scripts" / "tools.sh").is_file() else None


def default_crds_dir() -> Path | None:
    root = repo_root()
    return root / "crds" if root and (root / "crds").is_dir() else None


def advertise_address() -> str:
    """The host's primary IPv4 address. kube-apiserver refuses loopback and cannot pick one
    itself on a host without a default route; nothing dials it here."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("192.0.2.1", 9))  # UDP: selects a route, sends nothing
        address = str(sock.getsockname()[0])
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    return _FALLBACK_ADVERTISE_ADDRESS


@dataclass(frozen=True)
class Endpoints:
    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    controller_manager_port: int
    apiserver_address: str = LOOPBACK

    @property
    def server(self) -> str:
        return f"https://{self.apiserver_address}:{self.apiserver_port}"

    @property
    def etcd(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"


class ControlPlane:
    """Start with ``start()`` (or as a context manager); ``stop()`` leaves no process behind."""

    def __init__(
        self,
        state_dir: Path,
        tools: Tools | None = None,
        *,
        crds_dir: Path | None = None,
        controllers: Sequence[str] = CONTROLLERS,
        address: str | None = None,
        service_cidr: str = DEFAULT_SERVICE_CIDR,
        authorization_modes: Sequence[str] = ("RBAC",),
    ) -> None:
        """``controllers``: what kube-controller-manager runs (a benchmark of the pkobatch
        controller alone leaves out the job-controller: Jobs are created, no pod ever is).
        ``address``: where the API server listens and which address it advertises (the
        ``kubernetes`` Service's endpoint); by default it listens on loopback and
        advertises the host's primary address, which nothing dials."""
        self.state_dir = state_dir.resolve()
        self.controllers = tuple(controllers)
        self.address = address
        self.service_cidr = service_cidr
        self.authorization_modes = tuple(authorization_modes)
        self.tools = tools or find_tools(("etcd", "kubernetes"))
        self.crds_dir = crds_dir
        self.pki = Pki(self.state_dir / "pki")
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.log_dir = self.state_dir / "control-plane"
        self.audit_log = self.log_dir / "audit.log"
        self.endpoints: Endpoints | None = None
        self._components = Components(self.log_dir, ControlPlaneError)

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        if self.endpoints is None:
            raise RuntimeError("the control plane is not started")
        return self.endpoints.server

    @property
    def ca_file(self) -> Path:
        return self.pki.ca_cert

    @property
    def kubelet_tls(self) -> KubeletTls:
        """What the node agent serves ``pods/log`` with, matching the API server's
        ``--kubelet-*`` flags."""
        return KubeletTls(self.pki.kubelet_cert, self.pki.kubelet_key, self.pki.ca_cert)

    @property
    def pids(self) -> dict[str, int]:
        return self._components.pids

    def start(self, timeout: float = 180.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        advertise = self.address or advertise_address()
        # The `kubernetes` Service's address too: pods verify the API server under it.
        service_ip = str(next(ipaddress.IPv4Network(self.service_cidr).hosts()))
        ensure_pki(self.pki.directory, [LOOPBACK, advertise, service_ip])
        etcd_client, etcd_peer, apiserver, controller_manager = (
            processes.free_port() for _ in range(4)
        )
        self.endpoints = Endpoints(
            etcd_client, etcd_peer, apiserver, controller_manager, self.address or LOOPBACK
        )
        try:
            self._start_etcd(timeout)
            self._start_apiserver(advertise, timeout)
            write_kubeconfig(
                self.kubeconfig,
                kubeconfig(
                    self.server,
                    self.pki.ca_cert.read_bytes(),
                    ADMIN_USER,
                    certificate_user(
                        self.pki.admin_cert.read_bytes(), self.pki.admin_key.read_bytes()
                    ),
                ),
            )
            self._start_controller_manager(timeout)
            kube = self.admin()
            try:
                self._wait_for_default_service_account(kube, timeout)
                if self.crds_dir is not None:
                    install_crds(kube, self.crds_dir, timeout=timeout)
            finally:
                kube.close()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop in reverse order of start; each component gets a grace period to exit."""
        for name in reversed(COMPONENTS):
            self.stop_component(name)

    def check_alive(self) -> None:
        """``ControlPlaneError`` if a component has exited."""
        self._components.check_alive()

    def exited(self) -> dict[str, int]:
        """The exit code of every started component that is no longer running."""
        return self._components.exited()

    # -- one component (fault tests, the dev supervisor) -------------------------------------

    def stop_component(self, name: str, *, kill: bool = False, grace: float = 15.0) -> None:
        """Stop one component: SIGTERM with ``grace`` seconds to exit, or SIGKILL at once with
        ``kill``. Its data (etcd's included) stays; ``start_component`` brings it back."""
        self._components.stop(name, kill=kill, grace=grace)

    def start_component(self, name: str, *, timeout: float = 180.0) -> None:
        """Start a stopped (or crashed) component again with the arguments of its first start
        and wait until it is healthy. Ports, certificates and etcd's data are unchanged, so
        clients keep working once it answers again."""
        self._components.start_again(name, timeout=timeout)

    def restart_component(
        self, name: str, *, kill: bool = False, down_seconds: float = 0.0, timeout: float = 180.0
    ) -> None:
        """Stop one component (SIGKILL with ``kill``), keep it down for ``down_seconds`` and
        start it again with the same arguments; returns once it is healthy."""
        self.stop_component(name, kill=kill)
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start_component(name, timeout=timeout)

    # -- clients --------------------------------------------------------------------------

    def admin(self) -> Kube:
        return Kube.connect(str(self.kubeconfig))

    def service_account_kubeconfig(
        self,
        namespace: str,
        service_account: str,
        path: Path,
        *,
        expiration_seconds: int = 3600,
    ) -> Path:
        """Write a kubeconfig authenticating as ``namespace/service_account`` to ``path``."""
        kube = self.admin()
        try:
            token = request_token(
                kube, namespace, service_account, expiration_seconds=expiration_seconds
            )
        finally:
            kube.close()
        return write_kubeconfig(
            path,
            kubeconfig(
                self.server,
                self.pki.ca_cert.read_bytes(),
                service_account_user(namespace, service_account),
                {"token": token},
            ),
        )

    # -- components -----------------------------------------------------------------------

    def _start_etcd(self, timeout: float) -> None:
        assert self.endpoints is not None
        data = self.state_dir / "etcd"
        shutil.rmtree(data, ignore_errors=True)
        peer = f"http://127.0.0.1:{self.endpoints.etcd_peer_port}"
        self._components.start_http(
            "etcd",
            [
                self.tools.binary("etcd", "etcd"),
                "--name=pkobatch-dev",
                f"--data-dir={data}",
                f"--listen-client-urls={self.endpoints.etcd}",
                f"--advertise-client-urls={self.endpoints.etcd}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=pkobatch-dev={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            f"{self.endpoints.etcd}/health",
            None,
            timeout,
        )

    def _start_apiserver(self, advertise: str, timeout: float) -> None:
        assert self.endpoints is not None
        pki = self.pki
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        audit_policy = self.log_dir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._components.start_http(
            "kube-apiserver",
            [
                self.tools.binary("kubernetes", "kube-apiserver"),
                f"--etcd-servers={self.endpoints.etcd}",
                f"--bind-address={self.endpoints.apiserver_address}",
                f"--secure-port={self.endpoints.apiserver_port}",
                f"--advertise-address={advertise}",
                f"--cert-dir={pki.directory}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                # pods/log goes to the node agent's container-log endpoint, as to a kubelet.
                f"--kubelet-client-certificate={pki.kubelet_client_cert}",
                f"--kubelet-client-key={pki.kubelet_client_key}",
                f"--kubelet-certificate-authority={pki.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--authorization-mode={','.join(self.authorization_modes)}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.service_account_public_key}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--allow-privileged=true",
                # Less background work on small CI machines; nothing here depends on them.
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxbackup=1",
            ],
            f"{self.server}/readyz",
            context,
            timeout,
        )

    def _start_controller_manager(self, timeout: float) -> None:
        assert self.endpoints is not None
        pki = self.pki
        certs = self.state_dir / "control-plane" / "kcm-certs"
        certs.mkdir(parents=True, exist_ok=True)
        self._components.start_http(
            "kube-controller-manager",
            [
                self.tools.binary("kubernetes", "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(self.controllers)}",
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                f"--kube-api-qps={KCM_API_QPS}",
                f"--kube-api-burst={KCM_API_BURST}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.endpoints.controller_manager_port}",
                f"--cert-dir={certs}",
                "--profiling=false",
            ],
            f"https://127.0.0.1:{self.endpoints.controller_manager_port}/healthz",
            unverified_tls(),
            timeout,
        )

    def _wait_for_default_service_account(self, kube: Kube, timeout: float) -> None:
        # The serviceaccount controller creates it; pods need it unless they name another.
        def present() -> bool:
            self.check_alive()
            return kube.get_or_none(SERVICEACCOUNTS, "default", "default") is not None

        processes.wait_until(present, timeout=timeout, what="the default ServiceAccount")


def install_crds(kube: Kube, crds_dir: Path, *, timeout: float = 60.0) -> list[str]:
    """Apply every CustomResourceDefinition in ``crds_dir/*.yaml`` and wait until each is
    Established; the names installed."""
    names: list[str] = []
    for path in sorted(crds_dir.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not document or document.get("kind") != "CustomResourceDefinition":
                continue
            try:
                kube.apply(CRDS, document, field_manager=FIELD_MANAGER)
            except KubeError as exc:
                raise ControlPlaneError(f"{path} was rejected by the API server: {exc}") from exc
            names.append(str(document["metadata"]["name"]))

    def established() -> bool:
        for name in names:
            conditions = (kube.get(CRDS, name).get("status") or {}).get("conditions") or []
            if not any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            ):
                return False
        return True

    processes.wait_until(established, timeout=timeout, what=f"CRDs {names} to be Established")
    return names
