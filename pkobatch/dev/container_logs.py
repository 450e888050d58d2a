"""The kubelet's container-log endpoint, served by the node agent, so that ``pods/log``
(``kubectl logs``, ``pkobatch logs``, the controller's reads) works as in a cluster.

The API server answers ``GET /api/v1/namespaces/NS/pods/POD/log`` by calling the kubelet of
the pod's node at ``https://<node InternalIP>:<status.daemonEndpoints.kubeletEndpoint.Port>
/containerLogs/NS/POD/CONTAINER`` with its kubelet client certificate
(``--kubelet-client-certificate``) and checks the kubelet's serving certificate against
``--kubelet-certificate-authority``. The node agent registers its Node with those fields
(``NodeAgent.register_node``) and serves this endpoint over TLS, accepting only client
certificates of the cluster's CA.

Query parameters as the kubelet reads them: ``follow`` (stream until the container ends),
``tailLines`` and ``limitBytes``; ``timestamps``, ``sinceSeconds``, ``sinceTime`` and
``previous`` are not supported and refused with 400, never silently ignored. The node agent
keeps one output file per pod, so every container of a pod shows the same output.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs, unquote, urlparse

log = logging.getLogger(__name__)

_UNSUPPORTED: Final = ("timestamps", "sinceSeconds", "sinceTime", "previous")
_CHUNK: Final = 64 * 1024


@dataclass(frozen=True)
class KubeletTls:
    """The node agent's serving certificate for its container-log endpoint, and the CA
    whose client certificates (the API server's) it accepts."""

    cert: Path
    key: Path
    client_ca: Path


@dataclass(frozen=True)
class ContainerLog:
    """Where a pod's output is, and whether its containers have ended."""

    path: Path
    ended: Callable[[], bool]


@dataclass(frozen=True)
class LogRequest:
    namespace: str
    pod: str
    container: str
    follow: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


class BadLogRequest(ValueError):
    pass


def parse_log_request(target: str) -> LogRequest | None:
    """The request for ``/containerLogs/NS/POD/CONTAINER?...``; None for any other path."""
    url = urlparse(target)
    parts = [unquote(p) for p in url.path.split("/")]
    if len(parts) != 5 or parts[0] != "" or parts[1] != "containerLogs" or not all(parts[2:]):
        return None
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    for name in _UNSUPPORTED:
        if query.get(name) not in (None, "", "false"):
            raise BadLogRequest(f"the node agent does not support {name}")

    def number(name: str) -> int | None:
        value = query.get(name)
        if value in (None, ""):
            return None
        try:
            parsed = int(value)
        except ValueError:
            raise BadLogRequest(f"{name} must be an integer, got {value!r}") from None
        if parsed < 0:
            raise BadLogRequest(f"{name} must not be negative")
        return parsed

    return LogRequest(
        namespace=parts[2],
        pod=parts[3],
        container=parts[4],
        follow=query.get("follow") in ("true", "1"),
        tail_lines=number("tailLines"),
        limit_bytes=number("limitBytes"),
    )


def tail_offset(path: Path, lines: int) -> int:
    """The byte offset where the last ``lines`` lines of ``path`` start."""
    with path.open("rb") as handle:
        handle.seek(0, 2)
        end = position = handle.tell()
        if lines == 0:
            return end
        found = 0
        while position > 0:
            step = min(_CHUNK, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            # A final newline ends the last line; it does not start another one.
            if position + step == end and block.endswith(b"\n"):
                block = block[:-1]
            index = len(block)
            while True:
                index = block.rfind(b"\n", 0, index)
                if index < 0:
                    break
                found += 1
                if found == lines:
                    return position + index + 1
        return 0


class ContainerLogServer:
    """``start()`` serves on a free port of 127.0.0.1 (``port``); ``stop()`` ends it."""

    def __init__(
        self,
        lookup: Callable[[str, str], ContainerLog | None],
        *,
        cert: Path,
        key: Path,
        client_ca: Path,
        poll_interval: float = 0.2,
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(str(client_ca))
        self._lookup = lookup
        self._poll_interval = poll_interval
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._serve(self)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("container logs: " + format, *args)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="container-logs", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    # -- one request ------------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            request = parse_log_request(handler.path)
        except BadLogRequest as exc:
            self._plain(handler, HTTPStatus.BAD_REQUEST, str(exc))
            return
        if request is None:
            self._plain(handler, HTTPStatus.NOT_FOUND, "the node agent serves /containerLogs only")
            return
        found = self._lookup(request.namespace, request.pod)
        if found is None or not found.path.is_file():
            self._plain(
                handler,
                HTTPStatus.NOT_FOUND,
                f"no output of pod {request.namespace}/{request.pod} on this node",
            )
            return
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            if request.follow:
                self._stream(handler, request, found)
            else:
                self._whole(handler, request, found)

    @staticmethod
    def _plain(handler: BaseHTTPRequestHandler, status: HTTPStatus, text: str) -> None:
        body = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    @staticmethod
    def _start_offset(request: LogRequest, path: Path) -> int:
        return tail_offset(path, request.tail_lines) if request.tail_lines is not None else 0

    def _whole(
        self, handler: BaseHTTPRequestHandler, request: LogRequest, found: ContainerLog
    ) -> None:
        with found.path.open("rb") as source:
            source.seek(self._start_offset(request, found.path))
            data = (
                source.read() if request.limit_bytes is None else source.read(request.limit_bytes)
            )
        handler.send_response(HTTPStatus.OK)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _stream(
        self, handler: BaseHTTPRequestHandler, request: LogRequest, found: ContainerLog
    ) -> None:
        handler.send_response(HTTPStatus.OK)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        budget = request.limit_bytes
        with found.path.open("rb") as source:
            source.seek(self._start_offset(request, found.path))
            while not self._stopping.is_set():
                # Decide before reading, so everything written before the end is sent.
                ended = found.ended()
                data = source.read(_CHUNK if budget is None else min(_CHUNK, budget))
                if data:
                    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    handler.wfile.flush()
                    if budget is not None:
                        budget -= len(data)
                        if budget <= 0:
                            break
                    continue
                if ended:
                    break
                time.sleep(self._poll_interval)
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
