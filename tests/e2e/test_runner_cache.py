"""The run cache on a directory shared by runs (``pkobatch.runner.run_cache``), with the real
Pulumi CLI: `pkobatch run` processes on one ``PKOBATCH_CACHE_DIR``, as the Jobs of a namespace
share one volume.

The Kubernetes provider is not on the runs' PATH: a YAML program names it with a
``pluginDownloadURL`` on a loopback plugin server (``pkobatch.dev.plugin_server``) that counts
the downloads, so a cached plugin and a downloaded one can be told apart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixture_plugins.tools import in_ci

from pkobatch.api.run import RunResult
from pkobatch.dev.plugin_server import PROVIDER_BINARY, PluginServer, pack_plugin
from pkobatch.dev.tools import versions
from pkobatch.runner.run_cache import MANIFEST_NAME, manifest_problem

RUN_TIMEOUT = 600
DAY = 86400.0

RENDER_PROGRAM = """name: pkobatch-test-render
description: pkobatch test program - a ConfigMap rendered by a downloaded Kubernetes provider
runtime: yaml
config:
  renderDirectory:
    type: string
resources:
  render:
    type: pulumi:providers:kubernetes
    properties:
      renderYamlToDirectory: ${renderDirectory}
    options:
      version: VERSION
      pluginDownloadURL: SERVER
  settings:
    type: kubernetes:core/v1:ConfigMap
    properties:
      metadata:
        name: settings
        namespace: default
      data:
        stack: ${pulumi.stack}
    options:
      provider: ${render}
outputs:
  configMap: ${settings.metadata.name}
"""


class CacheRuns:
    """`pkobatch run` of Stacks of one repository, all with the same cache directory."""

    def __init__(self, tmp_path: Path, env: dict[str, str], repo_url: str) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.repo_url = repo_url
        self.cache = tmp_path / "cache"

    def start(self, stack: str, **env: str) -> subprocess.Popen[str]:
        manifest = self.tmp_path / f"stack-{stack}.yaml"
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": stack, "namespace": "e2e"},
            "spec": {
                "stack": stack,
                "projectRepo": self.repo_url,
                "branch": "main",
                "config": {
                    "renderDirectory": str(self.tmp_path / "rendered" / stack),
                    "directory": str(self.tmp_path / "files" / stack),
                },
            },
        }
        manifest.write_text(yaml.safe_dump(body))
        argv = [sys.executable, "-m", "pkobatch.main", "run", "-f", str(manifest), "-o", "json"]
        return subprocess.Popen(
            argv,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> tuple[RunResult, str]:
        stdout, log = process.communicate(timeout=RUN_TIMEOUT)
        assert stdout.strip(), f"no result on stdout; log:\n{log}"
        result = RunResult.model_validate_json(stdout)
        assert (process.returncode, result.state) == (0, "succeeded"), f"{result.message}\n{log}"
        return result, log

    def run(self, stack: str, **env: str) -> tuple[RunResult, str]:
        return self.finish(self.start(stack, **env))


@pytest.fixture
def offline_env(pulumi_env: Any, tmp_path: Path) -> dict[str, str]:
    """A pod's environment: its own HOME and TMPDIR, the cache's Pulumi home (no PULUMI_HOME
    of its own) and automatic plugin downloads allowed."""
    env = {
        name: value
        for name, value in pulumi_env.env.items()
        if name not in ("PULUMI_HOME", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION")
    }
    (tmp_path / "home").mkdir()
    env |= {
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
        "PKOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "PKOBATCH_CACHE_MIN_FREE_BYTES": "0",
    }
    return env


@pytest.fixture
def plugin_server(kubernetes_provider: Path, tmp_path: Path) -> Iterator[PluginServer]:
    version = versions()["KUBERNETES_PROVIDER_VERSION"]
    archive = pack_plugin(kubernetes_provider / PROVIDER_BINARY, tmp_path, version)
    with PluginServer(archive) as server:
        yield server


@pytest.fixture
def render_runs(
    offline_env: dict[str, str],
    plugin_server: PluginServer,
    kubernetes_provider: Path,
    yaml_host: Path,
    git_repo: Callable[..., Any],
    tmp_path: Path,
) -> CacheRuns:
    """Runs of the render program, with the provider only on the plugin server."""
    repo = git_repo("yaml")
    version = versions()["KUBERNETES_PROVIDER_VERSION"]
    program = RENDER_PROGRAM.replace("VERSION", version).replace("SERVER", plugin_server.url)
    repo.update({"Pulumi.yaml": program}, "render program")
    path = [entry for entry in offline_env["PATH"].split(os.pathsep) if entry]
    path = [entry for entry in path if Path(entry) != kubernetes_provider]
    env = {**offline_env, "PATH": os.pathsep.join(path)}
    return CacheRuns(tmp_path, env, repo.file_url)


def the_plugin(cache: Path) -> Path:
    plugins = [p for p in (cache / "pulumi-home" / "plugins").iterdir() if p.is_dir()]
    assert len(plugins) == 1, plugins
    return plugins[0]


def test_runs_share_one_plugin_install_and_repair_a_damaged_one(
    render_runs: CacheRuns, plugin_server: PluginServer
) -> None:
    # Two Stacks start at once on an empty cache: Pulumi's install lock lets one unpack it.
    first = [render_runs.start(stack) for stack in ("a", "b")]
    for process in first:
        result, _ = render_runs.finish(process)
        assert result.changes == {"create": 3}
    # Each may download before it waits on the lock; at most one download per run.
    assert 1 <= plugin_server.downloads <= 2
    plugin = the_plugin(render_runs.cache)
    assert not plugin.with_name(plugin.name + ".partial").exists()
    assert manifest_problem(plugin) is None  # recorded at the end of the runs

    downloads = plugin_server.downloads
    result, log = render_runs.run("a")
    assert (result.changes, plugin_server.downloads) == ({"same": 3}, downloads)
    assert "Downloading plugin" not in log

    binary = plugin / PROVIDER_BINARY
    binary.write_bytes(binary.read_bytes()[: 1 << 20])  # a truncated provider
    result, log = render_runs.run("b")
    assert result.changes == {"same": 3}
    assert f"cache: removed plugin {plugin.name} ({PROVIDER_BINARY} changed since it" in log
    assert plugin_server.downloads == downloads + 1
    assert the_plugin(render_runs.cache) == plugin
    assert manifest_problem(plugin) is None


@pytest.fixture
def small_cache(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs as the cache directory (the provider is about 170 MB), unmounted
    after the test. Needs root (CAP_SYS_ADMIN), as the real node's tests do."""
    mount = tmp_path / "cache"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        message = f"cannot mount a tmpfs for a full cache: {done.stderr.strip()}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True, timeout=60)


