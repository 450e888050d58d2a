"""Kubernetes Events about Stacks (``events.k8s.io/v1``), with PKO's reasons.

Events are best effort: a failure to post one is logged and never fails a reconcile. Their
text comes from the plan (run outcomes, spec problems), which never holds secret values:
results redact secrets in the runner, and specs only name Secrets.

They are posted as client-go's event recorder posts them: ``post`` only queues the Event
(its time is taken then) and returns; ``EVENT_SENDERS`` sender threads create the queued
Events, through a client whose rate limit is a token bucket of its own
(``Kube.with_own_rate_limit``: client-go's recorder has a clientset of its own). So an Event
never takes a token a reconcile's write needs, nor holds up the worker that decided it.
Several senders, because one posting after the other is held to one API round trip per
Event: in a commit fan-out of 1,000 Stacks a lone sender had posted 0.3 Events per Stack when
the last Job existed, its bucket far from empty. Each Stack's Events still go out in the
order they were queued: a sender takes the oldest Event whose Stack has none in flight.
The queue holds at most
``EVENT_QUEUE_CAPACITY`` Events (client-go's ``maxQueuedEvents``); when it is full, or after
``stop``, an Event is dropped and counted (``on_dropped``: ``pkobatch_events_dropped_total``).
``stop`` lets the sender post what is queued for up to ``DRAIN_SECONDS``, then drops the rest.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
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
# Threads posting Events at once (each waits on one API round trip at a time).
EVENT_SENDERS: Final = 4


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
    """Queues Events and posts them from ``senders`` threads (``start`` / ``stop``), each
    Stack's in order."""

    def __init__(
        self,
        kube: Kube,
        instance: str | None = None,
        *,
        capacity: int = EVENT_QUEUE_CAPACITY,
        on_dropped: Callable[[int], None] | None = None,
        senders: int = EVENT_SENDERS,
    ) -> None:
        self._kube = kube
        self._instance = (instance or socket.gethostname())[:128]
        self._capacity = capacity
        self._on_dropped = on_dropped
        self._changed = threading.Condition()
        self._pending: deque[dict[str, Any]] = deque()
        self._closed = False
        self._full = False
        # The Stacks (namespace, name) whose Event a sender is posting.
        self._in_flight: set[tuple[str, str]] = set()
        self._senders = [
            threading.Thread(target=self._send_queued, name=f"events-{index}", daemon=True)
            for index in range(senders)
        ]

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
        for sender in self._senders:
            sender.start()

    def stop(self, drain_seconds: float = DRAIN_SECONDS) -> None:
        """Post what is queued (for at most ``drain_seconds``), then stop; later Events drop."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        deadline = time.monotonic() + drain_seconds
        for sender in self._senders:
            if sender.is_alive():
                sender.join(max(0.0, deadline - time.monotonic()))
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
                while (body := self._next()) is None and (self._pending or not self._closed):
                    self._changed.wait()
                if body is None:
                    return
                stack = _regarding(body)
                self._in_flight.add(stack)
            try:
                self._send(body)
            finally:
                with self._changed:
                    self._in_flight.discard(stack)
                    self._changed.notify_all()

    def _next(self) -> dict[str, Any] | None:
        """Take the oldest queued Event whose Stack has none in flight (lock held)."""
        for index, body in enumerate(self._pending):
            if _regarding(body) not in self._in_flight:
                del self._pending[index]
                return body
        return None

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


def _regarding(body: Mapping[str, Any]) -> tuple[str, str]:
    regarding = body["regarding"]
    return str(regarding.get("namespace")), str(regarding.get("name"))
