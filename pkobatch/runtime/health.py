"""Small HTTP endpoints on a thread: health probes and the Prometheus scrape. A GET route
sees the request's headers (names lowercased) and answers a status, headers and a body.

The push receiver (``pkobatch.controller.receiver``) is served the same way, with a ``post``
route, and the Program artifact server (``pkobatch.controller.program_artifacts``) with a
prefix route: one handler for every path below ``/programs/``.

``/healthz`` answers 200 while the process runs. ``/readyz`` answers 200 when the manager
says it is ready (caches synced, or standing by for leadership) and 503 otherwise.
"""

from __future__ import annotations

import functools
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

Response = tuple[int, Mapping[str, str], bytes]
Route = Callable[[Mapping[str, str]], Response]
# A GET route for every path below a prefix: it gets the rest of the path, then the headers.
PrefixRoute = Callable[[str, Mapping[str, str]], Response]
# A client that sends nothing for this long is dropped (one thread per connection).
SOCKET_TIMEOUT: Final = 30.0
# The most of a refused POST's body read (and dropped) before answering.
DRAIN_BYTES: Final = 64 * 1024
PLAIN_TEXT: Final[Mapping[str, str]] = {"Content-Type": "text/plain"}


@dataclass(frozen=True)
class PostRequest:
    """A POST as its route sees it: header names lowercased; ``length`` is the
    Content-Length (None: missing or not a number); ``read()`` reads that many bytes."""

    path: str
    headers: Mapping[str, str]
    length: int | None
    read: Callable[[], bytes]


@dataclass(frozen=True)
class Reply:
    """The answer to a POST: a status, one line of text and extra headers."""

    status: int
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)


PostRoute = Callable[[PostRequest], Reply]

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that breaks off (or fails the TLS handshake) is its own problem: a line
        at debug level, not a traceback on stderr."""
        log.debug("connection from %s failed", client_address, exc_info=True)


def parse_address(address: str) -> tuple[str, int]:
    """``":8080"`` / ``"127.0.0.1:8080"`` / ``"[::1]:8080"`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpEndpoints:
    """Serve ``routes`` (path -> handler) on ``address`` until ``stop()``; a path no route
    names goes to the ``prefix_routes`` handler of its first matching prefix; ``post``, if
    given, answers every POST; HTTPS with ``ssl_context``."""

    def __init__(
        self,
        address: str,
        routes: Mapping[str, Route],
        post: PostRoute | None = None,
        ssl_context: ssl.SSLContext | None = None,
        prefix_routes: Mapping[str, PrefixRoute] | None = None,
    ) -> None:
        routes = dict(routes)
        prefixes = dict(prefix_routes or {})

        def route_of(path: str) -> Route | None:
            if path in routes:
                return routes[path]
            for prefix, handler in prefixes.items():
                if path.startswith(prefix):
                    return functools.partial(handler, path[len(prefix) :])
            return None

        class Handler(BaseHTTPRequestHandler):
            timeout = SOCKET_TIMEOUT

            def do_GET(self) -> None:
                route = route_of(self.path.split("?", 1)[0])
                if route is None:
                    status, headers, body = 404, PLAIN_TEXT, b"not found\n"
                else:
                    try:
                        status, headers, body = route(
                            {name.lower(): value for name, value in self.headers.items()}
                        )
                    except Exception:
                        log.exception("handler for %s failed", self.path)
                        status, headers, body = 500, PLAIN_TEXT, b"internal error\n"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if post is None:
                    reply = Reply(405, "this endpoint takes no POST")
                else:
                    length_header = self.headers.get("Content-Length", "")
                    length = int(length_header) if length_header.isdigit() else None
                    consumed = False

                    def read() -> bytes:
                        nonlocal consumed
                        consumed = True
                        return self.rfile.read(length or 0)

                    request = PostRequest(
                        self.path.split("?", 1)[0],
                        {name.lower(): value for name, value in self.headers.items()},
                        length,
                        read,
                    )
                    try:
                        reply = post(request)
                    except Exception:
                        log.exception("POST to %s failed", request.path)
                        reply = Reply(500, "internal error")
                    # Closing with a small body unread would reset the connection, and the
                    # client could lose the answer; a large one is left unread.
                    if not consumed and length is not None and length <= DRAIN_BYTES:
                        self.rfile.read(length)
                body = f"{reply.message}\n".encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                # The body may be left unread (a refused request): do not read it as the next.
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds would drown the controller's own logs."""

        self._server = _Server(parse_address(address), Handler)
        if ssl_context is not None:
            # The handshake happens on the connection's first read, in its own thread: a
            # client that stalls it holds up no one else.
            self._server.socket = ssl_context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"http-{address}", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def health_routes(ready: Callable[[], bool]) -> dict[str, Route]:
    def healthz(headers: Mapping[str, str]) -> Response:
        return 200, PLAIN_TEXT, b"ok\n"

    def readyz(headers: Mapping[str, str]) -> Response:
        if ready():
            return 200, PLAIN_TEXT, b"ok\n"
        return 503, PLAIN_TEXT, b"not ready\n"

    return {"/healthz": healthz, "/readyz": readyz}
