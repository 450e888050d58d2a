"""The run cache: ``PKOBATCH_CACHE_DIR`` shared by many runs, possibly at the same time.

The controller may mount one volume at the cache directory in every Job of a namespace, so
runs of many Stacks read and fill it concurrently, and a run may be killed halfway through an
install. What each kind of entry relies on:

- **Plugins** (``$PULUMI_HOME/plugins/<kind>-<name>-v<version>``, on the cache when only
  ``PKOBATCH_CACHE_DIR`` is set): Pulumi itself installs a plugin under an exclusive
  ``flock`` on ``<dir>.lock``, creates ``<dir>.partial`` before it unpacks and removes it only
  after a complete install; a directory with ``.partial`` counts as not installed and is
  installed again. Pulumi writes ``<dir>.lastused`` each time it resolves the plugin to run
  it. Pulumi checks nothing once a plugin is installed, so the runner adds a **manifest**
  (``.pkobatch-manifest.json`` inside the directory: every file's size and mtime) recorded at
  the end of a run for each complete plugin without one, under that same lock; at the start
  of a run a plugin whose files no longer match it is removed (the way Pulumi removes one to
  reinstall it: ``.partial`` first), so the operation downloads it again.
- **Virtualenvs** of inline Python programs (``venvs/<sha256>``,
  ``pkobatch.runner.workspace``): built in a temporary directory, the manifest written into
  it, then renamed into place; one whose manifest is missing or does not match is rebuilt.
  A run holds a shared ``flock`` on ``venvs/<sha256>.lock`` while it may use the virtualenv
  and touches ``venvs/<sha256>.lastused``.
- **Package-manager caches** (``pip/``, ``npm/``, ...): the managers' own; they write
  atomically enough for concurrent use and are neither checked nor pruned here.

A cache directory that is missing and cannot be created, is not writable, or has less free
space than ``PKOBATCH_CACHE_MIN_FREE_BYTES`` makes the run **uncached**: everything goes to a
temporary directory removed after the run, and the run's log and result say why. An install
that meets a full disk (``ENOSPC``) is repeated uncached in the same way (``RunCache.install``;
an operation whose plugin install filled the cache: ``execute._operate_uncached_on_full``).

**Pruning** happens at the end of a run, at most once per ``PRUNE_INTERVAL_SECONDS`` per
cache, under a non-blocking exclusive ``flock`` on ``.prune.lock`` (a run that finds another
pruning skips it): plugins and virtualenvs unused for ``PKOBATCH_CACHE_MAX_AGE_DAYS`` go, then
the least recently used ones until they fit in ``PKOBATCH_CACHE_MAX_BYTES``. An entry used in
the last ``MIN_IDLE_SECONDS``, a virtualenv a run holds, and a plugin being installed are
never removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from pkobatch.api.run import CACHE_MAX_BYTES_ENV
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.runtimes import PULUMI_HOME_DIRECTORY

MIN_FREE_ENV: Final = "PKOBATCH_CACHE_MIN_FREE_BYTES"
MAX_AGE_ENV: Final = "PKOBATCH_CACHE_MAX_AGE_DAYS"
DEFAULT_MIN_FREE_BYTES: Final = 256 * 1024 * 1024
DEFAULT_MAX_AGE_DAYS: Final = 14.0

MANIFEST_NAME: Final = ".pkobatch-manifest.json"
LOCK_SUFFIX: Final = ".lock"
LAST_USED_SUFFIX: Final = ".lastused"
PARTIAL_SUFFIX: Final = ".partial"
PRUNE_LOCK: Final = ".prune.lock"
PRUNE_STAMP: Final = ".pruned"
PRUNE_INTERVAL_SECONDS: Final = 3600.0
LOCK_POLL_SECONDS: Final = 0.2
LOCK_WAIT_SECONDS: Final = 120.0
MIN_IDLE_SECONDS: Final = 3600.0
DAY_SECONDS: Final = 86400.0

Log = Callable[[str], None]
Installed = TypeVar("Installed")


class CacheFull(Exception):
    """An install into the cache ran out of space; the caller repeats it uncached."""


def is_disk_full(error: BaseException | str) -> bool:
    """An ``ENOSPC`` error, or a tool's output that reports one."""
    if isinstance(error, OSError):
        return error.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(error).lower()
    return "no space left on device" in text or "disk quota exceeded" in text


