"""The one way a local environment starts: the control plane, then what runs the Job
controller's pods — the node agent (pods as local processes), or the real node (kubelet,
containerd, kube-proxy, kube-scheduler: ``pkobatch.dev.node``) in a network of its own
created first — stopped in reverse order. ``pkobatch dev`` (the supervisor), the tests'
``cluster`` fixtures and ``bench/fanout.py`` all start it through ``dev_environment``, and
run the controller as a process with the command line of ``controller_argv``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from pkobatch.dev.controlplane import CONTROLLERS, ControlPlane
from pkobatch.dev.node import NODE_CONTROLLERS, RealNode
from pkobatch.dev.node_agent import NodeAgent
from pkobatch.dev.node_network import SERVICE_CIDR, create_node_network, remove_node_network
from pkobatch.dev.tools import Tools
from pkobatch.kube.client import Kube

log = logging.getLogger("pkobatch.dev")

# ``PKOBATCH_JOB__COMMAND`` of a controller whose Jobs the node agent runs on this host: the
# runner of this checkout, with this interpreter.
LOCAL_JOB_COMMAND: Final = f"{sys.executable},-m,pkobatch.main,job,run"
NodeKind = Literal["agent", "real"]
NODE_KINDS: Final[tuple[NodeKind, ...]] = ("agent", "real")


Stops = list[tuple[str, Callable[[], object]]]
"""What to undo, first to last: each start puts its undo at the front."""


@dataclass(frozen=True)
class DevEnvironment:
    control_plane: ControlPlane
    agent: NodeAgent | None  # with node="agent"
    kube: Kube  # admin client (system:masters), closed when the environment stops
    tools: Tools
    node: RealNode | None = None  # with node="real"

    def running_pods(self) -> list[str]:
        """``namespace/name`` of the pods that run now."""
        if self.node is not None:
            return self.node.running()
        return self.agent.running() if self.agent is not None else []


@contextlib.contextmanager
def dev_environment(
    state_dir: Path,
    tools: Tools,
    *,
    crds_dir: Path | None,
    max_pods: int,
    image_paths: Mapping[str, Sequence[str]] | None = None,
    controllers: Sequence[str] = CONTROLLERS,
    node: NodeKind = "agent",
) -> Iterator[DevEnvironment]:
    """A started control plane (``crds_dir`` installed when given) and ``node``:

    - ``"agent"``: the node agent, whose pods get the located Pulumi CLI and plugins first on
      ``PATH`` and run at most ``max_pods`` at once; ``image_paths`` maps an image to the
      ``PATH`` entries its pods get instead;
    - ``"real"``: the real node (``tools`` must hold ``NODE_TOOLS``), at most ``max_pods``
      pods, its images imported with ``environment.node.import_image``.

    ``controllers``: what kube-controller-manager runs (the real node adds the node
    lifecycle and EndpointSlice controllers)."""
    stops: Stops = []
    try:
        if node == "real":
            environment = _start_real_node(state_dir, tools, stops, crds_dir, max_pods, controllers)
        else:
            environment = _start_with_agent(
                state_dir, tools, stops, crds_dir, max_pods, image_paths, controllers
            )
        yield environment
    except BaseException:
        teardown(stops)
        raise
    failure = teardown(stops)
    if failure is not None:
        raise failure


def _start_with_agent(
    state_dir: Path,
    tools: Tools,
    stops: Stops,
    crds_dir: Path | None,
    max_pods: int,
    image_paths: Mapping[str, Sequence[str]] | None,
    controllers: Sequence[str],
) -> DevEnvironment:
    control_plane = ControlPlane(state_dir, tools, crds_dir=crds_dir, controllers=controllers)
    stops.insert(0, ("stopping the control plane", control_plane.stop))
    control_plane.start()
    kube = control_plane.admin()
    stops.insert(0, ("closing the admin client", kube.close))
    agent = NodeAgent(
        kube,
        server=control_plane.server,
        ca_pem=control_plane.ca_file.read_bytes(),
        state_dir=state_dir,
        path_prefix=tools.pulumi_path(),
        image_paths=image_paths,
        max_running=max_pods,
        kubelet_tls=control_plane.kubelet_tls,
    )
    stops.insert(0, ("stopping the node agent", agent.stop))
    agent.start()
    return DevEnvironment(control_plane, agent, kube, tools)


def _start_real_node(
    state_dir: Path,
    tools: Tools,
    stops: Stops,
    crds_dir: Path | None,
    max_pods: int,
    controllers: Sequence[str],
) -> DevEnvironment:
    network = create_node_network(state_dir)
    stops.insert(
        0,
        (
            "removing the node network",
            lambda: remove_node_network(network.netns, network.host_interface),
        ),
    )
    control_plane = ControlPlane(
        state_dir,
        tools,
        crds_dir=crds_dir,
        controllers=(*controllers, *NODE_CONTROLLERS),
        address=network.host_address,
        service_cidr=SERVICE_CIDR,
        authorization_modes=("Node", "RBAC"),
    )
    stops.insert(0, ("stopping the control plane", control_plane.stop))
    control_plane.start()
    kube = control_plane.admin()
    stops.insert(0, ("closing the admin client", kube.close))
    real_node = RealNode(control_plane, network, tools, max_pods=max_pods)
    stops.insert(0, ("stopping the real node", real_node.stop))
    real_node.start()
    return DevEnvironment(control_plane, None, kube, tools, real_node)


def teardown(steps: Stops) -> Exception | None:
    """Run every step whatever the one before did (a teardown that stops half-way leaves
    processes behind); the first failure, each one logged."""
    first: Exception | None = None
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            log.exception("pkobatch dev: %s failed; going on with the teardown", what)
            first = first or exc
    return first


def controller_argv(
    *,
    kubeconfig: Path | None = None,
    namespaces: str | None = None,
    metrics_addr: str | None = None,
    health_addr: str | None = None,
    workers: int | None = None,
) -> list[str]:
    """``pkobatch controller`` with this interpreter; an option left out keeps the setting of
    the controller's environment (``PKOBATCH_*``)."""
    argv = [sys.executable, "-m", "pkobatch.main", "controller"]
    options = {
        "--kubeconfig": kubeconfig,
        "--namespaces": namespaces,
        "--metrics-addr": metrics_addr,
        "--health-addr": health_addr,
        "--workers": workers,
    }
    for option, value in options.items():
        if value is not None:
            argv += [option, str(value)]
    return argv
