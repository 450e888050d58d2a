"""The controller process: runs reflectors, the work queue, workers, leader election, metrics
and health endpoints for one reconciler, and shuts them down in order (controller-runtime's
manager and controller, in one). It knows no kind: what is watched, and which keys each
watched object's change wakes, is given (``Watch``); the composition root that wires the
Stack controller is ``pkobatch.controller.command``.

Start-up: endpoints → (leader election: wait for the lease) → reflectors → wait until every
cache has synced → reconciler ``start()`` → workers → periodic resync. Workers only start on
synced caches, so the first reconciles see a complete picture.

Shutdown (``stop()``, e.g. on SIGTERM): the queue stops handing out keys, in-flight
reconciles finish, the reconciler, reflectors and on-demand watches stop, the lease is
released, endpoints close.

Namespaces selected by label (``ManagerOptions.namespace_filter``): one more reflector caches
every Namespace (its name and labels only), and keys of a namespace whose labels the filter
refuses are neither queued nor reconciled — the namespace's objects stay cached, so a
namespace that gains matching labels has all its keys queued at once, without a new list.
A namespace that loses them is left as it is: its keys are queued once more, to be dropped —
a ``Forgetful`` reconciler forgets them (stops polling for them) — and are not reconciled
again; nothing of it is deleted or changed.

Resync (every ``resync_period``): every cached object goes through its watch's map function
again, as an informer's resync delivers every object to its handlers; the queue coalesces.
Resynced keys, like those of the start-up lists, are queued at low priority (behind any change
that arrives meanwhile), and a watch may opt out (``Watch.resync``) when another watch's
resync covers its keys.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from pkobatch.api.objects import JSON
from pkobatch.kube.client import NAMESPACES, Kube, Resource
from pkobatch.runtime.health import HttpEndpoints, Response, Route, health_routes
from pkobatch.runtime.interfaces import (
    Forgetful,
    MapFunc,
    ObjectKey,
    Reconciler,
    ReconcileResult,
    Service,
)
from pkobatch.runtime.leader import LeaderElector
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.reflector import Echo, Reflector, Transform, enqueue_keys
from pkobatch.runtime.secure_metrics import MetricsAuthorizer, authorized, server_context
from pkobatch.runtime.store import Store, object_key, slim
from pkobatch.runtime.worker import WorkerPool
from pkobatch.runtime.workqueue import WorkQueue

RESYNC_PERIOD: Final = 10 * 3600.0
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

log = logging.getLogger(__name__)


def exit_on_lost_lease() -> None:
    """Stop acting at once: another replica may already lead. The Deployment restarts us."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


def default_lease_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class Watch:
    """Keep ``store`` filled with ``resource`` (in every watched namespace), each object
    passed through ``transform`` first; a change of an object enqueues the keys ``to_keys``
    gives for it."""

    resource: Resource
    store: Store
    to_keys: MapFunc
    label_selector: str = ""
    transform: Transform = slim
    # False: a resync skips this watch's objects (their keys are queued by another watch's
    # resync anyway, and listing a store whose objects are kept packed decodes them all).
    resync: bool = True
    # Changes that only echo the reconciler's own writes queue nothing (not applied to the
    # first list, whose changes are all news).
    echo: Echo | None = None


@dataclass(frozen=True)
class LeaderElection:
    lease_name: str
    lease_namespace: str  # "": the pod's namespace
    lease_duration: float
    renew_deadline: float
    retry_period: float


@dataclass(frozen=True)
class ManagerOptions:
    kind: str  # what the keys name (the ``controllerKind`` of log lines)
    namespaces: Sequence[str] = ()  # empty: all namespaces
    # None: every namespace of ``namespaces``; else only those whose labels it matches.
    namespace_filter: NamespaceFilter | None = None
    workers: int = 4
    leader_election: LeaderElection | None = None
    # "0" or "" disables an endpoint.
    health_addr: str = "0"
    metrics_addr: str = "0"
    # HTTPS, TokenReview and SubjectAccessReview in front of /metrics (runtime.secure_metrics);
    # the certificate's directory, or "" for a self-signed one.
    metrics_secure: bool = False
    metrics_cert_dir: str = ""


class NamespaceFilter(Protocol):
    """Which namespaces' keys are reconciled, by the namespace's labels."""

    def matches(self, labels: Mapping[str, str]) -> bool: ...


def namespace_labels(namespace: JSON) -> JSON:
    """What the Namespace cache keeps of a Namespace: its name and labels."""
    meta = namespace.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
            "labels": meta.get("labels") or {},
        }
    }


