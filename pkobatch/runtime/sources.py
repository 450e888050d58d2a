"""Watches of the Flux sources Stacks name in ``spec.fluxSource``, started on first use.

Flux's CRDs are optional: a cluster without Flux must not keep the controller from being
ready, so no Flux kind is watched until a Stack names it (as PKO does). The first
``get`` of a kind starts one reflector per watched namespace; until it has listed, ``get``
answers ``None`` with ``synced`` False, and the reflector's events wake the Stacks that
name the changed object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pkobatch.kube.client import Kube, flux_source_resource
from pkobatch.runtime.interfaces import StackKey
from pkobatch.runtime.reflector import Reflector
from pkobatch.runtime.store import Store

if TYPE_CHECKING:
    from pkobatch.runtime.metrics import Metrics

JSON = dict[str, Any]


class FluxSourceWatches:
    def __init__(
        self,
        kube: Kube,
        namespaces: list[str | None],
        stacks: Store,
        enqueue: Callable[[StackKey], None],
        *,
        metrics: Metrics | None = None,
        read_timeout: float = 90.0,
    ) -> None:
        self._kube = kube
        self._namespaces = namespaces
        self._stacks = stacks
        self._enqueue = enqueue
        self._metrics = metrics
        self._read_timeout = read_timeout
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str], tuple[Store, list[Reflector]]] = {}
        self._stopped = False

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        """The source from its watch (starting the watch of its kind on first use)."""
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
                resource = flux_source_resource(api_version, kind)
                for namespace in self._namespaces:
                    reflector = Reflector(
                        self._kube,
                        resource,
                        store,
                        self._changed(api_version, kind),
                        namespace=namespace,
                        metrics=self._metrics,
                        read_timeout=self._read_timeout,
                    )
                    reflector.start()
                    reflectors.append(reflector)
            self._watches[key] = (store, reflectors)
            return store, reflectors

    def _changed(self, api_version: str, kind: str) -> Callable[[JSON | None, JSON | None], None]:
        group = api_version.rpartition("/")[0]

        def wake(old: JSON | None, new: JSON | None) -> None:
            obj = new if new is not None else old
            if obj is None:
                return
            meta = obj.get("metadata") or {}
            namespace, name = meta.get("namespace"), meta.get("name")
            for stack in self._stacks.list_objects():
                stack_meta = stack.get("metadata") or {}
                ref = ((stack.get("spec") or {}).get("fluxSource") or {}).get("sourceRef") or {}
                if (
                    stack_meta.get("namespace") == namespace
                    and ref.get("kind") == kind
                    and ref.get("name") == name
                    and str(ref.get("apiVersion") or "").rpartition("/")[0] == group
                ):
                    self._enqueue(StackKey(str(namespace), str(stack_meta.get("name"))))

        return wake
