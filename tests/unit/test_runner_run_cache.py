"""The run cache on a shared directory: usability, manifests, plugin repair, pruning."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from pkobatch.runner.failures import RunFailure
from pkobatch.runner.run_cache import (
    DAY_SECONDS,
    MANIFEST_NAME,
    MIN_IDLE_SECONDS,
    PRUNE_LOCK,
    PRUNE_STAMP,
    CacheFull,
    CacheSettings,
    Entry,
    RunCache,
    cache_settings,
    entries_to_prune,
    entry_lock,
    is_disk_full,
    manifest_problem,
    plugin_directories,
    prune,
    record_manifest,
    record_plugin_manifests,
    remove_damaged_plugins,
    unusable_reason,
)

NOW = 1_800_000_000.0
GIB = 1024**3


def test_settings_come_from_the_environment_and_bad_values_keep_the_default() -> None:
    settings, problems = cache_settings(
        {
            "PKOBATCH_CACHE_MIN_FREE_BYTES": "1000",
            "PKOBATCH_CACHE_MAX_AGE_DAYS": "0.5",
            "PKOBATCH_CACHE_MAX_BYTES": "2e9",
        }
    )
    assert settings == CacheSettings(min_free_bytes=1000, max_age_days=0.5, max_bytes=2_000_000_000)
    assert problems == []
    settings, problems = cache_settings(
        {
            "PKOBATCH_CACHE_MAX_AGE_DAYS": "two weeks",
            "PKOBATCH_CACHE_MAX_BYTES": "inf",
            "PKOBATCH_CACHE_MIN_FREE_BYTES": "-1",
        }
    )
    assert settings == CacheSettings()
    assert len(problems) == 3 and "PKOBATCH_CACHE_MAX_AGE_DAYS='two weeks'" in problems[1]


def test_disk_full_is_recognised_from_errors_and_tool_output() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert is_disk_full(
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
    )
    assert not is_disk_full("ERROR: No matching distribution found for nothing")


def test_a_usable_directory_is_created(tmp_path: Path) -> None:
    assert unusable_reason(tmp_path / "a" / "b", 0) is None
    assert (tmp_path / "a" / "b").is_dir()
    assert list((tmp_path / "a" / "b").iterdir()) == []  # the probe is gone


def test_an_unwritable_or_full_directory_is_unusable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    reason = unusable_reason(blocker / "cache", 0)
    assert reason is not None and "cannot be written to" in reason
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    reason = unusable_reason(tmp_path, free + GIB)
    assert reason is not None and "less than PKOBATCH_CACHE_MIN_FREE_BYTES" in reason


def test_an_unusable_cache_makes_the_run_uncached_in_a_temporary_directory(tmp_path: Path) -> None:
    lines: list[str] = []
    settings = CacheSettings(min_free_bytes=1 << 62)
    cache = RunCache(tmp_path / "cache", settings, str(tmp_path), lines.append, True)
    assert not cache.cached
    assert cache.directory.is_dir() and cache.directory.parent == tmp_path
    assert len(cache.warnings) == 1 and cache.warnings == lines
    assert "this run downloads and installs everything again" in lines[0]
    cache.close()
    assert not cache.directory.exists()


def test_a_manifest_catches_changed_and_missing_files_but_allows_new_ones(tmp_path: Path) -> None:
    entry = tmp_path / "entry"
    (entry / "bin").mkdir(parents=True)
    (entry / "bin" / "tool").write_bytes(b"binary")
    (entry / "data").write_text("data")
    assert manifest_problem(entry) == "it has no manifest (its install did not finish)"
    record_manifest(entry)
    assert manifest_problem(entry) is None
    (entry / "__pycache__").mkdir()
    (entry / "__pycache__" / "x.pyc").write_bytes(b"")
    (entry / "added").write_text("")
    assert manifest_problem(entry) is None
    (entry / "bin" / "tool").write_bytes(b"binar")
    assert manifest_problem(entry) == "bin/tool changed since it was installed"
    (entry / "bin" / "tool").unlink()
    assert manifest_problem(entry) == "bin/tool is missing"
    (entry / MANIFEST_NAME).write_text('{"files": {}, "sha256": "0"}')
    assert manifest_problem(entry) == "its manifest is damaged"


def test_recording_a_manifest_keeps_the_entrys_install_time(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    age(tmp_path, 30)
    before = tmp_path.stat().st_mtime_ns
    record_manifest(tmp_path)
    assert tmp_path.stat().st_mtime_ns == before


def plugin(plugins: Path, name: str, content: bytes = b"provider") -> Path:
    directory = plugins / name
    directory.mkdir(parents=True)
    (directory / f"pulumi-{name.rsplit('-v', 1)[0]}").write_bytes(content)
    return directory


def test_plugin_directories_skip_pulumis_markers_and_temporary_directories(tmp_path: Path) -> None:
    good = plugin(tmp_path, "resource-kubernetes-v4.25.0-alpha.1768448096+f47bc2d6")
    (tmp_path / f"{good.name}.lock").write_text("")
    (tmp_path / f"{good.name}.lastused").write_text("")
    (tmp_path / "resource-x-v1.0.0.tmp123456").mkdir()
    (tmp_path / ".trash-resource-y").mkdir()
    assert plugin_directories(tmp_path) == [good]


def test_only_complete_unlocked_plugins_get_a_manifest(tmp_path: Path) -> None:
    done = plugin(tmp_path, "resource-a-v1.0.0")
    partial = plugin(tmp_path, "resource-b-v1.0.0")
    (tmp_path / "resource-b-v1.0.0.partial").write_text("")
    installing = plugin(tmp_path, "resource-c-v1.0.0")
    with entry_lock(tmp_path / "resource-c-v1.0.0.lock") as locked:  # as Pulumi's install
        assert locked
        assert record_plugin_manifests(tmp_path) == [done.name]
    assert not (partial / MANIFEST_NAME).exists() and not (installing / MANIFEST_NAME).exists()
    assert record_plugin_manifests(tmp_path) == [installing.name]


def test_a_damaged_plugin_is_removed_so_pulumi_installs_it_again(tmp_path: Path) -> None:
    damaged = plugin(tmp_path, "resource-a-v1.0.0")
    intact = plugin(tmp_path, "resource-b-v1.0.0")
    record_plugin_manifests(tmp_path)
    (damaged / "pulumi-resource-a").write_bytes(b"trunc")
    lines: list[str] = []
    assert remove_damaged_plugins(tmp_path, lines.append) == [damaged.name]
    assert not damaged.exists() and not (tmp_path / "resource-a-v1.0.0.partial").exists()
    assert intact.is_dir()
    assert "pulumi-resource-a changed since it was installed" in lines[0]


def test_a_plugin_being_installed_is_left_to_pulumi(tmp_path: Path) -> None:
    damaged = plugin(tmp_path, "resource-a-v1.0.0")
    record_plugin_manifests(tmp_path)
    (damaged / "pulumi-resource-a").write_bytes(b"")
    with entry_lock(tmp_path / "resource-a-v1.0.0.lock"):
        assert remove_damaged_plugins(tmp_path, print) == []
    assert damaged.is_dir()


def entry(name: str, size: int, days_ago: float) -> Entry:
    return Entry(Path(name), size, NOW - days_ago * DAY_SECONDS)


def test_old_entries_go_then_the_least_recently_used_until_they_fit() -> None:
    entries = [entry("old", 1, 20), entry("a", 4, 3), entry("b", 4, 2), entry("c", 4, 1)]
    assert entries_to_prune(entries, NOW, CacheSettings(max_age_days=14)) == [entries[0]]
    chosen = entries_to_prune(entries, NOW, CacheSettings(max_age_days=14, max_bytes=8))
    assert chosen == [entries[0], entries[1]]
    assert entries_to_prune(entries, NOW, CacheSettings(max_age_days=0, max_bytes=0)) == []


def test_an_entry_used_in_the_last_hour_is_never_pruned() -> None:
    recent = Entry(Path("recent"), 100, NOW - MIN_IDLE_SECONDS / 2)
    assert entries_to_prune([recent], NOW, CacheSettings(max_age_days=0.001, max_bytes=1)) == []


def age(path: Path, days: float) -> None:
    past = time.time() - days * DAY_SECONDS
    os.utime(path, (past, past))


def test_prune_removes_old_entries_keeps_recent_and_held_ones(tmp_path: Path) -> None:
    venvs = tmp_path / "venvs"
    plugins = tmp_path / "pulumi-home" / "plugins"
    for name in ("old", "held", "recent"):
        (venvs / name).mkdir(parents=True)
        age(venvs / name, 30 if name != "recent" else 1)
    old_plugin = plugin(plugins, "resource-a-v1.0.0")
    age(old_plugin, 30)
    used_plugin = plugin(plugins, "resource-b-v1.0.0")
    age(used_plugin, 30)
    (plugins / "resource-b-v1.0.0.lastused").write_text("")  # Pulumi ran it just now
    lines: list[str] = []
    with entry_lock(venvs / "held.lock", shared=True):  # a run uses it
        removed = prune(tmp_path, plugins, CacheSettings(max_age_days=14), lines.append)
    assert sorted(removed) == ["old", "resource-a-v1.0.0"]
    assert sorted(p.name for p in venvs.iterdir() if p.is_dir()) == ["held", "recent"]
    assert plugin_directories(plugins) == [used_plugin]
    assert lines == ["cache: pruned 2 entries: old, resource-a-v1.0.0"]
    # At most once an hour: the next run does not walk the cache again.
    assert prune(tmp_path, plugins, CacheSettings(max_age_days=14), print) == []
    assert (venvs / "held").is_dir()


def test_a_run_skips_pruning_while_another_prunes(tmp_path: Path) -> None:
    (tmp_path / "venvs" / "old").mkdir(parents=True)
    age(tmp_path / "venvs" / "old", 30)
    with entry_lock(tmp_path / PRUNE_LOCK) as locked:
        assert locked
        assert prune(tmp_path, None, CacheSettings(), print) == []
    assert not (tmp_path / PRUNE_STAMP).exists()
    assert prune(tmp_path, None, CacheSettings(), print) == ["old"]


def test_an_exclusive_lock_waits_for_a_shared_one(tmp_path: Path) -> None:
    with entry_lock(tmp_path / "x.lock", shared=True) as shared:
        assert shared
        with entry_lock(tmp_path / "x.lock", shared=True) as also_shared:
            assert also_shared
        started = time.monotonic()
        with entry_lock(tmp_path / "x.lock", wait_seconds=0.5) as exclusive:
            assert not exclusive
        assert time.monotonic() - started >= 0.5
    with entry_lock(tmp_path / "x.lock") as exclusive:
        assert exclusive


def test_closing_records_new_plugins_and_prunes(tmp_path: Path) -> None:
    plugins = tmp_path / "pulumi-home" / "plugins"
    fresh = plugin(plugins, "resource-a-v1.0.0")
    (tmp_path / "venvs" / "old").mkdir(parents=True)
    age(tmp_path / "venvs" / "old", 30)
    cache = RunCache(tmp_path, CacheSettings(min_free_bytes=0), None, print, True)
    assert cache.cached and cache.warnings == []
    cache.close()
    assert manifest_problem(fresh) is None
    assert not (tmp_path / "venvs" / "old").exists()


@pytest.mark.parametrize("manages_plugins", [True, False])
def test_a_damaged_plugin_is_removed_when_the_run_starts(
    tmp_path: Path, manages_plugins: bool
) -> None:
    plugins = tmp_path / "pulumi-home" / "plugins"
    damaged = plugin(plugins, "resource-a-v1.0.0")
    record_manifest(damaged)
    (damaged / "pulumi-resource-a").unlink()
    RunCache(tmp_path, CacheSettings(min_free_bytes=0), None, print, manages_plugins).close()
    # A Pulumi home the pod's own PULUMI_HOME names is not the cache's to repair.
    assert damaged.exists() is not manages_plugins


def test_an_install_that_fills_the_cache_is_repeated_uncached(tmp_path: Path) -> None:
    lines: list[str] = []
    settings = CacheSettings(min_free_bytes=0)
    cache = RunCache(tmp_path / "cache", settings, str(tmp_path), lines.append, True)
    directories: list[Path] = []
    repointed: list[Path] = []

    def install() -> str:
        directories.append(cache.directory)
        if len(directories) == 1:
            raise CacheFull("[Errno 28] No space left on device")
        return "installed"

    assert cache.install(install, lambda: repointed.append(cache.directory)) == "installed"
    assert directories[0] == tmp_path / "cache"
    assert directories[1] != directories[0] and repointed == [directories[1]]
    assert not cache.cached
    assert "because an install ran out of space in it ([Errno 28]" in cache.warnings[0]
    assert lines[-1] == "installing again without the cache"
    cache.close()
    assert not directories[1].exists()


def test_an_install_that_fills_the_temporary_directory_fails_the_run(tmp_path: Path) -> None:
    cache = RunCache(tmp_path / "cache", CacheSettings(min_free_bytes=1 << 62), None, print, True)

    def install() -> None:
        raise CacheFull("No space left on device")

    with pytest.raises(RunFailure) as raised:
        cache.install(install, lambda: None)
    assert raised.value.reason == "ProgramError"
    assert "give the pod more" in raised.value.message
    cache.close()