def test_a_plugin_install_that_fills_the_cache_is_repeated_without_it(
    render_runs: CacheRuns, plugin_server: PluginServer, small_cache: Path
) -> None:
    assert render_runs.cache == small_cache
    result, log = render_runs.run("a")

    # The first attempt created the stack's root resource before the provider failed to
    # install; the result counts the changes of the attempt that succeeded.
    assert result.changes == {"create": 2, "same": 1}
    assert "no space left on device" in log.lower()
    assert "running up again without the cache" in log
    warning = f"the cache directory {small_cache} is not used because a plugin install ran out"
    assert warning in log and warning in result.message
    # Into the full cache (Pulumi tries more than once), then into the temporary home.
    assert plugin_server.downloads >= 2
    # Pulumi left the cache's copy partial: a later run with space installs it again.
    [partial] = (small_cache / "pulumi-home" / "plugins").glob("*.partial")
    assert partial.name.startswith("resource-kubernetes-v")


@pytest.fixture
def yaml_runs(
    offline_env: dict[str, str], yaml_host: Path, git_repo: Callable[..., Any], tmp_path: Path
) -> CacheRuns:
    """Runs of a YAML program without a provider (the fastest real run)."""
    return CacheRuns(tmp_path, offline_env, git_repo("yaml").file_url)


def test_an_unusable_cache_gives_an_uncached_run_with_a_warning(
    yaml_runs: CacheRuns, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result, log = yaml_runs.run("a", PKOBATCH_CACHE_DIR=str(blocker / "cache"))
    warning = f"warning: the cache directory {blocker / 'cache'} is not used because it cannot"
    assert warning in log and warning in result.message

    # A cache with less free space than the minimum is treated the same.
    full = {"PKOBATCH_CACHE_MIN_FREE_BYTES": str(1 << 62)}
    result, log = yaml_runs.run("b", **full)
    warning = f"warning: the cache directory {yaml_runs.cache} is not used because it has"
    assert warning in log and warning in result.message
    assert "less than PKOBATCH_CACHE_MIN_FREE_BYTES" in result.message
    assert not (yaml_runs.cache / "pulumi-home").exists()
    assert [p.name for p in tmp_path.glob("pkobatch-cache-*")] == []  # the temporary one


def age(path: Path, days: float) -> None:
    past = time.time() - days * DAY
    os.utime(path, (past, past))


def test_pruning_removes_entries_unused_for_the_max_age_and_keeps_recent_ones(
    yaml_runs: CacheRuns,
) -> None:
    venvs = yaml_runs.cache / "venvs"
    plugins = yaml_runs.cache / "pulumi-home" / "plugins"
    for entry in (venvs / "old", venvs / "recent", plugins / "resource-gone-v1.0.0"):
        (entry / "bin").mkdir(parents=True)
        (entry / "bin" / "file").write_bytes(b"x" * 4096)
    age(venvs / "old", 20)
    age(venvs / "recent", 3)
    age(plugins / "resource-gone-v1.0.0", 40)

    result, log = yaml_runs.run("a", PKOBATCH_CACHE_MAX_AGE_DAYS="7")

    assert "cache: pruned 2 entries: old, resource-gone-v1.0.0" in log, log
    assert sorted(p.name for p in venvs.iterdir() if p.is_dir()) == ["recent"]
    assert not (plugins / "resource-gone-v1.0.0").exists()
    assert result.outputs["message"] == "hello from YAML"


def test_a_damaged_virtualenv_is_not_used_and_is_built_again(
    offline_env: dict[str, str], git_repo: Callable[..., Any], tmp_path: Path
) -> None:
    repo = git_repo()  # the inline Python program (no pulumi-language-python here)
    repo.update({"requirements.txt": "# no dependencies\n"}, "requirements")
    runs = CacheRuns(tmp_path, offline_env, repo.file_url)
    result, log = runs.run("a")
    assert result.language_host == "inline-python"
    [venv] = [p for p in (runs.cache / "venvs").iterdir() if p.is_dir()]
    assert (venv / MANIFEST_NAME).is_file()

    (venv / "pyvenv.cfg").write_text("home = /damaged\n")
    result, log = runs.run("a")
    assert f"cache: virtualenv {venv.name[:12]} is not used (pyvenv.cfg changed since" in log
    assert result.changes == {"same": 3}
    assert manifest_problem(venv) is None
    assert "/damaged" not in (venv / "pyvenv.cfg").read_text()
