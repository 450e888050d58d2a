"""List-then-watch one resource into a ``Store`` (client-go's reflector, for threads).

The loop, and why each step is there:

1. **List** (paginated) and replace the store's contents; report objects that are new or
   have a new resourceVersion, and objects that disappeared, to ``on_change``. The first
   successful list sets ``synced``.
2. **Watch** from the list's resourceVersion, with bookmarks (so the resourceVersion keeps
   moving on quiet resources), a jittered server-side timeout, and a client *read* timeout
   longer than the bookmark cadence — a connection that silently died ends with an error
   instead of hanging forever.
3. The server closing the watch normally → watch again from the last resourceVersion.
   ``410 Gone`` (an ERROR event or the response status) → list again. Any other failure →
   watch again after an exponential, jittered backoff; after ``RELIST_AFTER_FAILURES`` in a
   row, list again. ``error`` says why the last attempt failed until a list succeeds (a
   kind the server does not serve, or the controller may not list, keeps failing).

Every object is passed through ``transform`` before it is stored (controller-runtime's
cache ``TransformFunc``; by default ``store.slim``): a controller caches only what it reads.
Listed objects are transformed, and packed when the store packs them, page by page.

``on_change(old, new)`` runs on the reflector's thread for every change (``new`` is None on
delete); it must only map and enqueue keys, never do work. The first list's changes (the
whole cache at start-up) go to ``on_initial_list`` instead when one is given, so they can be
queued behind changes that arrive meanwhile (controller-runtime's priority queue does the
same); a later relist reports changes that were missed, to ``on_change``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from pkobatch.api.objects import JSON
from pkobatch.kube.client import Forbidden, Gone, Kube, KubeError, NotFound, Resource
from pkobatch.runtime.interfaces import MapFunc, ObjectKey
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.store import Store, slim

OnChange = Callable[[JSON | None, JSON | None], None]
Echo = Callable[[ObjectKey, JSON | None, JSON | None], bool]
"""``echo(key, old, new)``: does this change only bring back what ``key``'s reconcile wrote
(controller-runtime's predicates)? Then it does not queue ``key``."""
Transform = Callable[[JSON], JSON]
RELIST_AFTER_FAILURES: Final = 5
# A watch that ends this fast without an error still counts as a failure, so a server
# that keeps closing watches at once is not hammered.
MIN_HEALTHY_WATCH_SECONDS: Final = 1.0

log = logging.getLogger(__name__)


def enqueue_keys(
    to_keys: MapFunc, enqueue: Callable[[ObjectKey], None], echo: Echo | None = None
) -> OnChange:
    """An ``on_change`` that enqueues the keys of the object before and after the change
    (an update may move an object from one key to another), except those for which ``echo``
    says the change only brings back the reconciler's own write."""

    def changed(old: JSON | None, new: JSON | None) -> None:
        keys: set[ObjectKey] = set()
        for obj in (old, new):
            if obj is not None:
                keys.update(to_keys(obj))
        for key in keys:
            if echo is None or not echo(key, old, new):
                enqueue(key)

    return changed


class Reflector:
    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        store: Store,
        on_change: OnChange,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        metrics: Metrics | None = None,
        watch_timeout: tuple[int, int] = (300, 600),
        read_timeout: float = 90.0,
        backoff: tuple[float, float] = (0.8, 30.0),
        transform: Transform = slim,
        on_initial_list: OnChange | None = None,
    ) -> None:
        self._kube = kube
        self._resource = resource
        self._store = store
        self._on_change = on_change
        self._on_initial_list = on_initial_list or on_change
        self._namespace = namespace or None
        self._label_selector = label_selector or None
        self._metrics = metrics
        self._watch_timeout = watch_timeout
        self._read_timeout = read_timeout
        self._backoff = backoff
        self._transform = transform
        self.name = resource.plural + (f"@{namespace}" if namespace else "")
        self.synced = threading.Event()
        self.resource_version = ""
        self.lists = 0
        # Why the last list or watch failed ("" once a list succeeds after it).
        self.error = ""
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        with self._lock:
            if self._stream is not None:
                self._stream.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        need_list = True
        failures = 0
        while not self._stopped.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                started = time.monotonic()
                events = self._watch()
                if self._stopped.is_set():
                    return
                self._restarted("closed")
                if events or time.monotonic() - started >= MIN_HEALTHY_WATCH_SECONDS:
                    failures = 0
                    continue
                failures += 1
            except Gone as exc:
                log.info("%s: resourceVersion expired (%s); listing again", self.name, exc.message)
                self._restarted("expired")
                need_list = True
                failures = 0
                continue
            except KubeError as exc:
                if self._stopped.is_set():
                    return
                failures += 1
                self._restarted("error")
                hint = ""
                if isinstance(exc, NotFound) and self._resource.group:
                    hint = (
                        f" (is the CRD {self._resource.plural}.{self._resource.group} installed?)"
                    )
                elif isinstance(exc, Forbidden):
                    hint = " (check the controller's RBAC: deploy/kustomize)"
                self.error = f"{'list' if need_list else 'watch'} failed: {exc}{hint}"
                log.warning("%s: %s", self.name, self.error)
            except Exception:
                if self._stopped.is_set():
                    return
                failures += 1
                self._restarted("error")
                log.exception("%s: unexpected error; listing again", self.name)
                need_list = True
            if failures >= RELIST_AFTER_FAILURES:
                need_list = True
            self._stopped.wait(self._delay(failures))

    def _delay(self, failures: int) -> float:
        base, cap = self._backoff
        return float(min(cap, base * 2 ** max(0, failures - 1))) * random.uniform(0.8, 1.2)

    def _restarted(self, reason: str) -> None:
        if self._metrics:
            self._metrics.watch_restarted(self.name, reason)

    def _list(self) -> None:
        entries, resource_version = self._kube.list_objects(
            self._resource,
            self._namespace,
            label_selector=self._label_selector,
            transform=lambda obj: self._store.entry(self._transform(obj)),
        )
        changed, deleted = self._store.replace(entries, namespace=self._namespace)
        self.resource_version = resource_version
        report = self._on_change if self.synced.is_set() else self._on_initial_list
        self.lists += 1
        self.error = ""
        log.debug("%s: listed %d objects at %s", self.name, len(entries), resource_version)
        for old, new in changed:
            report(old, new)
        for gone in deleted:
            report(gone, None)
        self.synced.set()

    def _watch(self) -> int:
        """Follow one watch request to its end; returns the number of events seen."""
        stream = self._kube.watch(
            self._resource,
            self._namespace,
            resource_version=self.resource_version,
            label_selector=self._label_selector,
            timeout_seconds=random.randint(*self._watch_timeout),
            read_timeout=self._read_timeout,
        )
        with self._lock:
            self._stream = stream
        if self._stopped.is_set():
            stream.stop()
        events = 0
        try:
            for event in stream:
                if self._stopped.is_set():
                    break
                events += 1
                obj = event.object
                if self._metrics:
                    self._metrics.watch_event(self.name, event.type)
                version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                if event.type != "BOOKMARK":
                    self._apply(event.type, obj)
                if version:
                    self.resource_version = version
        finally:
            with self._lock:
                self._stream = None
        return events

    def _apply(self, event_type: str, obj: JSON) -> None:
        obj.setdefault("apiVersion", self._resource.api_version)
        obj.setdefault("kind", self._resource.kind)
        obj = self._transform(obj)
        if event_type == "DELETED":
            self._store.delete(obj)
            self._on_change(obj, None)
        else:
            old = self._store.upsert(obj)
            self._on_change(old, obj)
