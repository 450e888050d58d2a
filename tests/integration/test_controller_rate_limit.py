"""The client-side rate limit, counted where it matters: at the API server.

The controller runs as its ServiceAccount with ``PKOBATCH_KUBE_QPS=5``; 500 Stacks are
created at once. The API server's audit log (pkobatch.dev.controlplane: one line per request
of a ``pkobatch-system`` service account, stamped when received) gives every request the
controller sent; over the window they must number at most ``burst + qps x window``, however
much work the 500 Stacks would give it. Events have a bucket of their own of the same size
(pkobatch.controller.events, as client-go's event recorder has its own clientset), so they
are counted apart, each against that bound. No wall-clock assertion: the window is whatever
the server's timestamps say it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SA,
    ControllerProcess,
    bind_runner,
    install_controller_rbac,
)

from pkobatch.api.timestamps import parse_time
from pkobatch.kube.client import JOBS, STACKS, Kube, Resource

RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
QPS = 5
BURST = 10
EDITS = 500
WINDOW_SECONDS = 40
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_SA}"


@pytest.fixture
def limited_controller(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[ControllerProcess]:
    install_controller_rbac(cluster.kube)
    bind_runner(cluster.kube, namespace)
    # No pod can be created: the runs stay pending, so the only load is the controller's.
    cluster.kube.create(
        RESOURCE_QUOTAS,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}},
        },
        namespace,
    )
    process = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={
            "PKOBATCH_KUBE_QPS": str(QPS),
            "PKOBATCH_KUBE_BURST": str(BURST),
            "PKOBATCH_MAX_ACTIVE_JOBS": str(EDITS),
        },
    )
    process.start()
    yield process
    process.stop()


def controller_requests(audit_log: Path, since: datetime) -> tuple[list[datetime], list[datetime]]:
    """When the API server received each request of the controller's ServiceAccount: its
    Event creations, and all its other requests."""
    events, others = [], []
    for line in audit_log.read_text().splitlines():
        entry = json.loads(line)
        if (entry.get("user") or {}).get("username") != CONTROLLER_USER:
            continue
        at = parse_time(entry["requestReceivedTimestamp"])
        if at is None or at < since:
            continue
        target = entry.get("objectRef") or {}
        is_event = target.get("apiGroup") == "events.k8s.io" and target.get("resource") == "events"
        (events if is_event else others).append(at)
    return sorted(events), sorted(others)


def test_a_burst_of_edits_never_pushes_the_controller_past_its_rate_limit(
    cluster: Any, kube: Kube, namespace: str, limited_controller: ControllerProcess
) -> None:
    start = datetime.now(UTC)
    for index in range(EDITS):
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": f"s{index:03d}"},
            "spec": {"stack": "dev"},
        }
        kube.create(STACKS, body, namespace)
    time.sleep(WINDOW_SECONDS)
    end = datetime.now(UTC)

    events, others = controller_requests(cluster.control_plane.audit_log, start)
    window = (end - start).total_seconds()
    allowed = BURST + QPS * window
    assert others and events, "the audit log holds the controller's requests and Events"
    for what, received in (("requests", others), ("Events", events)):
        assert len(received) <= allowed, (
            f"{len(received)} {what} in {window:.0f}s; the limit allows {allowed:.0f}"
        )
    # The limit, not a lack of work, set the pace: the controller waited for tokens, and not
    # every Stack has its Job yet (each needs several requests).
    waited = limited_controller.metric("rest_client_rate_limiter_duration_seconds_sum")
    assert waited > 0
    jobs, _ = kube.list_objects(JOBS, namespace)
    assert len(jobs) < EDITS
