"""Delivery of notifications: the thin I/O shell around ``pkobatch.controller.notify``.

The reconcile only decides (``Notifier.add_events``: pure, on the decision's status) and hands
the written status to ``Notifier.track``, which queues what is pending and returns at once.
Everything slow happens on the notifier's own sender threads: reading the receiver's Secret,
the HTTP POST (bounded by a timeout), waiting between attempts (exponential backoff, bounded
attempts), and the status write that records a delivery. A receiver that is down or hangs
therefore holds at most its sender threads, never a reconcile.

Each (event, receiver) pair is delivered on its own: one receiver's failure does not repeat
the message to another. The pairs a process has queued or finished are remembered, so a
reconcile that still sees an entry in a stale cache does not queue it again.

Secret values (the URL, the signing key) are read at delivery time and never leave this
module: logs, Events and metrics name the receiver and its Secret, and every error text is
scrubbed of both values before it is used.

Each attempt connects to an address judged before the connection, never through a proxy or
a redirect (``pkobatch.controller.pinned_post``). Why an attempt failed goes to the
controller's log; the ``NotificationFailed`` Event gives the Stack's author only a generic
reason (``DeliveryFailed.public``).

The namespace default is the ConfigMap labelled ``pkobatch.io/notifications=default`` in the
Stack's namespace, watched by a reflector of its own (only those ConfigMaps).
"""

from __future__ import annotations

import base64
import heapq
import ipaddress
import itertools
import logging
import ssl
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, cast

from prometheus_client import CollectorRegistry, Counter, Gauge

from pkobatch.api.constants import FIELD_MANAGER_CONTROLLER
from pkobatch.api.objects import JSON
from pkobatch.api.stack.spec import NOTIFICATION_EVENTS, RECEIVER_TYPES, Notifications
from pkobatch.api.status import StatusObject
from pkobatch.controller.events import REPORTING_CONTROLLER, EventRecorder
from pkobatch.controller.notify import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    NAMESPACE_DEFAULT_LABEL,
    NAMESPACE_DEFAULT_LABEL_VALUE,
    SIGNATURE_HEADER,
    SIGNING_KEY_KEY,
    URL_KEY,
    Network,
    Receiver,
    attempts_made,
    attempts_patch,
    delivered_patch,
    delivery_id,
    flux_body,
    namespace_default,
    occurrences,
    pending_of,
    receiver_named,
    retry_delay,
    signature,
    slack_body,
    stack_notifications,
    verdict,
    webhook_body,
    with_pending,
)
from pkobatch.controller.pinned_post import GENERIC_FAILURE, DeliveryFailed, pinned_address, post_to
from pkobatch.kube.client import CONFIGMAPS, SECRETS, STACKS, Kube, KubeError, NotFound
from pkobatch.runtime.reflector import Reflector
from pkobatch.runtime.store import Store

if TYPE_CHECKING:
    from datetime import datetime

    from pkobatch.config import NotificationSettings
    from pkobatch.controller.decision import Decision

log = logging.getLogger(__name__)
EVENT_NOTIFICATION_FAILED: Final = "NotificationFailed"
# (Stack uid, event id, receiver) pairs remembered as queued or done.
REMEMBERED: Final = 10_000
DEFAULTS_SYNC_TIMEOUT: Final = 10.0
STATUS_WRITE_ATTEMPTS: Final = 3


class NotificationMetrics:
    """``pkobatch_notifications_*`` (docs/operations.md), on the controller's registry."""

    def __init__(self, registry: CollectorRegistry, depth: Callable[[], int]) -> None:
        labels = ["receiver_type", "event"]
        self.sent = Counter(
            "pkobatch_notifications_sent_total",
            "Notifications a receiver accepted (2xx)",
            labels,
            registry=registry,
        )
        self.failed = Counter(
            "pkobatch_notifications_failed_total",
            "Notifications given up: refused (4xx), or still failing after the last attempt",
            labels,
            registry=registry,
        )
        self.retried = Counter(
            "pkobatch_notifications_retried_total",
            "Attempts that failed and will be tried again",
            labels,
            registry=registry,
        )
        self.dropped = Counter(
            "pkobatch_notifications_dropped_total",
            "Undelivered events dropped to keep a Stack's pending list bounded",
            registry=registry,
        )
        queue = Gauge(
            "pkobatch_notifications_queue_depth",
            "Deliveries waiting to be sent (including those waiting for a retry)",
            registry=registry,
        )
        queue.set_function(lambda: float(depth()))
        for receiver_type in RECEIVER_TYPES:
            for event in NOTIFICATION_EVENTS:
                for counter in (self.sent, self.failed, self.retried):
                    counter.labels(receiver_type, event)


