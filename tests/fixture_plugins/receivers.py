"""Webhook receivers on loopback for notification tests (docs/notifications.md).

Function scope
--------------
``receivers_on_loopback`` -> ``start(answer=200, check=None)`` -> (``Receiver``, port): a
recording webhook receiver (``Receiver``: every request and its answer; ``holding``/``release``
to hold requests unanswered; ``answer`` the answer to give; ``check`` judges each body, and
one with problems is answered 400 and recorded with them), shut down after the test. Every
body it gets is also kept for the sentinel scan (``sentinels.record_received``).
``start(answer=202, check=flux_event_problems)`` receives as notification-controller's event
server does.

``hanging`` -> ``HangingServer``: accepts connections and never answers them.

Helpers: ``hook_secret`` (a receiver's Secret), ``receivers(*names)`` (a
``spec.notifications`` of webhook receivers ``<name>`` with Secrets ``<name>-hook``),
``pending(stack)`` (its ``status.notifications.pending``).

Flux's event format: ``flux_event_problems(body)`` is what notification-controller's event
server (which decodes ``eventv1.Event`` of ``github.com/fluxcd/pkg/apis/event/v1beta1``)
would find wrong with a body, field by field; ``flux_metadata(event)`` is the metadata its
providers get (``cleanupMetadata``, ``excludeInternalMetadata`` and ``combineEventMetadata``
of its ``internal/server``).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers.controller_harness import create_secret
from helpers.sentinels import record_received

from pkobatch.kube.client import Kube

JSON = dict[str, Any]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int
    problems: list[str] = field(default_factory=list)


HELD = 0  # ``Received.answered`` of a request held without an answer


@dataclass
class Receiver:
    """A webhook receiver on loopback that records every request and its answer (``answer``,
    200 unless changed). While ``holding`` is set it answers nothing until ``release`` is
    set."""

    answer: int = 200
    check: Callable[[bytes], list[str]] | None = None
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def accepted(self) -> list[JSON]:
        with self.lock:
            return [json.loads(r.body) for r in self.received if 200 <= r.answered < 300]

    def requests(self) -> list[Received]:
        with self.lock:
            return list(self.received)


def serve(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            record_received("the body of a request a test's webhook receiver got", body)
            held = receiver.holding.is_set()
            problems = receiver.check(body) if receiver.check else []
            answer = 400 if problems else receiver.answer
            with receiver.lock:
                receiver.received.append(
                    Received(dict(self.headers.items()), body, HELD if held else answer, problems)
                )
            if held:
                receiver.release.wait(600)
            self.send_response(503 if held else answer)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class HangingServer:
    """Accepts connections and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request; it is never answered
            conn.setblocking(False)
            self.held.append(conn)

    def open_requests(self) -> int:
        """Requests whose sender still waits for an answer (the connection is open)."""
        return sum(1 for conn in list(self.held) if _open(conn))

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def _open(conn: socket.socket) -> bool:
    """Whether the peer still holds ``conn``: read what it sent until it would block (open)
    or the end of the stream (closed)."""
    while True:
        try:
            if conn.recv(65536) == b"":
                return False
        except BlockingIOError:
            return True
        except OSError:
            return False


