"""Kubernetes Events about Stacks (``events.k8s.io/v1``), with PKO's reasons.

Events are best effort: a failure to post one is logged and never fails a reconcile. Their
text comes from the plan (run outcomes, spec problems), which never holds secret values:
results redact secrets in the runner, and specs only name Secrets.

They are posted as client-go's event recorder posts them: ``post`` only queues the Event
(its time is taken then) and returns; one sender thread creates the queued Events in order,
through a client whose rate limit is a token bucket of its own (``Kube.with_own_rate_limit``:
client-go's recorder has a clientset of its own). So an Event never takes a token a
reconcile's write needs, nor holds up the worker that decided it. The queue holds at most
``EVENT_QUEUE_CAPACITY`` Events (client-go's ``maxQueuedEvents``); when it is full, or after
``stop``, an Event is dropped and counted (``on_dropped``: ``pkobatch_events_dropped_total``).
``stop`` lets the sender post what is queued for up to ``DRAIN_SECONDS``, then drops the rest.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pkobatch.api.messages import bound_message
from pkobatch.api.timestamps import format_micro_time
from pkobatch.kube.client import EVENTS, Kube, KubeError

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "pkobatch.io/controller"
ACTION: Final = "Reconcile"
MAX_NOTE_CHARS: Final = 1024
EVENT_QUEUE_CAPACITY: Final = 1000
DRAIN_SECONDS: Final = 5.0


def event_body(
    stack: Mapping[str, Any],
    event_type: str,
    reason: str,
    message: str,
    now: datetime,
    instance: str,
) -> dict[str, Any]:
    meta = stack.get("metadata") or {}
    note = bound_message(message, MAX_NOTE_CHARS)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
            "namespace": meta.get("namespace"),
        },
        "eventTime": format_micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": ACTION,
        "reason": reason,
        "note": note,
        "type": event_type,
        "regarding": {
            "apiVersion": stack.get("apiVersion", "pulumi.com/v1"),
            "kind": stack.get("kind", "Stack"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
    }


class EventRecorder:
    """Queues Events and posts them from one thread (``start`` / ``stop``)."""

    def __init__(
        self,
        kube: Kube,
        instance: str | None = None,
        *,
        capacity: int = EVENT_QUEUE_CAPACITY,
        on_dropped: Callable[[int], None] | None = None,
    ) -> None:
        self._kube = kube
        self._instance = (instance or socket.gethostname())[:128]
        self._capacity = capacity
        self._on_dropped = on_dropped
        self._changed = threading.Condition()
        self._pending: deque[dict[str, Any]] = deque()
        self._closed = False
        self._full = False
        self._sender: threading.Thread | None = None

    @property
    def instance(self) -> str:
        """This controller as the Events' ``reportingInstance`` names it (its pod)."""
        return self._instance

    def post(self, stack: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        body = event_body(stack, event_type, reason, message, datetime.now(UTC), self._instance)
        with self._changed:
            accepted = not self._closed and len(self._pending) < self._capacity
            if accepted:
                self._pending.append(body)
                self._full = False
                self._changed.notify()
            warn = not accepted and not self._closed and not self._full
            self._full = self._full or warn
        if not accepted:
            self._dropped(1)
        if warn:
            log.warning(
                "%d Events wait to be posted: dropping new ones until there is room "
                "(pkobatch_events_dropped_total counts them)",
                self._capacity,
            )

    def start(self) -> None:
        self._sender = threading.Thread(target=self._send_queued, name="events", daemon=True)
        self._sender.start()

    def stop(self, drain_seconds: float = DRAIN_SECONDS) -> None:
        """Post what is queued (for at most ``drain_seconds``), then stop; later Events drop."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._sender is not None:
            self._sender.join(drain_seconds)
        with self._changed:
            left = len(self._pending)
            self._pending.clear()
        if left:
            self._dropped(left)
            log.warning("stopping: %d queued Events dropped", left)

    def _dropped(self, count: int) -> None:
        if self._on_dropped is not None:
            self._on_dropped(count)

    def _send_queued(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if not self._pending:
                    return
                body = self._pending.popleft()
            self._send(body)

    def _send(self, body: dict[str, Any]) -> None:
        try:
            self._kube.create(EVENTS, body, body["metadata"]["namespace"])
        except KubeError as exc:
            log.warning(
                "cannot post event %s for stack %s/%s: %s",
                body["reason"],
                body["metadata"]["namespace"],
                body["regarding"]["name"],
                exc,
            )
