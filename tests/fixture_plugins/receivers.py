"""Webhook receivers on loopback for notification tests (docs/notifications.md).

Function scope
--------------
``receivers_on_loopback`` -> ``start()`` -> (``Receiver``, port): a recording webhook receiver
(``Receiver``: every request and its answer; ``holding``/``release`` to hold requests
unanswered; ``status`` the answer to give), shut down after the test. Every body it gets is
also kept for the sentinel scan (``sentinels.record_received``).

``hanging`` -> ``HangingServer``: accepts connections and never answers them.

Helpers: ``hook_secret`` (a receiver's Secret), ``receivers(*names)`` (a
``spec.notifications`` of webhook receivers ``<name>`` with Secrets ``<name>-hook``),
``pending(stack)`` (its ``status.notifications.pending``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from controller_harness import create_secret
from sentinels import record_received

from pkobatch.kube.client import Kube

JSON = dict[str, Any]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


HELD = 0  # ``Received.answered`` of a request held without an answer


@dataclass
class Receiver:
    """A webhook receiver on loopback that records every request and its answer (``answer``,
    200 unless changed). While ``holding`` is set it answers nothing until ``release`` is
    set."""

    answer: int = 200
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def accepted(self) -> list[JSON]:
        with self.lock:
            return [json.loads(r.body) for r in self.received if r.answered == 200]

    def requests(self) -> list[Received]:
        with self.lock:
            return list(self.received)


def serve(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            record_received("the body of a request a test's webhook receiver got", body)
            held = receiver.holding.is_set()
            answer = receiver.answer
            with receiver.lock:
                receiver.received.append(
                    Received(dict(self.headers.items()), body, HELD if held else answer)
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
def receivers_on_loopback() -> Iterator[Callable[[], tuple[Receiver, int]]]:
    """``start()`` -> (receiver, port): a recording webhook receiver, shut down after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start() -> tuple[Receiver, int]:
        state = Receiver()
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
