"""The contract between the runtime (watch, queue, workers) and a reconciler.

Modelled on controller-runtime: the reconciler gets only a key, reads everything it needs
from the stores (level-based), and answers with a ``ReconcileResult`` or an exception:

- returns ``ReconcileResult()``: done, per-key backoff reset;
- returns ``ReconcileResult(requeue_after=s)``: backoff reset, reconcile again in ``s`` seconds
  (schedules, polling, waiting for a Job);
- raises ``TerminalError``: logged and counted, not retried (spec errors a retry cannot fix);
- raises anything else: retried with per-key exponential backoff.

Which objects' events wake which keys is the caller's business: a ``MapFunc`` per watched
resource (controller-runtime's ``EnqueueRequestsFromMapFunc``). The runtime knows no kind.
A reconciler that also has ``start()`` and ``stop()`` (``Service``) is started after the
caches sync and stopped at shutdown; one with ``forget(key)`` (``Forgetful``) hears of keys
that left the scope.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pkobatch.api.objects import JSON


@dataclass(frozen=True, order=True)
class ObjectKey:
    """The namespace and name of the object a reconcile is for."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


MapFunc = Callable[[JSON], Iterable[ObjectKey]]
"""The keys to reconcile when ``obj`` changed (for a delete: the object as it was)."""


@dataclass(frozen=True)
class ReconcileResult:
    requeue_after: float | None = None
    """Seconds until the next reconcile of this key; None: only when something changes."""


class TerminalError(Exception):
    """A reconcile failure that retrying cannot fix (invalid spec); not requeued."""


class Reconciler(Protocol):
    def reconcile(self, key: ObjectKey) -> ReconcileResult: ...


@runtime_checkable
class Service(Protocol):
    """Optional lifecycle of a reconciler: started after the caches sync, stopped at shutdown."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@runtime_checkable
class Forgetful(Protocol):
    """Optional: told when a key leaves the controller's scope (its namespace's labels stopped
    matching), so the reconciler stops the work it does on the key's behalf between
    reconciles (polling, watches). Its objects are not deleted: the key may come back."""

    def forget(self, key: ObjectKey) -> None: ...


class Enqueuer(Protocol):
    def enqueue(self, key: ObjectKey, after: float | None = None) -> None:
        """Reconcile ``key`` now (coalesced with pending requests) or in ``after`` seconds."""
        ...

    def reschedule(self, key: ObjectKey, due_within: float, after: float | None) -> None:
        """A wake-up of ``key`` due within ``due_within`` seconds became moot: reconcile it
        in ``after`` seconds instead (None: only on a change)."""
        ...