def selected(selector: NamespaceFilter, namespace: JSON | None) -> bool:
    """Does ``selector`` select the (cached) Namespace? A deleted one (None) is not."""
    return namespace is not None and selector.matches(
        (namespace.get("metadata") or {}).get("labels") or {}
    )


class Stoppable(Protocol):
    def stop(self) -> None: ...


class QueueEnqueuer:
    """The ``Enqueuer`` handed to the reconciler."""

    def __init__(self, queue: WorkQueue[ObjectKey]) -> None:
        self._queue = queue

    def enqueue(self, key: ObjectKey, after: float | None = None) -> None:
        if after is None or after <= 0:
            self._queue.add(key)
        else:
            self._queue.add_after(key, after)

    def reschedule(self, key: ObjectKey, due_within: float, after: float | None) -> None:
        self._queue.reschedule(key, due_within, after)


class Manager:
    def __init__(
        self,
        kube: Kube,
        queue: WorkQueue[ObjectKey],
        reconciler: Reconciler,
        watches: Sequence[Watch],
        options: ManagerOptions,
        *,
        metrics: Metrics,
        also_stop: Sequence[Stoppable] = (),
        identity: str | None = None,
        on_lost_lease: Callable[[], None] = exit_on_lost_lease,
        resync_period: float = RESYNC_PERIOD,
        read_timeout: float = 90.0,
    ) -> None:
        """``queue`` feeds the workers (the reconciler's ``Enqueuer`` adds to it too);
        ``also_stop``: what else to stop with the reflectors (on-demand watches)."""
        self._options = options
        self.metrics = metrics
        self._on_lost_lease = on_lost_lease
        self._resync_period = resync_period
        self._stop = threading.Event()
        self._stopping = False
        self.queue = queue
        self.metrics.track_queue(queue)
        self.reconciler = reconciler
        self._watches = list(watches)
        self._also_stop = list(also_stop)
        self.reflectors: list[Reflector] = []
        self.namespaces = Store()
        namespaces: list[str | None] = [*options.namespaces] or [None]
        for namespace in namespaces:
            for watch in self._watches:
                to_keys = self._in_scope(watch.to_keys)
                self.reflectors.append(
                    Reflector(
                        kube,
                        watch.resource,
                        watch.store,
                        enqueue_keys(to_keys, queue.add, watch.echo),
                        namespace=namespace,
                        label_selector=watch.label_selector,
                        metrics=self.metrics,
                        read_timeout=read_timeout,
                        transform=watch.transform,
                        on_initial_list=enqueue_keys(to_keys, queue.add_low_priority),
                    )
                )
        if options.namespace_filter is not None:
            self.reflectors.append(
                Reflector(
                    kube,
                    NAMESPACES,
                    self.namespaces,
                    self._namespace_changed,
                    metrics=self.metrics,
                    read_timeout=read_timeout,
                    transform=namespace_labels,
                )
            )
        election = options.leader_election
        self.elector: LeaderElector | None = None
        if election is not None:
            self.elector = LeaderElector(
                kube,
                namespace=election.lease_namespace or default_lease_namespace(),
                name=election.lease_name,
                identity=identity or f"{socket.gethostname()}_{uuid.uuid4()}",
                lease_duration=election.lease_duration,
                renew_deadline=election.renew_deadline,
                retry_period=election.retry_period,
                metrics=self.metrics,
            )
            self.metrics.set_leader(election.lease_name, False)
        self._workers = WorkerPool(
            queue,
            _InScope(reconciler, self.in_scope),
            self.metrics,
            options.workers,
            kind=options.kind,
        )
        self._endpoints: list[HttpEndpoints] = []
        if options.health_addr not in ("", "0"):
            self._endpoints.append(HttpEndpoints(options.health_addr, health_routes(self.ready)))
        if options.metrics_addr not in ("", "0"):
            scrape: Route = self._scrape
            context: ssl.SSLContext | None = None
            if options.metrics_secure:
                scrape = authorized(MetricsAuthorizer(kube), self._scrape)
                context = server_context(options.metrics_cert_dir, socket.gethostname())
            self._endpoints.append(
                HttpEndpoints(options.metrics_addr, {"/metrics": scrape}, ssl_context=context)
            )

    # -- state ----------------------------------------------------------------------------

    def synced(self) -> bool:
        return all(reflector.synced.is_set() for reflector in self.reflectors)

    def ready(self) -> bool:
        """Ready when caches are synced, or while standing by for leadership."""
        if self._stopping:
            return False
        standby = self.elector is not None and not self.elector.is_leader
        return standby or self.synced()

    def in_scope(self, namespace: str) -> bool:
        """Are the keys of ``namespace`` reconciled (its labels match the namespace filter)?"""
        selector = self._options.namespace_filter
        if selector is None:
            return True
        return selected(selector, self.namespaces.get("", namespace))

    def _in_scope(self, to_keys: MapFunc) -> MapFunc:
        if self._options.namespace_filter is None:
            return to_keys
        return lambda obj: [key for key in to_keys(obj) if self.in_scope(key.namespace)]

    def _namespace_changed(self, old: JSON | None, new: JSON | None) -> None:
        """A namespace that starts or stops matching: queue the keys of its cached objects,
        to be reconciled, or dropped (``_InScope``: the reconciler forgets them)."""
        selector = self._options.namespace_filter
        if selector is None or selected(selector, old) == selected(selector, new):
            return
        name = object_key(new or old or {}).name
        keys: set[ObjectKey] = set()
        for watch in self._watches:
            if watch.resync:
                for obj in watch.store.list_objects():
                    if object_key(obj).namespace == name:
                        keys.update(watch.to_keys(obj))
        for key in keys:
            self.queue.add(key)
        state = "selected" if selected(selector, new) else "no longer selected"
        log.info("namespace %s %s: queued %d keys", name, state, len(keys))

    @property
    def endpoint_ports(self) -> list[int]:
        return [endpoint.port for endpoint in self._endpoints]

    def _scrape(self, headers: Mapping[str, str]) -> Response:
        content_headers, body = self.metrics.exposition(
            headers.get("accept", ""), headers.get("accept-encoding", "")
        )
        return 200, content_headers, body

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run()`` to shut down (safe from signal handlers and other threads); readiness
        drops at once so no new traffic is routed here."""
        self._stopping = True
        self._stop.set()

    def run(self) -> None:
        """Run until ``stop()``; returns after an orderly shutdown."""
        for endpoint in self._endpoints:
            endpoint.start()
        renew_stop = threading.Event()
        started: list[str] = []
        try:
            if self.elector is not None:
                if not self.elector.acquire(self._stop):
                    return
                self.elector.keep_renewing(renew_stop, self._on_lost_lease)
            for reflector in self.reflectors:
                reflector.start()
            started.append("reflectors")
            log.info("waiting for caches to sync")
            while not self.synced():
                if self._stop.wait(0.1):
                    return
            log.info(
                "caches synced",
                extra={"objects": {w.resource.plural: len(w.store) for w in self._watches}},
            )
            if isinstance(self.reconciler, Service):
                self.reconciler.start()
                started.append("reconciler")
            self._workers.start()
            started.append("workers")
            log.info("started %d workers", self._options.workers)
            while not self._stop.wait(self._resync_period):
                self._resync()
        finally:
            self._shutdown(started, renew_stop)

    def _resync(self) -> None:
        keys: set[ObjectKey] = set()
        for watch in self._watches:
            if watch.resync:
                for obj in watch.store.list_objects():
                    keys.update(self._in_scope(watch.to_keys)(obj))
        for key in keys:
            self.queue.add_low_priority(key)
        log.info("resync: queued %d keys", len(keys))

    def _shutdown(self, started: list[str], renew_stop: threading.Event) -> None:
        self._stopping = True
        log.info("shutting down: finishing in-flight reconciles")
        self.queue.shutdown()
        if "workers" in started:
            self._workers.join()
        if "reconciler" in started and isinstance(self.reconciler, Service):
            self.reconciler.stop()
        if "reflectors" in started:
            for reflector in self.reflectors:
                reflector.stop()
        for other in self._also_stop:
            other.stop()
        renew_stop.set()
        if self.elector is not None:
            self.elector.release()
        for endpoint in self._endpoints:
            endpoint.stop()
        log.info("shut down")


class _InScope:
    """The reconciler, for keys of namespaces in scope; a key of another namespace (queued
    when its namespace lost its labels, or by the reconciler's own timers and pollers) is
    not reconciled, and a ``Forgetful`` reconciler forgets it."""

    def __init__(self, reconciler: Reconciler, in_scope: Callable[[str], bool]) -> None:
        self._reconciler = reconciler
        self._in_scope = in_scope

    def reconcile(self, key: ObjectKey) -> ReconcileResult:
        if self._in_scope(key.namespace):
            return self._reconciler.reconcile(key)
        if isinstance(self._reconciler, Forgetful):
            self._reconciler.forget(key)
        return ReconcileResult()
