"""The client-side rate limit, counted where it matters: at the API server.

The controller runs as its ServiceAccount with ``PKOBATCH_KUBE_QPS=5``; 500 Stacks are
created at once, or 500 settled Stacks are edited at once. The API server's audit log
(pkobatch.dev.controlplane: one line per request of a ``pkobatch-system`` service account,
stamped when received) gives every request the controller sent; over the window they must
number at most ``burst + qps x window``, however much work the 500 Stacks would give it.
Events have a bucket of their own of the same size (pkobatch.controller.events, as
client-go's event recorder has its own clientset), so they are counted apart, each against
that bound. No wall-clock assertion: the window is whatever the server's timestamps say it
was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SA,
    ControllerProcess,
    apply_stack,
    bind_runner,
    install_controller_rbac,
    refuse_pods,
)

from pkobatch.api.timestamps import parse_time
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import JOBS, STACKS, Kube

QPS = 5
BURST = 10
EDITS = 500
WINDOW_SECONDS = 40
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_SA}"


LIMITED = {"PKOBATCH_KUBE_QPS": str(QPS), "PKOBATCH_KUBE_BURST": str(BURST)}


@pytest.fixture
def limited_controller(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[ControllerProcess]:
    install_controller_rbac(cluster.kube)
    bind_runner(cluster.kube, namespace)
    # No pod can be created (each run fails on it), so the node agent runs nothing and the
    # only load is the controller's.
    refuse_pods(cluster.kube, namespace)
    process = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={**LIMITED, "PKOBATCH_MAX_ACTIVE_JOBS": str(EDITS)},
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


def assert_within_the_limit(
    audit_log: Path, start: datetime, end: datetime
) -> tuple[list[datetime], list[datetime]]:
    """The controller's Events and other requests in the window, each within the bound."""
    events, others = controller_requests(audit_log, start)
    window = (end - start).total_seconds()
    allowed = BURST + QPS * window
    assert others, "the audit log holds the controller's requests"
    for what, received in (("requests", others), ("Events", events)):
        assert len(received) <= allowed, (
            f"{len(received)} {what} in {window:.0f}s; the limit allows {allowed:.0f}"
        )
    return events, others


def test_a_burst_of_new_stacks_never_pushes_the_controller_past_its_rate_limit(
    cluster: Any, kube: Kube, namespace: str, limited_controller: ControllerProcess
) -> None:
    start = datetime.now(UTC)
    for index in range(EDITS):
        apply_stack(kube, namespace, f"s{index:03d}", {"stack": "dev"})
    time.sleep(WINDOW_SECONDS)
    events, _ = assert_within_the_limit(cluster.control_plane.audit_log, start, datetime.now(UTC))
    assert events, "the audit log holds the controller's Events"
    # The limit, not a lack of work, set the pace: the controller waited for tokens, and not
    # every Stack has its Job yet (each needs several requests).
    waited = limited_controller.metric("rest_client_rate_limiter_duration_seconds_sum")
    assert waited > 0
    jobs, _ = kube.list_objects(JOBS, namespace)
    assert len(jobs) < EDITS


def observed_generations(kube: Kube, namespace: str) -> list[int]:
    stacks, _ = kube.list_objects(STACKS, namespace)
    return [int((s.get("status") or {}).get("observedGeneration") or 0) for s in stacks]


def test_a_burst_of_spec_edits_never_pushes_the_controller_past_its_rate_limit(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """Settled Stacks (suspended: each edit costs one status write and an Event, and no Job),
    settled by an unlimited controller, then all edited at once under the limit."""
    install_controller_rbac(cluster.kube)
    names = [f"s{index:03d}" for index in range(EDITS)]
    controller = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={"PKOBATCH_KUBE_QPS": "1000", "PKOBATCH_KUBE_BURST": "2000"},
    )
    controller.start()
    try:
        for name in names:
            apply_stack(kube, namespace, name, {"stack": "dev", "suspend": True})
        wait_until(
            lambda: observed_generations(kube, namespace) == [1] * EDITS,
            timeout=300,
            what="every Stack settled",
        )
    finally:
        controller.stop()
    controller.extra_env = LIMITED
    controller.start()
    try:
        controller.caught_up()
        start = datetime.now(UTC)
        for name in names:
            kube.merge_patch(STACKS, name, {"spec": {"stack": "prod"}}, namespace)
        time.sleep(WINDOW_SECONDS)
        assert_within_the_limit(cluster.control_plane.audit_log, start, datetime.now(UTC))
        # The limit set the pace: some edits were observed, not all of them yet.
        assert controller.metric("rest_client_rate_limiter_duration_seconds_sum") > 0
        assert 0 < observed_generations(kube, namespace).count(2) < EDITS
    finally:
        controller.stop()
