"""Reading the output of a run's pod.

In a cluster the kubelet keeps a container's output and the API server proxies it
(``pods/log``). The local control plane has no kubelet: its node agent writes each pod's
output to ``<dir>/<namespace>/<pod>.log``. ``pod_logs_for`` picks the directory when
``PKOBATCH_POD_LOG_DIR`` names it (``pkobatch dev up`` prints the export), the API otherwise,
so the controller and the CLI read logs the same way in both places.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, Protocol

from pkobatch.kube.client import PODS, Kube, KubeError, NotFound

POD_LOG_DIR_ENV: Final = "PKOBATCH_POD_LOG_DIR"
_TERMINAL_PHASES: Final = ("Succeeded", "Failed")


class LogsUnavailable(Exception):
    """The pod's output cannot be read (no such pod or log, or the node does not serve it)."""


class PodLogs(Protocol):
    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        """The output so far (the last ``tail_lines`` lines when given)."""
        ...

    def follow(self, namespace: str, pod: str, *, container: str | None = None) -> Iterator[str]:
        """Lines (with their newline) as they are written, until the container ends."""
        ...


class ApiPodLogs:
    """``pods/log`` through the API server (needs a kubelet behind it)."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        try:
            return self._kube.request_text(
                PODS.path(namespace, pod, "log"),
                query={"container": container, "tailLines": tail_lines},
            )
        except KubeError as exc:
            raise LogsUnavailable(f"logs of pod {namespace}/{pod}: {exc.message}") from exc

    def follow(self, namespace: str, pod: str, *, container: str | None = None) -> Iterator[str]:
        try:
            yield from self._kube.stream_lines(
                PODS.path(namespace, pod, "log"), query={"container": container, "follow": "true"}
            )
        except KubeError as exc:
            raise LogsUnavailable(f"logs of pod {namespace}/{pod}: {exc.message}") from exc


class DirectoryPodLogs:
    """``<directory>/<namespace>/<pod>.log`` files written by the local node agent (one log per
    pod: ``container`` is ignored). ``follow`` stops once the pod reached a terminal phase or
    is gone — which it asks ``kube`` about — and everything written before has been read."""

    def __init__(self, directory: Path, kube: Kube | None = None, poll_interval: float = 0.3):
        self.directory = directory
        self._kube = kube
        self._poll_interval = poll_interval

    def path(self, namespace: str, pod: str) -> Path:
        return self.directory / namespace / f"{pod}.log"

    def read(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        path = self.path(namespace, pod)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise LogsUnavailable(f"logs of pod {namespace}/{pod}: no file {path}") from exc
        if tail_lines is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail_lines:] if tail_lines > 0 else [])
        return text

    def _ended(self, namespace: str, pod: str) -> bool:
        if self._kube is None:
            return False
        try:
            obj = self._kube.get(PODS, pod, namespace)
        except NotFound:
            return True
        return (obj.get("status") or {}).get("phase") in _TERMINAL_PHASES

    def follow(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """Follow the file; ``stop`` (or a terminal pod) ends it after a last read."""
        path = self.path(namespace, pod)
        while not path.exists():
            if self._ended(namespace, pod) or (stop and stop()):
                raise LogsUnavailable(f"logs of pod {namespace}/{pod}: no file {path}")
            time.sleep(self._poll_interval)
        with path.open("rb") as handle:
            pending = b""
            while True:
                # Decide before reading, so that the output written before the end is read.
                ended = self._ended(namespace, pod) or bool(stop and stop())
                chunk = handle.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        yield line.decode("utf-8", "replace") + "\n"
                if ended:
                    if pending:
                        yield pending.decode("utf-8", "replace")
                    return
                if not chunk:
                    time.sleep(self._poll_interval)


def pod_logs_for(kube: Kube) -> ApiPodLogs | DirectoryPodLogs:
    """The directory of the local node agent when ``PKOBATCH_POD_LOG_DIR`` is set, else the
    API server."""
    directory = os.environ.get(POD_LOG_DIR_ENV)
    if directory:
        return DirectoryPodLogs(Path(directory), kube)
    return ApiPodLogs(kube)
