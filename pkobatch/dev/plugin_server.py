"""A Pulumi plugin server on loopback, for tests and benchmarks that need a plugin download.

Pulumi downloads a plugin whose ``pluginDownloadURL`` names an HTTP server as
``<url>/pulumi-resource-<name>-v<version>-<os>-<arch>.tar.gz`` (the binary at the archive's
root). ``PluginServer`` serves one such archive and counts the downloads, so a caller can
tell a cached plugin from a downloaded one.
"""

from __future__ import annotations

import http.server
import shutil
import tarfile
import threading
import urllib.parse
from pathlib import Path
from typing import Final

PROVIDER_NAME: Final = "kubernetes"
PROVIDER_BINARY: Final = f"pulumi-resource-{PROVIDER_NAME}"


def plugin_archive_name(
    name: str, version: str, os_name: str = "linux", arch: str = "amd64"
) -> str:
    """The archive Pulumi asks a plugin server for (`pulumi plugin install --server`)."""
    return f"pulumi-resource-{name}-v{version}-{os_name}-{arch}.tar.gz"


def requested_file(path: str) -> str:
    """The file name a request path asks for; Pulumi escapes a version's `+` as `%2B`."""
    return urllib.parse.unquote(urllib.parse.urlsplit(path).path.lstrip("/"))


class PluginServer:
    """Serves one plugin archive on loopback and counts the requests for it."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self.downloads = 0
        self.other_requests: list[str] = []
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if requested_file(self.path) != server.archive.name:
                    with server._lock:
                        server.other_requests.append(self.path)
                    self.send_error(404)
                    return
                with server._lock:
                    server.downloads += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("Content-Length", str(server.archive.stat().st_size))
                self.end_headers()
                with server.archive.open("rb") as body:
                    shutil.copyfileobj(body, self.wfile)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}/"

    def __enter__(self) -> PluginServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=10)


def pack_plugin(binary: Path, directory: Path, version: str) -> Path:
    """The provider as Pulumi's plugin archive: the binary at the archive's root."""
    archive = directory / plugin_archive_name(PROVIDER_NAME, version)
    # Level 1: the archive is made once per benchmark or test; its download and unpacking are
    # what the runs pay, and a faster gzip keeps the caller's own CPU use down.
    with tarfile.open(archive, "w:gz", compresslevel=1) as packed:
        packed.add(binary, arcname=PROVIDER_BINARY)
    return archive
