"""Sentinel secrets, and the scan proving none of them leaked.

Tests put secret values only into Secrets (and the processes that legitimately hold them:
the git server, environment variables). Every such value is a *sentinel*: registered here,
then looked for everywhere else it must never be:

- the objects of every namespace: Jobs, Pods, ConfigMaps, Stacks (all but the spec its
  author wrote, which may hold inline secrets) and Events of both APIs — each test
  namespace just before the ``namespace`` fixture deletes it, and the whole cluster at the
  end of the session;
- every ``*.log`` file written under the session's base temporary directory: the
  controllers' logs, the pods' logs, the control plane's logs and the in-process log of
  the node agent;
- the argument list (``/proc/*/cmdline``) of every process on the machine, sampled all
  session long, so a short-lived process (a ``pulumi`` call inside a run) is seen too;
- everything a test's stand-in for an outside system received (the body of every request
  a test's webhook receiver got: ``record_received``), at the end of the session.

A value counts as found as is or base64-encoded (as it would be in a ConfigMap's
``binaryData`` or a careless copy of a Secret's ``data``). Values are random per session, so
another session on the same machine cannot produce a false finding. A report names the
sentinel's label and the place, never the value.

``plant(label)`` returns a fresh sentinel; ``register(value, label)`` adopts a value made
elsewhere (a generated password). The session fixture ``sentinel_session`` (autouse: the
root ``tests/conftest.py`` registers this module as a plugin) samples process arguments all
session long and, at its teardown — the session's last, after the cluster's final scan —
fails the session with every leak found, in those and in what ``record_received`` kept.
The ``namespace`` fixture fails the test whose namespace held a leak.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from pkobatch.kube.client import CONFIGMAPS, CORE_EVENTS, EVENTS, JOBS, PODS, STACKS, Kube

SCANNED_RESOURCES: Final = (JOBS, PODS, CONFIGMAPS, STACKS, CORE_EVENTS, EVENTS)
PROC: Final = Path("/proc")

_planted: dict[str, str] = {}  # value -> label
_received: list[tuple[str, str]] = []  # (where, text)
_lock = threading.Lock()


def plant(label: str) -> str:
    """A fresh secret value for a test to put in a Secret; registered for the scan."""
    return register(f"sentinel-{label}-{secrets.token_hex(8)}", label)


def register(value: str, label: str) -> str:
    """Make ``value`` (a secret a fixture generated) a sentinel; returns it."""
    if len(value) < 8:
        raise ValueError(f"sentinel {label!r} is too short to be found without false alarms")
    with _lock:
        _planted[value] = label
    return value


def planted() -> dict[str, str]:
    """value -> label of every sentinel planted so far in this session."""
    with _lock:
        return dict(_planted)


@dataclass(frozen=True)
class Leak:
    label: str
    where: str

    def __str__(self) -> str:
        return f"sentinel {self.label!r} in {self.where}"


def encodings(value: str) -> list[str]:
    """``value`` and the parts of its base64 encoding that do not depend on the bytes
    around it (one per alignment of the value in a longer encoded text)."""
    raw = value.encode()
    found = [value]
    for offset, skip in ((0, 0), (1, 2), (2, 3)):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        # The last 4 characters may hold padding or bits of whatever follows.
        found.append(encoded[skip:-4])
    return found


def find(text: str, where: str, sentinels: Mapping[str, str]) -> list[Leak]:
    return [
        Leak(label, where)
        for value, label in sentinels.items()
        if any(form and form in text for form in encodings(value))
    ]


def _object_name(item: Mapping[str, Any]) -> str:
    meta = item.get("metadata") or {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{item.get('kind')} {where}{meta.get('name')}"


def scan_objects(
    kube: Kube, sentinels: Mapping[str, str], namespace: str | None = None
) -> list[Leak]:
    """Leaks in the objects of ``namespace`` (every namespace when None)."""
    if not sentinels:
        return []
    leaks: list[Leak] = []
    for resource in SCANNED_RESOURCES:
        items, _ = kube.list_objects(resource, namespace)
        for item in items:
            if resource is STACKS:
                # A Stack's spec holds what its author wrote, inline secrets included
                # (spec.secrets, Literal values): everything else of it is scanned.
                item = {key: value for key, value in item.items() if key != "spec"}
            leaks += find(json.dumps(item), _object_name(item), sentinels)
    return leaks


def scan_files(paths: Iterable[Path], sentinels: Mapping[str, str]) -> list[Leak]:
    leaks: list[Leak] = []
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue  # removed meanwhile
        leaks += find(text, f"file {path}", sentinels)
    return leaks


def scan_logs(root: Path, sentinels: Mapping[str, str]) -> list[Leak]:
    """Leaks in every ``*.log`` file under ``root``."""
    return scan_files(sorted(root.rglob("*.log")), sentinels) if sentinels else []


def record_received(where: str, data: bytes) -> None:
    """Keep ``data`` that a test's stand-in for an outside system received (a webhook
    request's body) for the scan at the end of the session; ``where`` names it (never with a
    secret value)."""
    with _lock:
        _received.append((where, data.decode(errors="replace")))


def scan_received(sentinels: Mapping[str, str]) -> list[Leak]:
    """Leaks in everything ``record_received`` kept."""
    with _lock:
        received = list(_received)
    return [leak for where, text in received for leak in find(text, where, sentinels)]


def process_arguments() -> dict[int, str]:
    """pid -> argument list (NUL-separated, as in ``/proc/<pid>/cmdline``) of every
    process on the machine that can be read."""
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
    return found


def scan_processes(sentinels: Mapping[str, str]) -> list[Leak]:
    leaks: list[Leak] = []
    if not sentinels:
        return leaks
    for pid, argv in process_arguments().items():
        found = find(argv, "", sentinels)
        if found:
            shown = masked(argv.replace("\0", " "), sentinels)[:160]
            where = f"the arguments of process {pid} ({shown}...)"
            leaks += [Leak(leak.label, where) for leak in found]
    return leaks


def masked(text: str, sentinels: Mapping[str, str]) -> str:
    """``text`` with every form of every sentinel replaced by its label."""
    for value, label in sentinels.items():
        for form in encodings(value):
            if form:
                text = text.replace(form, f"<sentinel {label}>")
    return text


class ArgumentWatch:
    """Samples every process's arguments in a thread until ``stop()``; ``leaks`` keeps
    each (sentinel, process) found once."""

    def __init__(
        self, sentinels: Callable[[], Mapping[str, str]] = planted, interval: float = 0.1
    ) -> None:
        self._sentinels = sentinels
        self.interval = interval
        self.leaks: list[Leak] = []
        self._seen: set[tuple[str, str]] = set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sentinel-argv", daemon=True)

    def __enter__(self) -> ArgumentWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def sample(self) -> None:
        for leak in scan_processes(self._sentinels()):
            key = (leak.label, leak.where.split(" (", 1)[0])
            if key not in self._seen:
                self._seen.add(key)
                self.leaks.append(leak)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            self.sample()


def report(leaks: list[Leak], scope: str) -> str:
    lines = "\n".join(f"  - {leak}" for leak in leaks)
    return f"secret values leaked ({scope}):\n{lines}"


@pytest.fixture(scope="session", autouse=True)
def sentinel_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Leak]]:
    """Leaks found by fixtures that end earlier (the cluster's final scan) go into the list
    this yields; at the end of the session they, the process sampler's and those in every
    log file of the session fail it."""
    earlier: list[Leak] = []
    with ArgumentWatch() as watch:
        yield earlier
    values = planted()
    leaks = [
        *earlier,
        *watch.leaks,
        *scan_processes(values),
        *scan_logs(tmp_path_factory.getbasetemp(), values),
        *scan_received(values),
    ]
    unique = list(dict.fromkeys(leaks))
    if unique:
        pytest.fail(report(unique, "scan after the whole session"), pytrace=False)
