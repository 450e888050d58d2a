"""``pkobatch dev``: a local Kubernetes control plane, node agent and controller for
development and demos. It lives in ``pkobatch.dev`` (as ``pkobatch controller`` lives in
``pkobatch.controller``), so the user CLI package never imports ``dev``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from pkobatch.dev.demo import Demo, DemoFailed
from pkobatch.dev.environment import NODE_KINDS
from pkobatch.dev.node import NodeError
from pkobatch.dev.node_demo import RealNodeDemo
from pkobatch.dev.supervisor import STATE_ENV, DevError, down, load_images, read_status, up
from pkobatch.dev.supervisor import state_dir as resolve_state_dir
from pkobatch.dev.tools import ToolsMissing

_STATE_HELP = f"state directory [env {STATE_ENV}; default ./.pkobatch/dev]"
state_option = click.option(
    "--state-dir", type=click.Path(file_okay=False, path_type=Path), help=_STATE_HELP
)


def _print_environment(status: dict[str, Any]) -> None:
    console = Console()
    table = Table.grid(padding=(0, 2))
    table.add_row("state", str(status.get("state")))
    if status.get("error"):
        table.add_row("error", str(status["error"]))
    if status.get("state") not in ("running", "degraded"):
        console.print(table)
        return
    table.add_row("supervisor", f"pid {status.get('supervisorPid')}")
    table.add_row("API server", str(status.get("server", "-")))
    table.add_row("node", "real (kubelet, containerd)" if status.get("node") == "real" else "agent")
    down = status.get("down") or {}
    restarts = status.get("restarts") or {}
    components = {**(status.get("components") or {}), **(status.get("nodeComponents") or {})}
    for name, pid in components.items():
        detail = f"DOWN: {down[name]}" if name in down else f"pid {pid}"
        if restarts.get(name):
            detail += f" (restarted {restarts[name]}x)"
        table.add_row(f"  {name}", detail)
    table.add_row("controller", _controller_detail(status.get("controller") or {}))
    table.add_row("running pods", ", ".join(status.get("runningPods") or []) or "-")
    table.add_row("pulumi", str(status.get("pulumi") or "not built"))
    console.print(table)


def _controller_detail(controller: dict[str, Any]) -> str:
    """How the controller is: running, or waiting to be started again after it exited."""
    detail = str(controller.get("state", "-"))
    if "pid" in controller:
        detail += f" (pid {controller['pid']})"
    if "nextStart" in controller:
        detail += f", next start at {controller['nextStart']}"
    if controller.get("restarts"):
        detail += f"; restarted {controller['restarts']}x"
    last_exit = controller.get("lastExit")
    if last_exit:
        detail += (
            f"; last exited with code {last_exit.get('exitCode')} at {last_exit.get('at')}, "
            f"see {controller.get('log')}"
        )
    return detail


# Internal: hidden from `pkobatch --help`, as are `job` and `controller`.
@click.group("dev", hidden=True)
def dev_group() -> None:
    """Local control plane (real etcd, kube-apiserver, kube-controller-manager), a node agent
    that runs pods as local processes or a real node (kubelet, containerd, kube-proxy,
    kube-scheduler), and the controller — for development and demos."""


@dev_group.command("up")
@state_option
@click.option("--max-pods", type=int, default=4, show_default=True, help="pods run at once")
@click.option("--no-controller", is_flag=True, help="start only the control plane and node")
@click.option(
    "--node",
    type=click.Choice(NODE_KINDS),
    default="agent",
    show_default=True,
    help="what runs pods: the node agent (local processes) or a real node (containers; "
    "root, and `scripts/tools.sh node containerd cni_plugins crictl`)",
)
@click.option("--timeout", type=float, default=180, show_default=True, help="seconds to wait")
def up_command(
    state_dir: Path | None, max_pods: int, no_controller: bool, node: str, timeout: float
) -> None:
    """Start everything in the background."""
    root = resolve_state_dir(state_dir)
    try:
        status = up(
            root,
            max_pods=max_pods,
            with_controller=not no_controller,
            timeout=timeout,
            node="real" if node == "real" else "agent",
        )
    except (DevError, ToolsMissing) as exc:
        raise click.ClickException(str(exc)) from exc
    _print_environment(status)
    click.echo(
        "\nPoint kubectl and pkobatch at it:\n"
        f"  export KUBECONFIG={status['kubeconfig']}\n"
        "Stop it with: pkobatch dev down"
    )


@dev_group.command("down")
@state_option
def down_command(state_dir: Path | None) -> None:
    """Stop everything (no process and no listening port stays behind)."""
    root = resolve_state_dir(state_dir)
    if down(root):
        click.echo(f"stopped the dev environment in {root}")
    else:
        click.echo(f"no dev environment runs in {root}")


@dev_group.command("load-image")
@state_option
@click.argument(
    "archives",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
def load_image_command(state_dir: Path | None, archives: tuple[Path, ...]) -> None:
    """Import OCI or Docker image archives into the real node's containerd (no registry is
    needed: pods with imagePullPolicy IfNotPresent or Never run them)."""
    root = resolve_state_dir(state_dir)
    try:
        reports = load_images(root, archives)
    except (DevError, NodeError, ToolsMissing) as exc:
        raise click.ClickException(str(exc)) from exc
    for archive, report in zip(archives, reports, strict=True):
        click.echo(f"{archive}:\n{report.rstrip()}")


@dev_group.command("status")
@state_option
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
def status_command(state_dir: Path | None, output: str) -> None:
    """Show what runs; exit code 1 when the environment is not running, or a component of
    the control plane or the controller is down (state ``degraded``: the supervisor starts it
    again)."""
    status = read_status(resolve_state_dir(state_dir))
    if output == "json":
        click.echo(json.dumps(status, indent=2))
    else:
        _print_environment(status)
    if status.get("state") != "running":
        raise SystemExit(1)


@dev_group.command("demo")
@state_option
@click.option("--timeout", type=float, default=900, show_default=True, help="seconds per step")
@click.option("--keep", is_flag=True, help="leave the environment and the demo Stack running")
@click.option(
    "--node",
    type=click.Choice(NODE_KINDS),
    default="agent",
    show_default=True,
    help="what runs the Stack's run: the node agent (a local process), or a real node (a "
    "container of the runner image, pkobatch installed with `kubectl apply -k`; root, the "
    "node's tools and the images, built when missing; the environment keeps running)",
)
def demo_command(state_dir: Path | None, timeout: float, keep: bool, node: str) -> None:
    """Run a real Pulumi program through a Stack, end to end: build what is missing, start
    the control plane, node agent and controller, then up, refresh and destroy. Everything
    the demo started is stopped at the end unless --keep is given. With --node real: install
    pkobatch on a real node from its own images, bring a Stack up in a container and show the
    run's pod; the environment keeps running. Exit status 0 when every step worked."""
    root = resolve_state_dir(state_dir)
    console = Console()
    real = node == "real"
    demo = (
        RealNodeDemo(root, console, timeout=timeout)
        if real
        else Demo(root, console, timeout=timeout)
    )
    try:
        demo.run()
    except (DemoFailed, DevError, NodeError, ToolsMissing) as exc:
        kept = real and read_status(root).get("state") in ("running", "degraded")
        stop = (
            f"\nthe environment keeps running; stop it with: pkobatch dev down --state-dir {root}"
        )
        raise click.ClickException(f"demo failed: {exc}{stop if kept else ''}") from exc
    finally:
        if demo.started_environment and not keep and not real:
            down(root)
            console.print(f"stopped the dev environment in {root}")
    if keep and not real:
        status = read_status(root)
        click.echo(
            "\nThe environment keeps running:\n"
            f"  export KUBECONFIG={status.get('kubeconfig')}\n"
            f"Stop it with: pkobatch dev down --state-dir {root}"
        )
    click.echo("demo complete")
