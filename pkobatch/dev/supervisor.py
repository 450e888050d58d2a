"""``pkobatch dev up|down|status``: the local environment as one background process.

``up`` starts a detached supervisor (``python -m pkobatch.dev.supervisor``) that owns the
control plane, the node agent or the real node (``--node real``) and the controller
(``python -m pkobatch.main controller``);
every child dies with it (process groups + ``PR_SET_PDEATHSIG``), so stopping the
supervisor — SIGTERM from ``down``, or even SIGKILL — stops everything. The supervisor
records what runs in ``<state>/status.json``; ``status`` reads it back.

Like a Deployment's kubelet, the supervisor starts a controller that exits (crashed, killed)
again, with the same settings and ports, after a backoff that doubles with each exit that
follows a short run (``_CONTROLLER_BACKOFF_CAP`` at most) and starts over once the
controller has run ``_CONTROLLER_STABLE_SECONDS``. Meanwhile the environment is
``degraded`` and ``status`` says when the next start is due; the restarts are counted.

State directory (default ``./.pkobatch/dev``, or ``$PKOBATCH_DEV_STATE``)::

    supervisor.pid, supervisor.log, status.json
    kubeconfig            admin kubeconfig of the running cluster
    controller.log        the controller's output
    logs/<ns>/<pod>.log   output of every pod (served as pods/log by the node agent)
    node/                 the real node's files (see pkobatch.dev.node)
    + the control plane's files (see pkobatch.dev.controlplane)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

from pkobatch.dev import processes
from pkobatch.dev import tools as dev_tools
from pkobatch.dev.controlplane import (
    COMPONENTS,
    ControlPlane,
    ControlPlaneError,
    default_crds_dir,
)
from pkobatch.dev.environment import (
    LOCAL_JOB_COMMAND,
    NODE_KINDS,
    DevEnvironment,
    NodeKind,
    controller_argv,
    dev_environment,
    teardown,
)
from pkobatch.dev.node import NodePaths, import_image, remove_node_leftovers
from pkobatch.dev.node_network import node_network_names, remove_node_network
from pkobatch.dev.tools import NODE_TOOLS, Component, available_tools, find_tools

STATE_ENV: Final = "PKOBATCH_DEV_STATE"
DEFAULT_STATE: Final = Path(".pkobatch") / "dev"
log = logging.getLogger("pkobatch.dev")
_RESTART_TIMEOUT: Final = 120.0
_RESTART_BACKOFF_CAP: Final = 60.0
_CONTROLLER_BACKOFF_CAP: Final = 60.0
# A controller that ran this long before it exited starts again after the shortest backoff.
_CONTROLLER_STABLE_SECONDS: Final = 60.0


class DevError(Exception):
    """A dev command cannot do what was asked; the message says why and what to do."""


def state_dir(explicit: str | Path | None = None) -> Path:
    chosen = explicit or os.environ.get(STATE_ENV) or DEFAULT_STATE
    return Path(chosen).resolve()


@dataclass(frozen=True)
class DevPaths:
    root: Path

    @property
    def pid_file(self) -> Path:
        return self.root / "supervisor.pid"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pod_log_dir(self) -> Path:
        return self.root / "logs"


def controller_env(paths: DevPaths, kubeconfig: Path, node: NodeKind = "agent") -> dict[str, str]:
    """The controller's environment: with the node agent, Jobs run ``python -m pkobatch.main
    job run`` with this interpreter (the agent runs them on this host); on the real node they
    run the Job template's image and command. Probes on free loopback ports."""
    env = dict(os.environ)
    env.update(
        {
            "KUBECONFIG": str(kubeconfig),
            "PKOBATCH_KUBECONFIG": str(kubeconfig),
            "PKOBATCH_METRICS_ADDR": f"127.0.0.1:{processes.free_port()}",
            "PKOBATCH_HEALTH_ADDR": f"127.0.0.1:{processes.free_port()}",
            "PKOBATCH_LOG_FORMAT": "text",
        }
    )
    if node == "agent":
        env["PKOBATCH_JOB__COMMAND"] = LOCAL_JOB_COMMAND
    return env


