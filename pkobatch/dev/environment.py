"""The one way a local environment starts: the control plane, then the node agent that runs
the Job controller's pods, stopped in reverse order. ``pkobatch dev`` (the supervisor), the
tests' ``cluster`` fixtures and ``bench/fanout.py`` all start it through ``dev_environment``,
and run the controller as a process with the command line of ``controller_argv``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkobatch.dev.controlplane import CONTROLLERS, ControlPlane
from pkobatch.dev.node_agent import NodeAgent
from pkobatch.dev.tools import Tools
from pkobatch.kube.client import Kube

log = logging.getLogger("pkobatch.dev")

# ``PKOBATCH_JOB__COMMAND`` of a controller whose Jobs the node agent runs on this host: the
# runner of this checkout, with this interpreter.
LOCAL_JOB_COMMAND: Final = f"{sys.executable},-m,pkobatch.main,job,run"


@dataclass(frozen=True)
class DevEnvironment:
    control_plane: ControlPlane
    agent: NodeAgent
    kube: Kube  # admin client (system:masters), closed when the environment stops
    tools: Tools


@contextlib.contextmanager
def dev_environment(
    state_dir: Path,
    tools: Tools,
    *,
    crds_dir: Path | None,
    max_pods: int,
    image_paths: Mapping[str, Sequence[str]] | None = None,
    controllers: Sequence[str] = CONTROLLERS,
) -> Iterator[DevEnvironment]:
    """A started control plane (``crds_dir`` installed when given) and node agent, whose pods
    get the located Pulumi CLI and plugins first on ``PATH`` and run at most ``max_pods`` at
    once; ``image_paths`` maps an image to the ``PATH`` entries its pods get instead;
    ``controllers``: what kube-controller-manager runs."""
    control_plane = ControlPlane(state_dir, tools, crds_dir=crds_dir, controllers=controllers)
    control_plane.start()  # stops what it started when it fails
    stops: list[tuple[str, Callable[[], object]]] = [
        ("stopping the control plane", control_plane.stop)
    ]
    try:
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
        yield DevEnvironment(control_plane, agent, kube, tools)
    except BaseException:
        teardown(stops)
        raise
    failure = teardown(stops)
    if failure is not None:
        raise failure


def teardown(steps: list[tuple[str, Callable[[], object]]]) -> Exception | None:
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