@dataclass(frozen=True)
class Delivery:
    """One event for one receiver."""

    stack: Mapping[str, Any]  # apiVersion, kind, metadata, spec.stack: what a body names
    event_id: str
    entry: Mapping[str, Any]
    receiver: Receiver
    # False for a Stack being released: its status is not written again.
    durable: bool

    @property
    def target(self) -> tuple[str, str]:
        """The receiver's Secret: deliveries to one target go one at a time."""
        return str(self.stack["metadata"]["namespace"]), self.receiver.secret

    @property
    def key(self) -> tuple[str, str, str]:
        uid = str((self.stack.get("metadata") or {}).get("uid") or "")
        return uid, self.event_id, self.receiver.name


@dataclass(order=True)
class _Queued:
    due: float
    seq: int
    delivery: Delivery = field(compare=False)
    attempt: int = field(compare=False, default=1)


def _snapshot(stack: Mapping[str, Any]) -> JSON:
    meta = stack.get("metadata") or {}
    return {
        "apiVersion": stack.get("apiVersion", "pulumi.com/v1"),
        "kind": stack.get("kind", "Stack"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "spec": {"stack": (stack.get("spec") or {}).get("stack")},
    }


class Notifier:
    def __init__(
        self,
        kube: Kube,
        settings: NotificationSettings,
        registry: CollectorRegistry,
        namespaces: list[str | None],
        events: EventRecorder,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._events = events
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[_Queued] = []
        self._seq = itertools.count()
        self._remembered: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        # (uid, event id) -> receivers not done yet, for the status write after each.
        self._remaining: dict[tuple[str, str], set[str]] = {}
        self._busy: set[tuple[str, str]] = set()
        self._stopped = False
        self._threads: list[threading.Thread] = []
        self.metrics = NotificationMetrics(registry, self.depth)
        self.defaults = Store()
        self._reflectors = [
            Reflector(
                kube,
                CONFIGMAPS,
                self.defaults,
                self._default_changed,
                namespace=namespace,
                label_selector=f"{NAMESPACE_DEFAULT_LABEL}={NAMESPACE_DEFAULT_LABEL_VALUE}",
            )
            for namespace in namespaces
        ]
        self._denied: list[Network] = [ipaddress.ip_network(n) for n in settings.denied_cidrs]
        self._allowed: list[Network] = [ipaddress.ip_network(n) for n in settings.allowed_cidrs]
        self._tls = ssl.create_default_context()

    # -- Service -----------------------------------------------------------------------------

    def start(self) -> None:
        for reflector in self._reflectors:
            reflector.start()
        # Events decided before the defaults are known would miss their receivers.
        deadline = self._clock() + DEFAULTS_SYNC_TIMEOUT
        for reflector in self._reflectors:
            if not reflector.synced.wait(max(deadline - self._clock(), 0.0)):
                log.warning("the namespace-default notification ConfigMaps are not listed yet")
        for index in range(self._settings.senders):
            thread = threading.Thread(target=self._send_loop, name=f"notify-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for reflector in self._reflectors:
            reflector.stop()

    def depth(self) -> int:
        with self._cond:
            return len(self._heap) + len(self._busy)

    # -- what the reconcile calls ----------------------------------------------------------

    def config_for(self, stack: Mapping[str, Any]) -> Notifications | None:
        namespace = str((stack.get("metadata") or {}).get("namespace") or "")
        found = sorted(
            (
                cm
                for cm in self.defaults.list_objects()
                if cm["metadata"].get("namespace") == namespace
            ),
            key=lambda cm: str(cm["metadata"].get("name")),
        )
        default = namespace_default(found[0]).config if found else None
        return stack_notifications(stack.get("spec") or {}, default)

    def add_events(
        self, stack: Mapping[str, Any], decision: Decision, now: datetime
    ) -> Mapping[str, Any] | None:
        """Record the events of this reconcile's status change in ``decision.status`` (pure; the
        outbox). Returns the status whose pending entries ``track`` must deliver once the
        decision is carried out: ``decision.status``, or for a released Stack the status decided
        for it, which is never written."""
        new = decision.status if decision.status is not None else decision.decided_status
        found = occurrences(stack.get("status") or {}, new, now)
        if new is None or not found:
            return new  # the common case: no event, and no receivers to look up
        outbox, dropped = with_pending(new, found, self.config_for(stack))
        for event_id in dropped:
            log.warning("stack %s: dropped undelivered event %s", _name(stack), event_id)
            self.metrics.dropped.inc()
        if decision.status is not None:
            decision.status = cast(StatusObject, outbox)
        return outbox

    def track(
        self, stack: Mapping[str, Any], status: Mapping[str, Any] | None, durable: bool
    ) -> None:
        """Queue every pending entry of ``status`` not queued or done already (after a
        restart: all of them). Returns at once."""
        if status is None:
            return
        pending = pending_of(status)
        if not pending:
            return
        config = self.config_for(stack)
        snapshot = _snapshot(stack)
        uid = str(snapshot["metadata"]["uid"] or "")
        for event_id, entry in pending.items():
            for name, receiver_type in dict(entry.get("receivers") or {}).items():
                # A receiver gone from the configuration since the event keeps no Secret:
                # the attempt gives up at once and says so.
                receiver = receiver_named(config, name) or Receiver(name, receiver_type, "")
                delivery = Delivery(snapshot, event_id, entry, receiver, durable)
                # After a restart: the attempt after those the entry records.
                attempt = attempts_made(entry, name) + 1
                with self._cond:
                    if delivery.key in self._remembered:
                        continue
                    self._remember(delivery.key)
                    self._remaining.setdefault((uid, event_id), set()).add(name)
                    heapq.heappush(
                        self._heap, _Queued(self._clock(), next(self._seq), delivery, attempt)
                    )
                    self._cond.notify()

    # -- sender threads ---------------------------------------------------------------------

    def _remember(self, key: tuple[str, str, str]) -> None:
        self._remembered[key] = None
        self._remembered.move_to_end(key)
        while len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)

    def _next_due(self, now: float) -> _Queued | None:
        """The earliest due delivery to a receiver no other sender is talking to (so a
        receiver that hangs holds one sender, not all of them); called with the lock."""
        ready = [q for q in self._heap if q.due <= now and q.delivery.target not in self._busy]
        if not ready:
            return None
        item = min(ready)
        self._heap.remove(item)
        heapq.heapify(self._heap)
        self._busy.add(item.delivery.target)
        return item

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    now = self._clock()
                    item = self._next_due(now)
                    if item is not None:
                        break
                    future = [q.due - now for q in self._heap if q.due > now]
                    self._cond.wait(min(future) if future else None)
            try:
                self._attempt(item)
            except Exception:
                log.exception("notification %s: unexpected error", item.delivery.event_id)
            finally:
                with self._cond:
                    self._busy.discard(item.delivery.target)
                    self._cond.notify_all()

    def _attempt(self, item: _Queued) -> None:
        delivery = item.delivery
        receiver, event = delivery.receiver, str(delivery.entry.get("event") or "")
        most = self._settings.max_attempts
        if not receiver.secret:
            why = "the receiver is no longer configured"
            self._give_up(delivery, why, why)
            return
        if item.attempt > most:
            # A controller that stopped between the last attempt and giving up.
            why = f"{GENERIC_FAILURE} (attempt {most} of {most})"
            self._give_up(delivery, f"all {most} attempts were made before a restart", why)
            return
        try:
            self._send(delivery)
        except DeliveryFailed as exc:
            if verdict(exc.status, receiver.type) == "failed" or item.attempt >= most:
                progress = f"(attempt {item.attempt} of {most})"
                self._give_up(delivery, f"{exc} {progress}", f"{exc.public} {progress}")
                return
            self.metrics.retried.labels(receiver.type, event).inc()
            delay = retry_delay(
                item.attempt,
                self._settings.backoff_base.total_seconds(),
                self._settings.backoff_cap.total_seconds(),
            )
            log.info(
                "notification %s of stack %s to receiver %s: %s (attempt %d of %d); retrying "
                "in %.0fs",
                delivery.event_id,
                _name(delivery.stack),
                receiver.name,
                exc,
                item.attempt,
                most,
                delay,
            )
            if delivery.durable:
                # One try: a lost count costs at most one attempt more after a restart, and
                # the next failed attempt writes a higher one anyway.
                self._write_pending(
                    delivery,
                    attempts_patch(delivery.event_id, receiver.name, item.attempt),
                    "record a failed attempt of",
                    tries=1,
                )
            with self._cond:
                heapq.heappush(
                    self._heap,
                    _Queued(self._clock() + delay, next(self._seq), delivery, item.attempt + 1),
                )
                self._cond.notify()
            return
        self.metrics.sent.labels(receiver.type, event).inc()
        log.info(
            "notification %s of stack %s sent to receiver %s",
            delivery.event_id,
            _name(delivery.stack),
            receiver.name,
        )
        self._done(delivery)

    def _give_up(self, delivery: Delivery, why: str, public: str) -> None:
        """``why`` goes to the controller's log, ``public`` to the Stack's Event."""
        receiver = delivery.receiver
        self.metrics.failed.labels(receiver.type, str(delivery.entry.get("event") or "")).inc()
        failed = f"notification {delivery.event_id} to receiver {receiver.name} failed"
        log.warning("stack %s: %s: %s", _name(delivery.stack), failed, why)
        self._events.post(
            delivery.stack, "Warning", EVENT_NOTIFICATION_FAILED, f"{failed}: {public}"
        )
        self._done(delivery)

    def _send(self, delivery: Delivery) -> None:
        """One attempt; raises ``DeliveryFailed`` with a text free of secret values."""
        receiver = delivery.receiver
        namespace = str(delivery.stack["metadata"]["namespace"])
        unusable = f"its Secret {receiver.secret} is missing, unreadable or holds no usable url"
        try:
            secret = self._kube.get(SECRETS, receiver.secret, namespace)
        except NotFound:
            raise DeliveryFailed(
                f"Secret {receiver.secret} does not exist", public=unusable
            ) from None
        except KubeError as exc:
            raise DeliveryFailed(
                f"cannot read Secret {receiver.secret}: {exc.reason}", public=unusable
            ) from None
        data = secret.get("data") or {}
        url = _decoded(data.get(URL_KEY)).strip()
        key = _decoded(data.get(SIGNING_KEY_KEY))
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            parts, port = urllib.parse.urlsplit(""), 0
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.username:
            raise DeliveryFailed(
                f"key {URL_KEY} of Secret {receiver.secret} must hold an http(s) URL without "
                "user info",
                public=unusable,
            )
        ident = delivery_id(delivery.stack, delivery.event_id)
        event = str(delivery.entry.get("event") or "")
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "pkobatch-controller",
            EVENT_HEADER: event,
            DELIVERY_HEADER: ident,
        }
        if receiver.type == "slack":
            body = slack_body(delivery.stack, delivery.entry)
        elif receiver.type == "flux":
            body = flux_body(
                delivery.stack,
                delivery.entry,
                ident,
                controller=REPORTING_CONTROLLER,
                instance=self._events.instance,
            )
        else:
            body = webhook_body(delivery.stack, delivery.event_id, delivery.entry, ident)
            if key:
                headers[SIGNATURE_HEADER] = signature(key.encode(), body)
        target = parts.path or "/"
        if parts.query:
            target += f"?{parts.query}"
        address = pinned_address(parts.hostname, port, self._denied, self._allowed)
        timeout = self._settings.timeout.total_seconds()
        tls = self._tls if parts.scheme == "https" else None
        status = post_to(
            parts.hostname, port, address, target, body, headers, timeout, tls, (url, key)
        )
        if verdict(status, receiver.type) != "sent":
            raise DeliveryFailed(f"{address} answered HTTP {status}", status)

    def _done(self, delivery: Delivery) -> None:
        uid, event_id, name = delivery.key
        with self._cond:
            remaining = self._remaining.get((uid, event_id), set())
            remaining.discard(name)
            left = len(remaining)
            if not remaining:
                self._remaining.pop((uid, event_id), None)
        if delivery.durable:
            patch = delivered_patch(delivery.event_id, delivery.receiver.name, left)
            self._write_pending(delivery, patch, "record as done")

    def _write_pending(
        self, delivery: Delivery, patch: JSON, what: str, tries: int = STATUS_WRITE_ATTEMPTS
    ) -> None:
        """Merge ``patch`` into the Stack's pending list (status subresource)."""
        meta = delivery.stack["metadata"]
        for attempt in range(1, tries + 1):
            try:
                self._kube.merge_patch(
                    STACKS,
                    str(meta["name"]),
                    patch,
                    str(meta["namespace"]),
                    subresource="status",
                    field_manager=FIELD_MANAGER_CONTROLLER,
                )
                return
            except NotFound:
                return
            except KubeError as exc:
                if attempt == tries:
                    log.warning(
                        "stack %s: cannot %s notification %s: %s",
                        _name(delivery.stack),
                        what,
                        delivery.event_id,
                        exc,
                    )
                    return
                time.sleep(float(attempt))

    def _default_changed(self, old: JSON | None, new: JSON | None) -> None:
        if new is not None:
            problem = namespace_default(new).problem
            if problem:
                log.warning("namespace-default notifications are off: %s", problem)


def _decoded(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    try:
        return base64.b64decode(value).decode()
    except ValueError:
        return ""


def _name(stack: Mapping[str, Any]) -> str:
    meta = stack.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
