"""The contract between the runtime (watch, queue, workers) and the Stack reconciler.

Modelled on controller-runtime: the reconciler gets only a key, reads everything it needs
from the stores (level-based), and answers with a ``ReconcileResult`` or an exception:

- returns ``ReconcileResult()``: done, per-key backoff reset;
- returns ``ReconcileResult(requeue_after=s)``: backoff reset, reconcile again in ``s`` seconds
  (schedules, polling, waiting for a Job);
- raises ``TerminalError``: logged and counted, not retried (spec errors a retry cannot fix);
- raises anything else: retried with per-key exponential backoff.

The runtime builds the reconciler once through a ``ReconcilerFactory`` that receives the API
client, the stores, the settings, the metrics and an ``Enqueuer`` to wake up other Stacks
(prerequisites, shared source polling). If the reconciler also has ``start()`` and ``stop()``
(``Service``), the manager calls them around the workers' lifetime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pkobatch.config import Settings
    from pkobatch.kube.client import Kube
    from pkobatch.runtime.metrics import Metrics
    from pkobatch.runtime.store import Store


JSON = dict[str, Any]


@dataclass(frozen=True, order=True)
class StackKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ReconcileResult:
    requeue_after: float | None = None
    """Seconds until the next reconcile of this key; None: only when something changes."""


class TerminalError(Exception):
    """A reconcile failure that retrying cannot fix (invalid spec); not requeued."""


class Reconciler(Protocol):
    def reconcile(self, key: StackKey) -> ReconcileResult: ...


@runtime_checkable
class Service(Protocol):
    """Optional lifecycle of a reconciler: started after the caches sync, stopped at shutdown."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Enqueuer(Protocol):
    def enqueue(self, key: StackKey, after: float | None = None) -> None:
        """Reconcile ``key`` now (coalesced with pending requests) or in ``after`` seconds."""
        ...


class FluxSources(Protocol):
    """The Flux sources Stacks name, from watches started on first use
    (``pkobatch.runtime.sources``)."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None: ...

    def synced(self, api_version: str, kind: str) -> bool: ...


@dataclass
class Stores:
    """The watched objects: Stacks, the Jobs and ConfigMaps labelled managed-by pkobatch,
    and the Programs Stacks may name in ``spec.programRef``.

    ``jobs.for_stack(namespace, stack_name)`` and ``configmaps.for_stack(...)`` give a Stack's
    own objects.
    """

    stacks: Store
    jobs: Store
    configmaps: Store
    programs: Store
    # None: Flux sources are not watched (a reconciler built without the runtime's Manager).
    flux_sources: FluxSources | None = None


ReconcilerFactory = Callable[["Kube", Stores, "Settings", "Metrics", Enqueuer], Reconciler]
"""``build_reconciler(kube, stores, settings, metrics, enqueuer) -> Reconciler``."""
