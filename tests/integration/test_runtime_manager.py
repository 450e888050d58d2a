"""The Manager, wired as ``pkobatch controller`` wires it (``composition.build_manager``),
against the real API server: events of Stacks, Jobs and result ConfigMaps become reconciles
of the right Stack; metrics and health endpoints; the reconciler's
enqueuer; graceful shutdown lets an in-flight reconcile finish."""

from __future__ import annotations

import gzip
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from pkobatch.api.constants import STACK_LABEL, STACK_NAME_ANNOTATION
from pkobatch.config import Settings, load_settings
from pkobatch.controller.composition import CONTROLLER_NAME, build_manager
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import StackKey, Stores
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, JOBS, STACKS, Kube
from pkobatch.runtime.interfaces import Enqueuer, ReconcileResult
from pkobatch.runtime.manager import Manager
from pkobatch.runtime.metrics import Metrics

JSON = dict[str, Any]
MANAGED = {"app.kubernetes.io/managed-by": "pkobatch"}


class Recording:
    """Records reconciled keys; can be told to be slow or to wake another key."""

    def __init__(self, stores: Stores, enqueuer: Enqueuer) -> None:
        self.stores = stores
        self.enqueuer = enqueuer
        self.keys: list[StackKey] = []
        self.finished: list[StackKey] = []
        self.slow: set[str] = set()
        self.wake: dict[str, StackKey] = {}
        self.lock = threading.Lock()

    def reconcile(self, key: StackKey) -> ReconcileResult:
        with self.lock:
            self.keys.append(key)
        if key.name in self.slow:
            time.sleep(2)
        if key.name in self.wake:
            self.enqueuer.enqueue(self.wake.pop(key.name), after=0.2)
        with self.lock:
            self.finished.append(key)
        return ReconcileResult()

    def count(self, key: StackKey) -> int:
        with self.lock:
            return self.keys.count(key)


@pytest.fixture
def running(cluster: Any, namespace: str) -> Iterator[tuple[Manager, Recording]]:
    settings = load_settings(
        namespaces=namespace, metrics_addr="127.0.0.1:0", health_addr="127.0.0.1:0", workers=2
    )
    built: list[Recording] = []

    def factory(
        kube: Kube, stores: Stores, settings: Settings, metrics: StackMetrics, enqueuer: Enqueuer
    ) -> Recording:
        built.append(Recording(stores, enqueuer))
        return built[0]

    # Wired as `pkobatch controller` does: every API request is counted.
    metrics = Metrics(CONTROLLER_NAME)
    kube = Kube.connect(str(cluster.kubeconfig), on_request=metrics.request_done)
    metrics.set_api_server(kube.host)
    manager = build_manager(kube, settings, metrics, factory)
    thread = threading.Thread(target=manager.run)
    thread.start()
    try:
        wait_until(manager.synced, timeout=30, what="caches to sync")
        yield manager, built[0]
    finally:
        manager.stop()
        thread.join(60)
        kube.close()


def stack(name: str) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {"stack": f"org/{name}/dev", "projectRepo": "https://example.com/r", "branch": "m"},
    }


def job(
    name: str,
    *,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
    owner: JSON | None = None,
) -> JSON:
    meta: JSON = {"name": name, "labels": {**MANAGED, **labels}}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "suspend": True,  # never runs: only its events matter here
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "none", "command": ["true"]}],
                }
            },
        },
    }


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_child_objects_wake_their_stack(
    kube: Kube, namespace: str, running: tuple[Manager, Recording]
) -> None:
    _, recording = running
    long_name = "l" * 40  # the annotation wins over a (hashed) label
    for name in ("plain", "owned", long_name):
        kube.create(STACKS, stack(name), namespace)
    keys = {name: StackKey(namespace, name) for name in ("plain", "owned", long_name)}
    wait_until(
        lambda: all(recording.count(k) >= 1 for k in keys.values()),
        timeout=30,
        what="Stacks reconciled",
    )
    owned_uid = kube.get(STACKS, "owned", namespace)["metadata"]["uid"]
    before = {name: recording.count(key) for name, key in keys.items()}

    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "plain-up-1", "labels": {**MANAGED, STACK_LABEL: "plain"}},
        },
        namespace,
    )
    owner = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "name": "owned",
        "uid": owned_uid,
        "controller": True,
    }
    kube.create(JOBS, job("owned-up-1", labels={STACK_LABEL: "ignored"}, owner=owner), namespace)
    kube.create(
        JOBS,
        job(
            "long-up-1",
            labels={STACK_LABEL: "hashed-value"},
            annotations={STACK_NAME_ANNOTATION: long_name},
        ),
        namespace,
    )
    # Objects of a Stack this controller does not have are ignored.
    kube.create(JOBS, job("stray-up-1", labels={STACK_LABEL: "not-a-stack"}), namespace)
    for name, key in keys.items():
        wait_until(
            lambda key=key, name=name: recording.count(key) > before[name],
            timeout=30,
            what=f"reconcile of {name} after its child changed",
        )
    assert StackKey(namespace, "not-a-stack") not in recording.keys
    assert StackKey(namespace, "ignored") not in recording.keys
    assert [
        j["metadata"]["name"] for j in recording.stores.jobs.for_owner(namespace, long_name)
    ] == ["long-up-1"]


def test_enqueuer_wakes_another_stack(
    kube: Kube, namespace: str, running: tuple[Manager, Recording]
) -> None:
    _, recording = running
    recording.wake["first"] = StackKey(namespace, "sleeper")
    kube.create(STACKS, stack("sleeper"), namespace)
    wait_until(
        lambda: recording.count(StackKey(namespace, "sleeper")) == 1,
        timeout=30,
        what="sleeper reconciled once",
    )
    kube.create(STACKS, stack("first"), namespace)
    wait_until(
        lambda: recording.count(StackKey(namespace, "sleeper")) == 2,
        timeout=30,
        what="sleeper woken by first's reconcile",
    )