@dataclass(frozen=True)
class CacheSettings:
    """What the controller (or the pod's environment) sets about the cache."""

    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    max_age_days: float = DEFAULT_MAX_AGE_DAYS  # 0: no age limit
    max_bytes: int = 0  # 0: no size bound


def cache_settings(env: Mapping[str, str]) -> tuple[CacheSettings, list[str]]:
    """The settings from ``env``; an invalid value keeps its default and is reported."""
    problems: list[str] = []

    def number(name: str, default: float) -> float:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not math.isfinite(value) or value < 0:
            problems.append(
                f"{name}={raw!r} is not a number >= 0; using {default:g} (fix the Job's env)"
            )
            return default
        return value

    settings = CacheSettings(
        min_free_bytes=int(number(MIN_FREE_ENV, DEFAULT_MIN_FREE_BYTES)),
        max_age_days=number(MAX_AGE_ENV, DEFAULT_MAX_AGE_DAYS),
        max_bytes=int(number(CACHE_MAX_BYTES_ENV, 0)),
    )
    return settings, problems


def unusable_reason(directory: Path, min_free_bytes: int) -> str | None:
    """Why ``directory`` cannot hold this run's cache (None: it can): created if missing,
    written to, and with at least ``min_free_bytes`` free."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
        stats = os.statvfs(directory)
    except OSError as error:
        return f"it cannot be written to ({error.strerror or error})"
    free = stats.f_bavail * stats.f_frsize
    if free < min_free_bytes:
        return f"it has {free} bytes free, less than {MIN_FREE_ENV}={min_free_bytes}"
    return None


def uncached_warning(directory: Path, reason: str) -> str:
    return (
        f"warning: the cache directory {directory} is not used because {reason}; this run "
        "downloads and installs everything again into a temporary directory. Give the run a "
        "writable PKOBATCH_CACHE_DIR with free space (or unset it)"
    )


# Manifests: every file's size and mtime, so checking one costs a stat per file.


def _listing(directory: Path) -> dict[str, list[int]]:
    files: dict[str, list[int]] = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            path = Path(root, name)
            relative = str(path.relative_to(directory))
            if relative == MANIFEST_NAME:
                continue
            stat = path.lstat()
            files[relative] = [stat.st_size, stat.st_mtime_ns]
    return files


def _digest(files: Mapping[str, Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def record_manifest(directory: Path) -> None:
    """Write ``directory``'s manifest (atomically: a reader sees none or all of it). The
    directory keeps its mtime, which tells when the entry was installed (``_last_used``)."""
    before = directory.stat()
    files = _listing(directory)
    body = json.dumps({"version": 1, "sha256": _digest(files), "files": files})
    staged = directory / f"{MANIFEST_NAME}.{os.getpid()}"
    staged.write_text(body)
    os.replace(staged, directory / MANIFEST_NAME)
    os.utime(directory, ns=(before.st_atime_ns, before.st_mtime_ns))


def manifest_problem(directory: Path) -> str | None:
    """What is wrong with ``directory`` against its manifest (None: every recorded file is
    there with its size and mtime; files added since are allowed)."""
    try:
        loaded = json.loads((directory / MANIFEST_NAME).read_text())
        files = loaded["files"]
        if not isinstance(files, dict) or loaded.get("sha256") != _digest(files):
            return "its manifest is damaged"
    except FileNotFoundError:
        return "it has no manifest (its install did not finish)"
    except (OSError, ValueError, KeyError, TypeError):
        return "its manifest is damaged"
    root = str(directory)
    for relative, recorded in files.items():
        try:
            stat = os.lstat(os.path.join(root, relative))  # thousands per virtualenv: no Path
        except OSError:
            return f"{relative} is missing"
        if [stat.st_size, stat.st_mtime_ns] != recorded:
            return f"{relative} changed since it was installed"
    return None


# Locks: flock(2), as Pulumi's own plugin lock (go-internal's lockedfile) takes it.


@contextlib.contextmanager
def entry_lock(path: Path, shared: bool = False, wait_seconds: float = 0.0) -> Iterator[bool]:
    """Hold a ``flock`` on ``path`` (created if missing); yields False when another process
    held a conflicting lock for ``wait_seconds``, or the file cannot be opened."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        operation = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(descriptor, operation)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(LOCK_POLL_SECONDS)
            except OSError:
                yield False
                return
        yield True
    finally:
        os.close(descriptor)


