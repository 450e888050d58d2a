"""Watches of kinds that are started on first use.

Some kinds are optional (their CRDs may not be installed): a cluster without them must not
keep the controller from being ready, so such a kind is not watched until something asks for
one of its objects. The first ``get`` of a kind starts one reflector per watched namespace;
until it has listed, ``get`` answers ``None`` with ``synced`` False, and the reflector's
events enqueue the keys the kind's map function gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pkobatch.api.objects import JSON
from pkobatch.kube.client import Kube, Resource
from pkobatch.runtime.interfaces import MapFunc, ObjectKey
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.reflector import Reflector, enqueue_keys
from pkobatch.runtime.store import Store


class OnDemandWatches:
    def __init__(
        self,
        kube: Kube,
        namespaces: list[str | None],
        resource_for: Callable[[str, str], Resource],
        map_for: Callable[[str, str], MapFunc],
        enqueue: Callable[[ObjectKey], None],
        *,
        metrics: Metrics | None = None,
        read_timeout: float = 90.0,
    ) -> None:
        """``resource_for(api_version, kind)``: the resource to watch; ``map_for(api_version,
        kind)``: the keys an object of that kind wakes."""
        self._kube = kube
        self._namespaces = namespaces
        self._resource_for = resource_for
        self._map_for = map_for
        self._enqueue = enqueue
        self._metrics = metrics
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str], tuple[Store, list[Reflector]]] = {}
        self._stopped = False

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        """The object from its watch (starting the watch of its kind on first use)."""
        store, _ = self._watch(api_version, kind)
        return store.get(namespace, name)

    def synced(self, api_version: str, kind: str) -> bool:
        _, reflectors = self._watch(api_version, kind)
        return all(r.synced.is_set() for r in reflectors)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            reflectors = [r for _, started in self._watches.values() for r in started]
        for reflector in reflectors:
            reflector.stop()

    def _watch(self, api_version: str, kind: str) -> tuple[Store, list[Reflector]]:
        key = (api_version, kind)
        with self._lock:
            existing = self._watches.get(key)
            if existing is not None:
                return existing
            store, reflectors = Store(), []
            if not self._stopped:
                resource = self._resource_for(api_version, kind)
                to_keys = self._map_for(api_version, kind)
                for namespace in self._namespaces:
                    reflector = Reflector(
                        self._kube,
                        resource,
                        store,
                        enqueue_keys(to_keys, self._enqueue),
                        namespace=namespace,
                        metrics=self._metrics,
                        read_timeout=self._read_timeout,
                    )
                    reflector.start()
                    reflectors.append(reflector)
            self._watches[key] = (store, reflectors)
            return store, reflectors
