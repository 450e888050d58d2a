"""The controller process: wires reflectors, stores, the work queue, workers, leader
election, metrics and health endpoints, and shuts them down in order.

Start-up: endpoints → (leader election: wait for the lease) → reflectors → wait until every
cache has synced → reconciler ``start()`` → workers → periodic resync. Workers only start on
synced caches, so the first reconciles see a complete picture.

Shutdown (``stop()``, e.g. on SIGTERM): the queue stops handing out keys, in-flight
reconciles finish, the reconciler and reflectors stop, the lease is released, endpoints
close.

Events → keys: a Stack event enqueues the Stack; a Job or ConfigMap event enqueues the
Stack it belongs to (``store.stack_name_of``) if that Stack is in the cache — objects of
Stacks outside this controller's namespaces or label selector are ignored.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pkobatch.api.constants import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from pkobatch.config import Settings
from pkobatch.controller.cache import cache_job, cache_result, cache_stack
from pkobatch.kube.client import CONFIGMAPS, JOBS, PROGRAMS, STACKS, Kube, Resource
from pkobatch.runtime.health import HttpEndpoints, Response, health_routes
from pkobatch.runtime.interfaces import ReconcilerFactory, Service, StackKey, Stores
from pkobatch.runtime.leader import LeaderElector
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.reflector import Reflector, Transform
from pkobatch.runtime.sources import FluxSourceWatches
from pkobatch.runtime.store import Store, slim, stack_name_of
from pkobatch.runtime.worker import WorkerPool
from pkobatch.runtime.workqueue import WorkQueue

JSON = dict[str, Any]
RESYNC_PERIOD: Final = 10 * 3600.0
MANAGED_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
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


EventHandler = Callable[[JSON | None, JSON | None], None]


class QueueEnqueuer:
    """The ``Enqueuer`` handed to the reconciler."""

    def __init__(self, queue: WorkQueue[StackKey]) -> None:
        self._queue = queue

    def enqueue(self, key: StackKey, after: float | None = None) -> None:
        if after is None or after <= 0:
            self._queue.add(key)
        else:
            self._queue.add_after(key, after)


class Manager:
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        reconciler_factory: ReconcilerFactory,
        *,
        metrics: Metrics | None = None,
        identity: str | None = None,
        on_lost_lease: Callable[[], None] = exit_on_lost_lease,
        resync_period: float = RESYNC_PERIOD,
        read_timeout: float = 90.0,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self.metrics = metrics or Metrics()
        self._on_lost_lease = on_lost_lease
        self._resync_period = resync_period
        self._stop = threading.Event()
        self._stopping = False
        self.stores = Stores(stacks=Store(), jobs=Store(), configmaps=Store(), programs=Store())
        self.queue: WorkQueue[StackKey] = WorkQueue(metrics=self.metrics.queue_hooks())
        self.metrics.track_queue(self.queue)
        self.metrics.track_stores(self.stores)
        self.reconciler = reconciler_factory(
            kube, self.stores, settings, self.metrics, QueueEnqueuer(self.queue)
        )
        self.reflectors: list[Reflector] = []
        namespaces: list[str | None] = [*settings.namespaces] or [None]
        self.flux_sources = FluxSourceWatches(
            kube,
            namespaces,
            self.stores.stacks,
            self.queue.add,
            metrics=self.metrics,
            read_timeout=read_timeout,
        )
        self.stores.flux_sources = self.flux_sources
        for namespace in namespaces:
            watched: list[tuple[Resource, Store, str, EventHandler, Transform]] = [
                (
                    STACKS,
                    self.stores.stacks,
                    settings.label_selector,
                    self._stack_changed,
                    cache_stack,
                ),
                (JOBS, self.stores.jobs, MANAGED_SELECTOR, self._child_changed, cache_job),
                (
                    CONFIGMAPS,
                    self.stores.configmaps,
                    MANAGED_SELECTOR,
                    self._child_changed,
                    cache_result,
                ),
                (PROGRAMS, self.stores.programs, "", self._program_changed, slim),
            ]
            for resource, store, selector, handler, transform in watched:
                self.reflectors.append(
                    Reflector(
                        kube,
                        resource,
                        store,
                        handler,
                        namespace=namespace,
                        label_selector=selector,
                        metrics=self.metrics,
                        read_timeout=read_timeout,
                        transform=transform,
                    )
                )
        election = settings.leader_election
        self.elector: LeaderElector | None = None
        if election.enabled:
            self.elector = LeaderElector(
                kube,
                namespace=election.lease_namespace or default_lease_namespace(),
                name=election.lease_name,
                identity=identity or f"{socket.gethostname()}_{uuid.uuid4()}",
                lease_duration=election.lease_duration.total_seconds(),
                renew_deadline=election.renew_deadline.total_seconds(),
                retry_period=election.retry_period.total_seconds(),
                metrics=self.metrics,
            )
            self.metrics.set_leader(election.lease_name, False)
        self._workers = WorkerPool(self.queue, self.reconciler, self.metrics, settings.workers)
        self._endpoints: list[HttpEndpoints] = []
        if settings.health_addr not in ("", "0"):
            self._endpoints.append(HttpEndpoints(settings.health_addr, health_routes(self.ready)))
        if settings.metrics_addr not in ("", "0"):
            self._endpoints.append(HttpEndpoints(settings.metrics_addr, {"/metrics": self._scrape}))

    # -- state ----------------------------------------------------------------------------

    def synced(self) -> bool:
        return all(reflector.synced.is_set() for reflector in self.reflectors)

    def ready(self) -> bool:
        """Ready when caches are synced, or while standing by for leadership."""
        if self._stopping:
            return False
        standby = self.elector is not None and not self.elector.is_leader
        return standby or self.synced()

    @property
    def endpoint_ports(self) -> list[int]:
        return [endpoint.port for endpoint in self._endpoints]

    def _scrape(self) -> Response:
        return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.exposition()

    # -- events -> keys -------------------------------------------------------------------

    def _stack_changed(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        if obj is not None:
            meta = obj.get("metadata") or {}
            self.queue.add(StackKey(str(meta.get("namespace", "")), str(meta.get("name", ""))))

    def _child_changed(self, old: JSON | None, new: JSON | None) -> None:
        keys = set()
        for obj in (old, new):
            if obj is None:
                continue
            stack_name = stack_name_of(obj)
            namespace = str((obj.get("metadata") or {}).get("namespace", ""))
            if stack_name and self.stores.stacks.get(namespace, stack_name) is not None:
                keys.add(StackKey(namespace, stack_name))
        for key in keys:
            self.queue.add(key)

    def _program_changed(self, old: JSON | None, new: JSON | None) -> None:
        """A Program event wakes every Stack of its namespace that names it."""
        obj = new if new is not None else old
        if obj is None:
            return
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        for stack in self.stores.stacks.list_objects():
            stack_meta = stack.get("metadata") or {}
            reference = (stack.get("spec") or {}).get("programRef") or {}
            if (
                stack_meta.get("namespace") == namespace
                and isinstance(reference, dict)
                and reference.get("name") == name
            ):
                self.queue.add(StackKey(namespace, str(stack_meta.get("name", ""))))

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
                extra={
                    "stacks": len(self.stores.stacks),
                    "jobs": len(self.stores.jobs),
                    "configmaps": len(self.stores.configmaps),
                },
            )
            if isinstance(self.reconciler, Service):
                self.reconciler.start()
                started.append("reconciler")
            self._workers.start()
            started.append("workers")
            log.info("started %d workers", self._settings.workers)
            while not self._stop.wait(self._resync_period):
                for key in self.stores.stacks.list_keys():
                    self.queue.add(key)
                log.info("resync: queued all %d Stacks", len(self.stores.stacks))
        finally:
            self._shutdown(started, renew_stop)

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
        self.flux_sources.stop()
        renew_stop.set()
        if self.elector is not None:
            self.elector.release()
        for endpoint in self._endpoints:
            endpoint.stop()
        log.info("shut down")
