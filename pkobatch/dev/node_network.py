"""The real node's network: a network namespace of its own, joined to the host by one veth
pair, holding the pod bridge and everything kube-proxy writes.

::

    host namespace                          node namespace (/run/netns/pkobatch-<id>)
    kube-apiserver on HOST_ADDRESS:port     containerd, kubelet, kube-proxy (iptables)
    pkb<id> HOST_ADDRESS/30  ──── veth ────  eth0 NODE_ADDRESS/30
                                             cni0 10.244.0.1/24 ── pods 10.244.0.0/24

The link network is the first ``10.243.<n>.0/30`` that no host route overlaps (another
environment's link included), chosen under a lock; the pod network (``POD_CIDR``) and the
Service network (``SERVICE_CIDR``, the API server's) exist only inside the node namespace,
so several environments on one host never meet. The API server listens on HOST_ADDRESS —
its ``kubernetes`` Service's endpoint — which pods reach through kube-proxy's rules and the
bridge plugin's masquerade (so the host needs no route back). The node namespace has no
default route and the host forwards nothing for it: no pod packet leaves the machine.

Removing the namespace removes the bridge, the veth pair and every iptables rule with it.
Names derive from the state directory, so a start finds and removes what a killed
environment of the same directory left.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

POD_CIDR: Final = "10.244.0.0/24"
SERVICE_CIDR: Final = "10.96.0.0/24"
LINK_RANGE: Final = ipaddress.IPv4Network("10.243.0.0/16")
NODE_INTERFACE: Final = "eth0"
_NETNS_DIR: Final = Path("/run/netns")
_LOCK: Final = Path("/run/lock/pkobatch-node-network.lock")
# Inside the node namespace: it routes between the pod bridge and its uplink, and bridged
# pod-to-Service-to-pod traffic passes kube-proxy's iptables rules.
_SYSCTLS: Final = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
}


class NodeNetworkError(Exception):
    """The node network cannot be made; the message says why and what to do."""


def _run(argv: Sequence[str]) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NodeNetworkError(
            f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def environment_id(state_dir: Path) -> str:
    """Eight hex digits naming what the environment of ``state_dir`` creates on the host."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class NodeNetwork:
    netns: str
    host_interface: str
    host_address: str
    node_address: str
    pod_cidr: str = POD_CIDR

    @property
    def netns_path(self) -> Path:
        return _NETNS_DIR / self.netns

    def inside(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the node namespace (only the network namespace changes: the
        node's processes share the host's mounts and cgroups)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _host_routes() -> list[ipaddress.IPv4Network]:
    routes = json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]")
    found: list[ipaddress.IPv4Network] = []
    for route in routes:
        destination = route.get("dst", "default")
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):
            found.append(ipaddress.IPv4Network(destination, strict=False))
    return found


def _free_link() -> ipaddress.IPv4Network:
    taken = _host_routes()
    for block in LINK_RANGE.subnets(new_prefix=24):
        link = ipaddress.IPv4Network((block.network_address, 30))  # 10.243.<n>.0/30
        if not any(link.overlaps(route) for route in taken):
            return link
    raise NodeNetworkError(
        f"every link network in {LINK_RANGE} overlaps a host route; remove stale "
        "environments (`ip netns list` shows pkobatch-* namespaces)"
    )


def remove_node_network(netns: str, host_interface: str) -> None:
    """Remove the node namespace ``netns`` (its bridge, veth and iptables rules go with
    it) and ``host_interface``; nothing if neither exists. The veth goes first: the
    kernel dismantles a deleted namespace's interfaces later, in the background."""
    if Path("/sys/class/net", host_interface).exists():
        _run(["ip", "link", "delete", host_interface])
    if (_NETNS_DIR / netns).exists():
        _run(["ip", "netns", "delete", netns])


def node_network_names(state_dir: Path) -> tuple[str, str]:
    """The node namespace and host interface of ``state_dir``'s environment."""
    ident = environment_id(state_dir)
    return f"pkobatch-{ident}", f"pkb{ident}"


def create_node_network(state_dir: Path) -> NodeNetwork:
    """The node namespace of ``state_dir``'s environment, made afresh (what a killed
    environment of the same directory left is removed first)."""
    netns, host_interface = node_network_names(state_dir)
    remove_node_network(netns, host_interface)
    with _host_lock():
        link = _free_link()
        host_address, node_address = (str(link.network_address + i) for i in (1, 2))
        network = NodeNetwork(netns, host_interface, host_address, node_address)
        try:
            _run(["ip", "netns", "add", netns])
            veth = ["ip", "link", "add", host_interface, "type", "veth"]
            _run([*veth, "peer", "name", NODE_INTERFACE, "netns", netns])
            _run(["ip", "addr", "add", f"{host_address}/30", "dev", host_interface])
            _run(["ip", "link", "set", host_interface, "up"])
        except NodeNetworkError:
            remove_node_network(netns, host_interface)
            raise
    try:
        _run(["ip", "-n", netns, "addr", "add", f"{node_address}/30", "dev", NODE_INTERFACE])
        _run(["ip", "-n", netns, "link", "set", NODE_INTERFACE, "up"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        for key, value in _SYSCTLS.items():
            _run(network.inside(["sysctl", "-q", "-w", f"{key}={value}"]))
    except NodeNetworkError:
        remove_node_network(netns, host_interface)
        raise
    return network