def touch(path: Path) -> None:
    """Mark ``path`` as used now (best effort: a read-only cache is not an error here)."""
    with contextlib.suppress(OSError):
        path.touch()


def remove_tree(directory: Path) -> None:
    """Remove ``directory`` so no reader sees it half-removed: renamed away first."""
    trash = directory.with_name(f".trash-{directory.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


# Plugins.


# Pulumi's own temporary directories of older versions (`<dir>.tmp<digits>`).
_PULUMI_TEMP_DIRECTORY: Final = re.compile(r"\.tmp[0-9]+$")


def plugin_directories(plugins: Path) -> list[Path]:
    """Pulumi's plugin directories under ``plugins`` (not its lock, marker or temp files)."""
    try:
        children = list(plugins.iterdir())
    except OSError:
        return []
    return sorted(
        child
        for child in children
        if child.is_dir()
        and not child.name.startswith(".")
        and not _PULUMI_TEMP_DIRECTORY.search(child.name)
    )


def _partial(plugin: Path) -> Path:
    return plugin.with_name(plugin.name + PARTIAL_SUFFIX)


def _plugin_lock(plugin: Path) -> Path:
    return plugin.with_name(plugin.name + LOCK_SUFFIX)


def remove_damaged_plugins(plugins: Path, log: Log) -> list[str]:
    """Remove every installed plugin whose files no longer match its manifest, so the
    operation installs it again; the names removed."""
    removed = []
    for plugin in plugin_directories(plugins):
        if _partial(plugin).exists() or not (plugin / MANIFEST_NAME).exists():
            continue  # Pulumi reinstalls a partial one; one without manifest is checked later
        problem = manifest_problem(plugin)
        if problem is None:
            continue
        with entry_lock(_plugin_lock(plugin), wait_seconds=0) as locked:
            if not locked:
                continue  # being installed right now
            problem = manifest_problem(plugin)
            if problem is None:
                continue
            # As Pulumi does before it reinstalls: the partial marker first, so no other
            # run takes the directory for installed while it goes.
            try:
                _partial(plugin).touch()
                remove_tree(plugin)
                _partial(plugin).unlink(missing_ok=True)
            except OSError as error:
                log(
                    f"cache: plugin {plugin.name} is damaged ({problem}) and cannot be removed: "
                    f"{error}"
                )
                continue
        log(f"cache: removed plugin {plugin.name} ({problem}); Pulumi installs it again")
        removed.append(plugin.name)
    return removed


def record_plugin_manifests(plugins: Path) -> list[str]:
    """Record the manifest of every completely installed plugin that has none; the names."""
    recorded = []
    for plugin in plugin_directories(plugins):
        if (plugin / MANIFEST_NAME).exists():
            continue
        with entry_lock(_plugin_lock(plugin), wait_seconds=0) as locked:
            if not locked or _partial(plugin).exists() or not plugin.is_dir():
                continue
            with contextlib.suppress(OSError):
                record_manifest(plugin)
                recorded.append(plugin.name)
    return recorded


# Pruning.


@dataclass(frozen=True)
class Entry:
    """A plugin or virtualenv in the cache."""

    path: Path
    size: int
    last_used: float  # seconds since the epoch


def entries_to_prune(entries: Sequence[Entry], now: float, settings: CacheSettings) -> list[Entry]:
    """Entries to remove: unused for ``max_age_days``, then the least recently used until the
    rest fit in ``max_bytes``; never one used in the last ``MIN_IDLE_SECONDS``."""
    idle = [e for e in entries if now - e.last_used >= MIN_IDLE_SECONDS]
    chosen: list[Entry] = []
    if settings.max_age_days > 0:
        oldest = now - settings.max_age_days * DAY_SECONDS
        chosen = [e for e in idle if e.last_used < oldest]
    if settings.max_bytes > 0:
        total = sum(e.size for e in entries) - sum(e.size for e in chosen)
        for entry in sorted(idle, key=lambda e: e.last_used):
            if total <= settings.max_bytes:
                break
            if entry not in chosen:
                chosen.append(entry)
                total -= entry.size
    return chosen


def tree_size(directory: Path) -> int:
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                total += Path(root, name).lstat().st_blocks * 512
    return total


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _last_used(entry: Path) -> float:
    """The newest of the entry's own mtime and its last-used marker (Pulumi's for plugins)."""
    return max(_mtime(entry), _mtime(entry.with_name(entry.name + LAST_USED_SUFFIX)))


def _venv_directories(venvs: Path) -> list[Path]:
    try:
        return sorted(p for p in venvs.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def prune(cache_dir: Path, plugins: Path | None, settings: CacheSettings, log: Log) -> list[str]:
    """Prune the cache unless another run is at it or it was pruned recently; the names of
    the entries removed."""
    if settings.max_age_days <= 0 and settings.max_bytes <= 0:
        return []
    stamp = cache_dir / PRUNE_STAMP
    if time.time() - _mtime(stamp) < PRUNE_INTERVAL_SECONDS:
        return []
    with entry_lock(cache_dir / PRUNE_LOCK, wait_seconds=0) as locked:
        if not locked:
            return []
        if time.time() - _mtime(stamp) < PRUNE_INTERVAL_SECONDS:
            return []  # another run pruned while this one waited
        touch(stamp)
        candidates = _venv_directories(cache_dir / "venvs")
        if plugins is not None:
            candidates += plugin_directories(plugins)
        entries = [Entry(p, tree_size(p), _last_used(p)) for p in candidates]
        removed = []
        for entry in entries_to_prune(entries, time.time(), settings):
            # A run's shared lock on a virtualenv, or Pulumi's install lock on a plugin.
            lock = entry.path.with_name(entry.path.name + LOCK_SUFFIX)
            with entry_lock(lock, wait_seconds=0) as free:
                if not free or _used_since(entry):
                    continue
                remove_tree(entry.path)
            for suffix in (LAST_USED_SUFFIX, PARTIAL_SUFFIX):
                entry.path.with_name(entry.path.name + suffix).unlink(missing_ok=True)
            removed.append(entry.path.name)
        if removed:
            log(
                f"cache: pruned {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}: "
                + ", ".join(removed)
            )
        return removed


def _used_since(entry: Entry) -> bool:
    """True when ``entry`` was used after it was chosen for pruning."""
    return _last_used(entry.path) > entry.last_used


class RunCache:
    """The cache directory of one run: the configured one, or a temporary one when that is
    unusable; the locks the run holds in it until ``close``."""

    def __init__(
        self,
        configured: Path,
        settings: CacheSettings,
        temp_parent: str | None,
        log: Log,
        manages_plugins: bool,
    ) -> None:
        self.configured = configured
        # Plugins are the cache's own only in the Pulumi home it puts there.
        self.plugins = configured / PULUMI_HOME_DIRECTORY / "plugins" if manages_plugins else None
        self.settings = settings
        self._temp_parent = temp_parent
        self._log = log
        self.held = contextlib.ExitStack()
        self.warnings: list[str] = []
        self._temporary: list[Path] = []
        reason = unusable_reason(configured, settings.min_free_bytes)
        self.directory = configured
        if reason is not None:
            self.go_uncached(reason)
        elif self.plugins is not None:
            remove_damaged_plugins(self.plugins, log)

    @property
    def cached(self) -> bool:
        return self.directory == self.configured

    def go_uncached(self, reason: str) -> None:
        """Use a fresh temporary directory from now on, and say why."""
        warning = uncached_warning(self.configured, reason)
        self._log(warning)
        self.warnings.append(warning)
        self.directory = Path(tempfile.mkdtemp(prefix="pkobatch-cache-", dir=self._temp_parent))
        self._temporary.append(self.directory)

    def install(self, install: Callable[[], Installed], repoint: Callable[[], None]) -> Installed:
        """``install``; when it meets a full cache, once more without the cache (``repoint``
        points the run's environment at the new directory first)."""
        try:
            return install()
        except CacheFull as full:
            if not self.cached:
                raise RunFailure(
                    "ProgramError", f"an install ran out of disk space (give the pod more): {full}"
                ) from None
            self.go_uncached(f"an install ran out of space in it ({full})")
        repoint()
        self._log("installing again without the cache")
        return install()

    def close(self) -> None:
        """Release the run's locks; record new plugins' manifests and prune the cache (never
        raises: the run's outcome does not depend on it); remove temporary directories."""
        self.held.close()
        try:
            if self.configured.is_dir() and unusable_reason(self.configured, 0) is None:
                if self.plugins is not None:
                    record_plugin_manifests(self.plugins)
                prune(self.configured, self.plugins, self.settings, self._log)
        except OSError as error:
            self._log(f"cache: not pruned: {error}")
        for directory in self._temporary:
            shutil.rmtree(directory, ignore_errors=True)