def required_tools(node: NodeKind) -> tuple[Component, ...]:
    """What an environment with ``node`` cannot start without."""
    return ("etcd", "kubernetes", *NODE_TOOLS) if node == "real" else ("etcd", "kubernetes")


def _write_status(paths: DevPaths, status: dict[str, Any]) -> None:
    temporary = paths.status_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(status, indent=2))
    temporary.replace(paths.status_file)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def running_pid(paths: DevPaths) -> int | None:
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


# -- the supervisor process ------------------------------------------------------------------


def supervise(root: Path, *, max_pods: int, with_controller: bool, node: NodeKind) -> int:
    """Run everything until SIGTERM/SIGINT; the exit code."""
    paths = DevPaths(root)
    processes.exit_on_termination_signals()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    status: dict[str, Any] = {"state": "starting", "pid": os.getpid(), "stateDir": str(root)}
    _write_status(paths, status)
    try:
        find_tools(required_tools(node))
        tools = available_tools((*dev_tools.COMPONENTS, *NODE_TOOLS))
        with dev_environment(
            root, tools, crds_dir=default_crds_dir(), max_pods=max_pods, node=node
        ) as environment:
            _supervise(environment, paths, status, with_controller=with_controller, node=node)
    except (KeyboardInterrupt, SystemExit):
        return 0
    except Exception as exc:
        log.exception("pkobatch dev: supervisor failed")
        status.update({"state": "failed", "error": str(exc)})
        _write_status(paths, status)
        return 1
    finally:
        if status.get("state") != "failed":
            status["state"] = "stopped"
        status.pop("runningPods", None)
        teardown([("writing the final status", lambda: _write_status(paths, status))])
        with contextlib.suppress(OSError):
            paths.pid_file.unlink()
    return 0


def _supervise(
    environment: DevEnvironment,
    paths: DevPaths,
    status: dict[str, Any],
    *,
    with_controller: bool,
    node: NodeKind,
) -> NoReturn:
    """Keep the environment (and the controller) running; returns only by an exception."""
    control_plane, tools = environment.control_plane, environment.tools
    status.update(
        {
            "state": "running",
            "server": control_plane.server,
            "kubeconfig": str(control_plane.kubeconfig),
            "podLogDir": str(paths.pod_log_dir),
            "node": node,
            "components": control_plane.pids,
            "pulumi": str(tools.pulumi) if tools.pulumi else None,
            "startedAt": datetime.datetime.now(datetime.UTC).isoformat(),
            "controller": {"state": "disabled"},
        }
    )
    controller = (
        _ControllerKeeper(paths, controller_env(paths, control_plane.kubeconfig, node), status)
        if with_controller
        else None
    )
    try:
        if controller is not None:
            controller.start()
        _write_status(paths, status)
        components = _ComponentKeeper(control_plane, status)
        while True:
            components.restart_crashed()
            if controller is not None:
                controller.keep_running()
            if environment.node is not None:
                status["nodeComponents"] = environment.node.pids
                _report_node_exits(environment, status)
            down = bool(status.get("down")) or (controller is not None and not controller.running())
            status["state"] = "degraded" if down else "running"
            status["runningPods"] = environment.running_pods()
            _write_status(paths, status)
            time.sleep(1.0)
    finally:
        if controller is not None:
            teardown([("stopping the controller", controller.stop)])


def controller_backoff(ran: float, exits_in_a_row: int) -> tuple[int, float]:
    """After a controller exit that followed ``ran`` seconds of running: the exits in a row
    now, and the seconds to wait before starting it again (1, 2, 4, ... at most
    ``_CONTROLLER_BACKOFF_CAP``; 1 again after a run of ``_CONTROLLER_STABLE_SECONDS``)."""
    exits = exits_in_a_row + 1 if ran < _CONTROLLER_STABLE_SECONDS else 1
    return exits, min(_CONTROLLER_BACKOFF_CAP, 2.0 ** (exits - 1))