@pytest.fixture
def receivers_on_loopback() -> Iterator[Callable[..., tuple[Receiver, int]]]:
    """``start()`` -> (receiver, port): a recording webhook receiver, shut down after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(
        answer: int = 200, check: Callable[[bytes], list[str]] | None = None
    ) -> tuple[Receiver, int]:
        state = Receiver(answer, check)
        servers.append(serve(state))
        return state, int(servers[-1].server_address[1])

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


def hook_secret(kube: Kube, namespace: str, name: str, url: str, key: str = "") -> None:
    create_secret(kube, namespace, name, {"url": url, **({"signingKey": key} if key else {})})


def receivers(*names: str) -> JSON:
    return {
        "receivers": [
            {"name": name, "type": "webhook", "secretRef": {"name": f"{name}-hook"}}
            for name in names
        ]
    }


def pending(stack: JSON) -> JSON:
    return dict(((stack.get("status") or {}).get("notifications") or {}).get("pending") or {})


# -- Flux's event format ---------------------------------------------------------------------

FLUX_EVENT_GROUP = "event.toolkit.fluxcd.io"
# eventv1.Event (v1beta1): its JSON fields, and those without omitempty (+required).
FLUX_EVENT_FIELDS = {
    "involvedObject",
    "severity",
    "timestamp",
    "message",
    "reason",
    "metadata",
    "reportingController",
    "reportingInstance",
}
FLUX_EVENT_REQUIRED = {
    "involvedObject",
    "severity",
    "timestamp",
    "message",
    "reason",
    "reportingController",
}
# corev1.ObjectReference's fields.
OBJECT_REFERENCE_FIELDS = {
    "kind",
    "namespace",
    "name",
    "uid",
    "apiVersion",
    "resourceVersion",
    "fieldPath",
}
# metav1.Time: Go's time.RFC3339.
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
MAX_FLUX_MESSAGE = 39_000


def _object_group(event: JSON) -> str:
    api_version = str((event.get("involvedObject") or {}).get("apiVersion") or "")
    return api_version.partition("/")[0] if "/" in api_version else ""


def flux_event_problems(body: bytes) -> list[str]:
    """What is wrong with ``body`` as an event for notification-controller (none: it decodes
    into eventv1.Event, every required field is set, an Alert can match it — the involved
    object's kind, namespace and name — and no metadata entry is dropped on arrival)."""
    try:
        event = json.loads(body)
    except ValueError as exc:
        return [f"not JSON: {exc}"]
    if not isinstance(event, dict):
        return ["not a JSON object"]
    problems = [f"unknown field {key}" for key in sorted(set(event) - FLUX_EVENT_FIELDS)]
    problems += [f"missing {key}" for key in sorted(FLUX_EVENT_REQUIRED - set(event))]
    reference = event.get("involvedObject")
    if not isinstance(reference, dict):
        return [*problems, "involvedObject is not an object"]
    problems += [
        f"involvedObject has unknown field {key}"
        for key in sorted(set(reference) - OBJECT_REFERENCE_FIELDS)
    ]
    problems += [
        f"involvedObject.{key} is not a string"
        for key, value in reference.items()
        if not isinstance(value, str)
    ]
    problems += [
        f"involvedObject.{key} is empty"
        for key in ("apiVersion", "kind", "namespace", "name", "uid")
        if not reference.get(key)
    ]
    if event.get("severity") not in ("info", "error"):
        problems.append(f"severity {event.get('severity')!r} is neither info nor error")
    if not isinstance(event.get("timestamp"), str) or not RFC3339.fullmatch(event["timestamp"]):
        problems.append(f"timestamp {event.get('timestamp')!r} is not RFC 3339")
    message = event.get("message")
    if not isinstance(message, str) or not message or len(message) > MAX_FLUX_MESSAGE:
        problems.append("message is not a string of 1 to 39000 characters")
    for key in ("reason", "reportingController"):
        if not isinstance(event.get(key), str) or not event.get(key):
            problems.append(f"{key} is not a non-empty string")
    if not isinstance(event.get("reportingInstance", ""), str):
        problems.append("reportingInstance is not a string")
    metadata = event.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        return [*problems, "metadata is not a map of strings"]
    kept = (f"{FLUX_EVENT_GROUP}/", f"{_object_group(event)}/")
    problems += [
        f"metadata {key} is dropped (neither {kept[0]} nor {kept[1]})"
        for key in sorted(metadata)
        if not key.startswith(kept)
    ]
    return problems


def flux_metadata(event: JSON) -> dict[str, str]:
    """The event's metadata as notification-controller hands it to providers (no Alert
    metadata): the involved object's group prefix stripped, the token (only its duplicate
    filter's) and the checksum and digest gone."""
    group = _object_group(event)
    dropped = {f"{group}/token", f"{group}/checksum", f"{group}/digest"}
    return {
        key.removeprefix(f"{group}/"): value
        for key, value in (event.get("metadata") or {}).items()
        if key.startswith(f"{group}/") and key not in dropped
    }
