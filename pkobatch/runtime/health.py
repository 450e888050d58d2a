"""Small HTTP endpoints on a thread: health probes and the Prometheus scrape.

``/healthz`` answers 200 while the process runs. ``/readyz`` answers 200 when the manager
says it is ready (caches synced, or standing by for leadership) and 503 otherwise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Response = tuple[int, str, bytes]
Route = Callable[[], Response]

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """``":8080"`` / ``"127.0.0.1:8080"`` / ``"[::1]:8080"`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpEndpoints:
    """Serve ``routes`` (path -> handler) on ``address`` until ``stop()``."""

    def __init__(self, address: str, routes: Mapping[str, Route]) -> None:
        routes = dict(routes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, content_type, body = 404, "text/plain", b"not found\n"
                else:
                    try:
                        status, content_type, body = route()
                    except Exception:
                        log.exception("handler for %s failed", self.path)
                        status, content_type, body = 500, "text/plain", b"internal error\n"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Probes every few seconds would drown the controller's own logs."""

        self._server = ThreadingHTTPServer(parse_address(address), Handler)
        self._server.daemon_threads = True
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
    def healthz() -> Response:
        return 200, "text/plain", b"ok\n"

    def readyz() -> Response:
        if ready():
            return 200, "text/plain", b"ok\n"
        return 503, "text/plain", b"not ready\n"

    return {"/healthz": healthz, "/readyz": readyz}