class _ControllerKeeper:
    """Runs the controller and starts it again when it exits, with a backoff (see the module
    docstring); ``status["controller"]`` says how it is."""

    def __init__(self, paths: DevPaths, env: dict[str, str], status: dict[str, Any]) -> None:
        self.paths = paths
        self.env = env
        self.status = status
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.restarts = 0
        # Exits in a row, each after a run shorter than _CONTROLLER_STABLE_SECONDS.
        self.exits_in_a_row = 0
        self.next_start = 0.0
        self.last_exit: dict[str, Any] | None = None

    def start(self) -> None:
        self.process = processes.spawn(
            controller_argv(), log=self.paths.controller_log, env=self.env
        )
        self.started = time.monotonic()
        self._record({"state": "running", "pid": self.process.pid})

    def running(self) -> bool:
        return self.process is not None

    def keep_running(self) -> None:
        """Notice an exit and schedule the next start; start it when that is due."""
        process = self.process
        if process is not None and process.poll() is not None:
            processes.forget(process)
            self.process = None
            ran = time.monotonic() - self.started
            self.exits_in_a_row, delay = controller_backoff(ran, self.exits_in_a_row)
            self.next_start = time.monotonic() + delay
            at = datetime.datetime.now(datetime.UTC)
            self.last_exit = {"exitCode": process.returncode, "at": at.isoformat()}
            log.warning(
                "pkobatch dev: the controller exited with code %s after %.0fs; starting it "
                "again in %.0fs",
                process.returncode,
                ran,
                delay,
            )
            restart_at = at + datetime.timedelta(seconds=delay)
            self._record({"state": "restarting", "nextStart": restart_at.isoformat()})
        if self.process is None and time.monotonic() >= self.next_start:
            self.restarts += 1
            self.start()

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process, 10)

    def _record(self, state: dict[str, Any]) -> None:
        state = {**state, "log": str(self.paths.controller_log)}
        if self.restarts:
            state["restarts"] = self.restarts
        if self.last_exit is not None:
            state["lastExit"] = self.last_exit
        self.status["controller"] = state


def _report_node_exits(environment: DevEnvironment, status: dict[str, Any]) -> None:
    """A real-node component that exited is ``down`` and the environment ``degraded`` (it is
    not restarted: a kubelet or containerd that crashes here needs a look at its log)."""
    assert environment.node is not None
    for name, code in environment.node.exited().items():
        log_file = environment.node.log_dir / f"{name}.log"
        status.setdefault("down", {})[name] = f"exited with code {code}; see {log_file}"


class _ComponentKeeper:
    """Starts a crashed control-plane component again (etcd keeps its data, every component
    its ports), and records in the status what is down while it cannot: ``dev status`` then
    reports the environment ``degraded``, naming the component."""

    def __init__(self, control_plane: ControlPlane, status: dict[str, Any]) -> None:
        self.control_plane = control_plane
        self.status = status
        self.next_attempt: dict[str, float] = {}
        self.failures: dict[str, int] = {}

    def restart_crashed(self) -> None:
        exited = self.control_plane.exited()
        # etcd first: the API server cannot become ready without it.
        for name in [n for n in COMPONENTS if n in exited]:
            if time.monotonic() < self.next_attempt.get(name, 0.0):
                continue
            log.warning("pkobatch dev: %s exited with code %s; restarting it", name, exited[name])
            self._mark_down(name, f"exited with code {exited[name]}; restarting")
            try:
                self.control_plane.start_component(name, timeout=_RESTART_TIMEOUT)
            except (ControlPlaneError, OSError) as exc:
                failures = self.failures[name] = self.failures.get(name, 0) + 1
                delay = min(_RESTART_BACKOFF_CAP, 2.0**failures)
                self.next_attempt[name] = time.monotonic() + delay
                self._mark_down(name, f"cannot be restarted (next try in {delay:.0f}s): {exc}")
                continue
            self.failures.pop(name, None)
            restarts = self.status.setdefault("restarts", {})
            restarts[name] = restarts.get(name, 0) + 1
            self.status["components"] = self.control_plane.pids
            down = self.status.get("down") or {}
            down.pop(name, None)
            if down:
                self.status["down"] = down
            else:
                self.status.pop("down", None)
            log.info("pkobatch dev: %s is healthy again", name)

    def _mark_down(self, name: str, message: str) -> None:
        self.status.setdefault("down", {})[name] = message
        self.status["state"] = "degraded"
        with contextlib.suppress(OSError):
            _write_status(DevPaths(Path(self.status["stateDir"])), self.status)


