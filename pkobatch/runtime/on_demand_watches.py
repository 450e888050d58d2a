"""Watches of kinds that are started on first use and stopped when no one needs them.

Some kinds are optional (their CRDs may not be installed): a cluster without them must not
keep the controller from being ready, so such a kind is not watched until a user (a Stack's
key) asks for one of its objects. The first ``lookup`` of a kind starts one reflector per
watched namespace; until it has listed, the object is None with ``synced`` False, and the
reflector's events enqueue the keys the kind's map function gives.

Each user needs at most one kind at a time (the kind of its latest ``lookup``): a user that
names another kind, or ``release``s, stops needing the previous one, and a kind no user needs
has its reflectors stopped and its store dropped. So the watches, and their threads, are
bounded by the kinds the current users name — which the caller limits — never by the kinds
ever named.

A kind the server does not serve (its CRD is not installed) or the controller may not list
keeps its reflectors retrying with their backoff while a user needs it; ``lookup`` reports
the last failure (``error``) so the user can say why it waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from pkobatch.api.objects import JSON
from pkobatch.kube.client import Kube, Resource
from pkobatch.runtime.interfaces import MapFunc, ObjectKey
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.reflector import Reflector, enqueue_keys
from pkobatch.runtime.store import Store


@dataclass(frozen=True)
class Lookup:
    """An object from its kind's watch: None when absent or not listed yet (``synced``
    False); ``error`` is why listing or watching the kind last failed ("" when it did not)."""

    obj: JSON | None
    synced: bool
    error: str = ""


@dataclass
class _Watch:
    store: Store
    reflectors: list[Reflector]
    users: int = 0


class OnDemandWatches:
    def __init__(
        self,
        kube: Kube,
        namespaces: list[str | None],
        map_for: Callable[[Resource], MapFunc],
        enqueue: Callable[[ObjectKey], None],
        *,
        metrics: Metrics | None = None,
        read_timeout: float = 90.0,
    ) -> None:
        """``map_for(resource)``: the keys an object of that resource wakes."""
        self._kube = kube
        self._namespaces = namespaces
        self._map_for = map_for
        self._enqueue = enqueue
        self._metrics = metrics
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._watches: dict[Resource, _Watch] = {}
        self._users: dict[ObjectKey, Resource] = {}
        self._stopped = False

    def lookup(self, resource: Resource, namespace: str, name: str, user: ObjectKey) -> Lookup:
        """The object from its kind's watch, which ``user`` now needs (started on first use)."""
        with self._lock:
            previous = self._users.get(user)
            watch = self._watches.get(resource)
            if watch is None:
                watch = self._watches[resource] = self._start(resource)
            unused = []
            if previous != resource:
                unused = self._unused(previous)
                self._users[user] = resource
                watch.users += 1
        self._stop(unused)
        reflectors = watch.reflectors
        return Lookup(
            watch.store.get(namespace, name),
            bool(reflectors) and all(r.synced.is_set() for r in reflectors),
            next((r.error for r in reflectors if r.error), ""),
        )

    def release(self, user: ObjectKey) -> None:
        """``user`` needs no kind any more (its Stack is gone, or names no such object)."""
        with self._lock:
            unused = self._unused(self._users.pop(user, None))
        self._stop(unused)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            reflectors = [r for watch in self._watches.values() for r in watch.reflectors]
        for reflector in reflectors:
            reflector.stop()

    def _unused(self, resource: Resource | None) -> list[Reflector]:
        """One user less for ``resource``: its watch is forgotten when none is left; the
        reflectors to stop (called with the lock)."""
        watch = self._watches.get(resource) if resource is not None else None
        if resource is None or watch is None:
            return []
        watch.users -= 1
        if watch.users > 0:
            return []
        del self._watches[resource]
        return watch.reflectors

    def _start(self, resource: Resource) -> _Watch:
        watch = _Watch(Store(), [])
        if self._stopped:
            return watch
        to_keys = self._map_for(resource)
        for namespace in self._namespaces:
            reflector = Reflector(
                self._kube,
                resource,
                watch.store,
                enqueue_keys(to_keys, self._enqueue),
                namespace=namespace,
                metrics=self._metrics,
                read_timeout=self._read_timeout,
            )
            reflector.start()
            watch.reflectors.append(reflector)
        return watch

    @staticmethod
    def _stop(reflectors: list[Reflector]) -> None:
        # Without waiting for the threads: the caller is a reconcile, and a reflector in the
        # middle of a list ends when that request does.
        for reflector in reflectors:
            reflector.stop(timeout=0)
