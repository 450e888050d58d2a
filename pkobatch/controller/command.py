"""``pkobatch controller``: run the Stack controller (wired in ``composition``).

Settings come from ``PKOBATCH_*`` environment variables; a flag overrides its variable only
when given. Invalid settings print every problem and exit with status 2. SIGTERM and
SIGINT shut down gracefully (exit 0); losing the leader lease exits with status 1.
"""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import Any

import click

from pkobatch.config import Settings, SettingsInvalid, load_settings
from pkobatch.kube.client import Kube, KubeError
from pkobatch.kube.ratelimit import TokenBucket
from pkobatch.runtime.malloc_arenas import cap_malloc_arenas
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.structured_logging import setup_logging

log = logging.getLogger(__name__)


def _default(field: str) -> object:
    """A setting's default as the help shows it, read from ``Settings`` so the two agree."""
    value = Settings.model_fields[field].default
    return f"{value:g}" if isinstance(value, float) else value


# Internal: hidden from `pkobatch --help` (the Deployment runs it).
@click.command("controller", hidden=True)
@click.option("--kubeconfig", help="kubeconfig file [env PKOBATCH_KUBECONFIG; default: in-cluster]")
@click.option("--context", help="kubeconfig context [env PKOBATCH_CONTEXT]")
@click.option(
    "--namespaces", help="comma-separated namespaces to watch [env PKOBATCH_NAMESPACES; all]"
)
@click.option(
    "--namespace-selector",
    help="only the namespaces whose labels match it; with --namespaces, the listed ones that "
    "match [env PKOBATCH_NAMESPACE_SELECTOR; all]",
)
@click.option("--label-selector", help="only Stacks matching it [env PKOBATCH_LABEL_SELECTOR]")
@click.option(
    "--shard",
    help="reconcile only the Stacks labelled pkobatch.io/shard=SHARD [env PKOBATCH_SHARD]",
)
@click.option(
    "--sharded/--not-sharded",
    default=None,
    help="sharded install: without --shard, only Stacks with no pkobatch.io/shard label "
    "[env PKOBATCH_SHARDED; off]",
)
@click.option(
    "--workers",
    type=int,
    help=f"concurrent reconciles [env PKOBATCH_WORKERS; {_default('workers')}]",
)
@click.option(
    "--kube-qps",
    type=float,
    help=f"average API requests per second [env PKOBATCH_KUBE_QPS; {_default('kube_qps')}]",
)
@click.option(
    "--kube-burst",
    type=int,
    help="API requests allowed at once above the average "
    f"[env PKOBATCH_KUBE_BURST; {_default('kube_burst')}]",
)
@click.option(
    "--max-active-jobs",
    type=int,
    help="cap on running Jobs, cluster-wide (per shard when sharded) "
    f"[env PKOBATCH_MAX_ACTIVE_JOBS; {_default('max_active_jobs')}]",
)
@click.option(
    "--metrics-addr",
    help="Prometheus endpoint, '0' disables "
    f"[env PKOBATCH_METRICS_ADDR; {_default('metrics_addr')}]",
)
@click.option(
    "--health-addr",
    help="/healthz and /readyz, '0' disables "
    f"[env PKOBATCH_HEALTH_ADDR; {_default('health_addr')}]",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=None,
    help="use a Lease so only one replica acts [env PKOBATCH_LEADER_ELECTION__ENABLED; off]",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help=f"[env PKOBATCH_LOG_LEVEL; {_default('log_level')}]",
)
@click.option(
    "--log-format",
    type=click.Choice(["json", "text"]),
    help=f"[env PKOBATCH_LOG_FORMAT; {_default('log_format')}]",
)
def controller_command(leader_elect: bool | None, **flags: Any) -> None:
    """Run the Stack controller (reconciles pulumi.com/v1 Stacks into Jobs)."""
    if leader_elect is not None:
        flags["leader_election"] = {"enabled": leader_elect}
    try:
        settings = load_settings(**flags)
    except SettingsInvalid as exc:
        click.echo(f"pkobatch controller: {exc}", err=True)
        sys.exit(2)
    setup_logging(settings.log_level, settings.log_format)
    cap_malloc_arenas()  # before any thread starts

    # The reconciler's modules load only when the controller runs, not for every CLI command.
    from pkobatch.controller.composition import CONTROLLER_NAME, build_manager

    metrics = Metrics(CONTROLLER_NAME)
    try:
        kube = Kube.connect(
            settings.kubeconfig or None,
            settings.context or None,
            on_request=metrics.request_done,
            # A connection per worker plus one per watch (three kinds per namespace, and the
            # Namespaces when selected by label).
            qps_pool=settings.workers
            + 3 * max(1, len(settings.namespaces))
            + (5 if settings.namespace_filter else 4),
            rate_limiter=TokenBucket(settings.kube_qps, settings.kube_burst),
            on_wait=metrics.rate_limiter_waited,
        )
    except KubeError as exc:
        log.error("cannot connect to the Kubernetes API: %s", exc)
        sys.exit(1)
    metrics.set_api_server(kube.host)
    manager = build_manager(kube, settings, metrics)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        manager.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "starting controller",
        extra={
            "namespaces": settings.namespaces or "all",
            "namespaceSelector": settings.namespace_selector or "all",
            "stackSelector": settings.stack_selector or "all",
            "workers": settings.workers,
            "leaderElection": settings.leader_election.enabled,
        },
    )
    manager.run()
    kube.close()