# -- the commands ----------------------------------------------------------------------------


def read_status(root: Path) -> dict[str, Any]:
    paths = DevPaths(root)
    try:
        status: dict[str, Any] = json.loads(paths.status_file.read_text())
    except (OSError, ValueError):
        status = {"state": "absent"}
    pid = running_pid(paths)
    if pid is None and status.get("state") in ("starting", "running", "degraded"):
        status["state"] = "dead"
    status["supervisorPid"] = pid
    return status


def up(
    root: Path,
    *,
    max_pods: int = 4,
    with_controller: bool = True,
    timeout: float = 180,
    node: NodeKind = "agent",
) -> dict[str, Any]:
    """Start the supervisor in the background and wait until everything runs."""
    paths = DevPaths(root)
    if running_pid(paths) is not None:
        raise DevError(f"already running (state {root}); stop it with `pkobatch dev down`")
    find_tools(required_tools(node))
    root.mkdir(parents=True, exist_ok=True)
    paths.status_file.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pkobatch.dev.supervisor", "--state-dir", str(root)]
    argv += ["--max-pods", str(max_pods), "--node", node]
    if not with_controller:
        argv.append("--no-controller")
    with paths.supervisor_log.open("wb") as log_file:
        # Detached on purpose: it must outlive this command (no parent-death signal).
        supervisor = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=root,
        )
    paths.pid_file.write_text(str(supervisor.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(root)
        if status.get("state") == "running":
            return status
        if supervisor.poll() is not None or status.get("state") in ("failed", "dead"):
            tail = "\n".join(paths.supervisor_log.read_text(errors="replace").splitlines()[-30:])
            raise DevError(f"the dev environment failed to start:\n{tail}")
        time.sleep(0.3)
    down(root)
    raise DevError(f"the dev environment did not start within {timeout:.0f}s")


def down(root: Path, *, timeout: float = 120) -> bool:
    """Stop the supervisor (and so everything); False if nothing ran. What a real node of
    ``root`` may have left when its supervisor was killed (containers, shims, mounts,
    cgroups, its network) is removed either way."""
    paths = DevPaths(root)
    pid = running_pid(paths)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        _remove_real_node_leftovers(root)
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _pid_alive(pid):
        # Its children die with it (parent-death signal).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    paths.pid_file.unlink(missing_ok=True)
    _remove_real_node_leftovers(root)
    return True


def load_images(root: Path, archives: Sequence[Path]) -> list[str]:
    """Import image archives into the real node running in ``root``; what each import
    reported."""
    status = read_status(root)
    if status.get("state") not in ("running", "degraded") or status.get("node") != "real":
        raise DevError(
            f"no real node runs in {root} (state {status.get('state')}); "
            "start one with `pkobatch dev up --node real`"
        )
    tools = find_tools(("containerd",))
    socket = NodePaths(root).containerd_socket
    return [import_image(tools, socket, archive.resolve()) for archive in archives]


def _remove_real_node_leftovers(root: Path) -> None:
    if (root / "node").is_dir():
        remove_node_leftovers(root)
        remove_node_network(*node_network_names(root))


def _main() -> int:
    parser = argparse.ArgumentParser(prog="python -m pkobatch.dev.supervisor")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--max-pods", type=int, default=4)
    parser.add_argument("--no-controller", action="store_true")
    parser.add_argument("--node", choices=NODE_KINDS, default="agent")
    args = parser.parse_args()
    return supervise(
        Path(args.state_dir).resolve(),
        max_pods=args.max_pods,
        with_controller=not args.no_controller,
        node=args.node,
    )


if __name__ == "__main__":
    sys.exit(_main())