def test_endpoints_report_health_readiness_and_metrics(
    cluster: Any, kube: Kube, namespace: str, running: tuple[Manager, Recording]
) -> None:
    manager, recording = running
    kube.create(STACKS, stack("measured"), namespace)
    wait_until(
        lambda: recording.count(StackKey(namespace, "measured")) >= 1, timeout=30, what="reconcile"
    )
    health, metrics = (f"http://127.0.0.1:{port}" for port in manager.endpoint_ports)
    assert get(f"{health}/healthz") == (200, "ok\n")
    assert get(f"{health}/readyz") == (200, "ok\n")
    status, text = get(f"{metrics}/metrics")
    assert status == 200
    # PKO's controller name, so PKO's dashboards select these series.
    controller = 'controller="stack-controller"'
    assert f'controller_runtime_reconcile_total{{{controller},result="success"}}' in text
    assert f"controller_runtime_max_concurrent_reconciles{{{controller}}} 2.0" in text
    assert "stacks_active 1.0" in text
    assert f'pkobatch_stack_info{{name="measured",namespace="{namespace}"' in text
    host = urllib.parse.urlsplit(str(cluster.server)).netloc
    assert f'rest_client_requests_total{{code="200",host="{host}",method="GET"}}' in text
    assert "workqueue_depth" in text and "workqueue_longest_running_processor_seconds" in text
    assert get(f"{metrics}/nothing")[0] == 404
    # As Prometheus asks: OpenMetrics, gzipped.
    request = urllib.request.Request(
        f"{metrics}/metrics",
        headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            "Accept-Encoding": "gzip",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert response.headers["Content-Type"].startswith("application/openmetrics-text;")
        openmetrics = gzip.decompress(response.read()).decode()
    assert openmetrics.endswith("# EOF\n")
    assert f'controller_runtime_reconcile_total{{{controller},result="success"}}' in openmetrics


def test_shutdown_finishes_in_flight_reconciles(kube: Kube, namespace: str) -> None:
    settings = load_settings(namespaces=namespace, metrics_addr="0", health_addr="0")
    holder: list[Recording] = []

    def factory(*args: Any) -> Recording:
        holder.append(Recording(args[1], args[4]))
        holder[0].slow.add("slow")
        return holder[0]

    manager = build_manager(kube, settings, Metrics(CONTROLLER_NAME), factory)
    thread = threading.Thread(target=manager.run)
    thread.start()
    wait_until(manager.synced, timeout=30, what="caches to sync")
    kube.create(STACKS, stack("slow"), namespace)
    key = StackKey(namespace, "slow")
    wait_until(lambda: key in holder[0].keys, timeout=30, what="slow reconcile to start")
    manager.stop()
    assert not manager.ready()
    thread.join(60)
    assert not thread.is_alive()
    assert holder[0].finished == [key], "the in-flight reconcile ran to completion"
    threads = [r._thread for r in manager.reflectors]
    assert all(t is not None and not t.is_alive() for t in threads), "watches are stopped"


class Paced(Recording):
    """Takes a tenth of a second per reconcile, so a resync wave stays queued a while."""

    def reconcile(self, key: StackKey) -> ReconcileResult:
        time.sleep(0.1)
        return super().reconcile(key)


@pytest.mark.parametrize("wave", ["start-up list", "resync"])
def test_a_change_overtakes_a_wave_of_every_stack(kube: Kube, namespace: str, wave: str) -> None:
    """A Stack edited while every Stack waits in the queue — the start-up list's or a
    resync's wave — is reconciled next, not after the wave."""
    names = [f"s{index:02d}" for index in range(60)]
    if wave == "start-up list":
        for name in names:
            kube.create(STACKS, stack(name), namespace)
    settings = load_settings(
        namespaces=namespace,
        metrics_addr="0",
        health_addr="0",
        workers=1,
        resync_period="12s" if wave == "resync" else "10h",
    )
    holder: list[Paced] = []

    def factory(*args: Any) -> Paced:
        holder.append(Paced(args[1], args[4]))
        return holder[0]

    manager = build_manager(kube, settings, Metrics(CONTROLLER_NAME), factory)
    thread = threading.Thread(target=manager.run)
    thread.start()
    try:
        wait_until(manager.synced, timeout=30, what="caches to sync")
        recording = holder[0]
        if wave == "resync":
            for name in names:
                kube.create(STACKS, stack(name), namespace)
            wait_until(
                lambda: all(recording.count(StackKey(namespace, n)) >= 1 for n in names),
                timeout=120,
                what="every Stack reconciled once",
            )
        # Mid-wave: some Stacks are done, many wait.
        wait_until(lambda: 20 <= len(manager.queue) <= 40, timeout=60, what=f"the {wave} wave")
        with recording.lock:
            edited, seen = recording.keys[-1], len(recording.keys)
        waiting = len(manager.queue)
        kube.merge_patch(STACKS, edited.name, {"spec": {"branch": "edited"}}, namespace)
        wait_until(lambda: edited in recording.keys[seen:], timeout=60, what="the edit's reconcile")
        with recording.lock:
            before_edit = recording.keys[seen:].index(edited)
        # Queued behind the wave (first in, first out) it would come after every key waiting.
        assert before_edit < waiting // 2, (before_edit, waiting)
    finally:
        manager.stop()
        thread.join(60)
