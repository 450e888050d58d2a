"""The long-running processes of a local environment — the control plane's and the real
node's — by name: each started with ``processes.spawn`` (so it dies with its owner), its
output in ``<log_dir>/<name>.log``, started once its readiness check passes (mostly: a
health URL answers 200), and startable again with the arguments of its first start.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pkobatch.dev import processes


class ComponentError(Exception):
    """A component failed to start or exited; the message carries the end of its log."""


@dataclass(frozen=True)
class _Component:
    """How a component was started, so it can be started again exactly so."""

    argv: tuple[str, ...]
    ready: Callable[[], bool]
    what: str


def answers_ok(url: str, context: ssl.SSLContext | None = None) -> Callable[[], bool]:
    """A readiness check: ``url`` answers 200 (``context`` verifies an https server)."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )

    def check() -> bool:
        try:
            with opener.open(url, timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    return check


def unverified_tls() -> ssl.SSLContext:
    """For the health endpoint of a component that serves it with a self-signed certificate
    of its own (kube-controller-manager, kube-scheduler): nothing but "ok" crosses it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Components:
    """Started components by name; errors are raised as ``error`` (a ``ComponentError``)."""

    def __init__(self, log_dir: Path, error: type[ComponentError] = ComponentError) -> None:
        self.log_dir = log_dir
        self.error = error
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._started: dict[str, _Component] = {}

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._processes.items()}

    def start(
        self, name: str, argv: list[str], ready: Callable[[], bool], what: str, timeout: float
    ) -> None:
        """Start ``argv`` as ``name`` (its log emptied) and wait until ``ready()``;
        ``what`` says what it checks (``kubelet at http://...``)."""
        log = self.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        self._started[name] = _Component(tuple(argv), ready, what)
        self._processes[name] = processes.spawn(argv, log=log)
        self.wait_ready(name, timeout)

    def start_http(
        self,
        name: str,
        argv: list[str],
        url: str,
        context: ssl.SSLContext | None,
        timeout: float,
    ) -> None:
        """``start`` with the readiness check ``url`` answers 200."""
        self.start(name, argv, answers_ok(url, context), f"{name} at {url}", timeout)

    def start_again(self, name: str, *, timeout: float) -> None:
        """Start a stopped (or crashed) component with the arguments of its first start and
        wait until it is healthy."""
        component = self._started.get(name)
        if component is None:
            raise self.error(f"{name} was never started here; known: {list(self._started)}")
        crashed = self._processes.get(name)
        if crashed is not None and crashed.poll() is None:
            raise self.error(f"{name} is running; restart it with restart_component")
        self.stop(name)  # forgets a crashed process
        with self.log(name).open("ab") as handle:
            handle.write(f"--- pkobatch: restarting {name} ---\n".encode())
        self._processes[name] = processes.spawn(component.argv, log=self.log(name))
        self.wait_ready(name, timeout)

    def stop(self, name: str, *, kill: bool = False, grace: float = 15.0) -> None:
        """SIGTERM with ``grace`` seconds to exit, or SIGKILL at once with ``kill``."""
        process = self._processes.pop(name, None)
        if process is None:
            return
        if kill:
            processes.signal_group(process, signal.SIGKILL)
        processes.stop(process, grace=grace)

    def exited(self) -> dict[str, int]:
        """The exit code of every started component that is no longer running."""
        return {
            name: code
            for name, process in self._processes.items()
            if (code := process.poll()) is not None
        }

    def check_alive(self) -> None:
        """``error`` naming the first component that has exited, with the end of its log."""
        exited = self.exited()
        if exited:
            name, code = next(iter(exited.items()))
            raise self.error(f"{name} exited with code {code}:\n" + tail(self.log(name)))

    def wait_ready(self, name: str, timeout: float) -> None:
        """Wait until ``name``'s readiness check passes; ``error`` with the end of its log
        when it exits first or the time is up."""
        component = self._started[name]

        def ready() -> bool:
            process = self._processes[name]
            if process.poll() is not None:
                raise self.error(
                    f"{name} exited with code {process.returncode}:\n" + tail(self.log(name))
                )
            return component.ready()

        try:
            processes.wait_until(ready, timeout=timeout, what=component.what)
        except TimeoutError as exc:
            raise self.error(f"{exc}; end of {self.log(name)}:\n" + tail(self.log(name))) from exc
