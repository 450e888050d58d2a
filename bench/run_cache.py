"""A realistic run: a program whose resource plugin must be downloaded and whose dependencies
must be installed, through `pkobatch job run`, against the same `up` in a warm workspace.

    .venv/bin/python bench/run_cache.py

The program (Python, `requirements.txt`: `pulumi` and the `pulumi-kubernetes` SDK from the
package index) declares a Kubernetes provider in `renderYamlToDirectory` mode and a ConfigMap
rendered through it: no API server is needed, but the provider plugin is. The plugin is
nowhere on the runs' `PATH`; the provider's `pluginDownloadURL` names a loopback HTTP server
that serves the provider built by scripts/tools.sh as Pulumi's plugin archive
(`pulumi-resource-kubernetes-v<version>-linux-amd64.tar.gz`, the binary at its root) and
counts the downloads.

Each run is a fresh pod: its own HOME, TMPDIR and checkout (`python -m pkobatch.main job run
--snapshot ...`, a file:// git source and a file:// backend, as bench/runner_overhead.py). Two
rows:

- "emptyDir": what a Job gets today, `PKOBATCH_CACHE_DIR` on an emptyDir, so nothing is kept
  between runs: every run builds the program's virtualenv and downloads the plugin;
- "shared PVC": `PKOBATCH_CACHE_DIR` shared by all the runs, as a PersistentVolume would be.

In each row: Stack A's first run (it creates the resources); runs 2-5 of Stack A (nothing
changes); Stack B's first run (another stack of the same program in the same namespace, so the
same plugin). The baseline is PKO's retained workspace pod: the same no-change `up` (the
Automation API program of bench/runner_overhead.py, run by the program's virtualenv) in a
directory where the plugin and the dependencies are already installed — the checkout, virtualenv
and Pulumi home Stack A's first run of that row left behind — timed alternately with runs 2-5.

Prints the times, the ratios (later targets: runs 2-5 / warm <= 1.15, Stack B first / warm <=
1.25, one plugin download for the whole benchmark), the plugin server's downloads per run and
in all, and the load average.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from runner_overhead import PYTHON_BASELINE, baseline_checkout, git

from pkobatch.dev.plugin_server import PROVIDER_BINARY, PluginServer, pack_plugin
from pkobatch.dev.tools import ToolsMissing, find_tools, versions
from pkobatch.runner.runtimes import PULUMI_HOME_DIRECTORY

REPO_ROOT = Path(__file__).resolve().parents[1]
KUBERNETES_SDK = "pulumi-kubernetes==4.34.2"
RUNS_AFTER_THE_FIRST = 4  # runs 2-5 of Stack A
TARGET_REPEAT_RATIO = 1.15
TARGET_STACK_B_RATIO = 1.25
TARGET_DOWNLOADS = 1
RUN_TIMEOUT_SECONDS = 900.0

PROGRAM = """import pulumi
import pulumi_kubernetes as kubernetes

config = pulumi.Config()
# Render mode: the provider writes manifests to a directory and never calls a cluster.
provider = kubernetes.Provider(
    "render",
    render_yaml_to_directory=config.require("renderDirectory"),
    opts=pulumi.ResourceOptions(
        version=config.require("providerVersion"),
        plugin_download_url=config.require("pluginServer"),
    ),
)
settings = kubernetes.core.v1.ConfigMap(
    "settings",
    metadata={"name": "settings", "namespace": "default"},
    data={"stack": pulumi.get_stack()},
    opts=pulumi.ResourceOptions(provider=provider),
)
pulumi.export("configMap", settings.metadata["name"])
"""


@dataclass
class Run:
    """One timed run and the plugin downloads it caused."""

    seconds: float
    downloads: int


@dataclass
class Row:
    label: str
    first_a: Run | None = None
    repeats_a: list[Run] = field(default_factory=list)
    first_b: Run | None = None
    warm: list[Run] = field(default_factory=list)


def run_checked(
    argv: list[str], env: dict[str, str], cwd: Path, expect: str, server: PluginServer
) -> Run:
    """Time ``argv``; exits when it fails or its output lacks ``expect``."""
    before = server.downloads
    started = time.perf_counter()
    done = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        sys.exit(f"{argv[1:5]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return Run(elapsed, server.downloads - before)


@dataclass(frozen=True)
class Bench:
    root: Path
    source: Path
    base_env: dict[str, str]
    server: PluginServer
    provider_version: str

    def config(self, row_dir: Path, stack: str) -> dict[str, str]:
        return {
            "renderDirectory": str(row_dir / "rendered" / stack),
            "providerVersion": self.provider_version,
            "pluginServer": self.server.url,
        }

    def pod_env(self, pod: Path, cache_dir: Path, backend: Path) -> dict[str, str]:
        """A fresh pod's environment: its own HOME and TMPDIR, the cache directory given."""
        for directory in (pod / "home", pod / "tmp"):
            directory.mkdir(parents=True)
        return {
            **self.base_env,
            "HOME": str(pod / "home"),
            "TMPDIR": str(pod / "tmp"),
            "PKOBATCH_CACHE_DIR": str(cache_dir),
            "PULUMI_BACKEND_URL": backend.as_uri(),
        }

    def job_run(
        self, row_dir: Path, name: str, stack: str, cache_dir: Path | None, expect: str
    ) -> tuple[Run, Path]:
        """One `pkobatch job run` of ``stack`` in a fresh pod; its timing and cache directory."""
        pod = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=row_dir))
        cache = cache_dir or pod / "cache"  # an emptyDir: gone with the pod
        snapshot = {
            "operation": "up",
            "stack": {"name": f"stack-{stack}", "namespace": "bench"},
            "jobName": f"stack-{stack}-up",
            "spec": {
                "stack": stack,
                "projectRepo": self.source.as_uri(),
                "branch": "main",
                "config": self.config(row_dir, stack),
            },
        }
        argv = [sys.executable, "-m", "pkobatch.main", "job", "run"]
        argv += ["--snapshot", json.dumps(snapshot)]
        env = self.pod_env(pod, cache, row_dir / "state")
        return run_checked(argv, env, pod, expect, self.server), cache

    def warm_workspace(self, row_dir: Path, cache: Path) -> tuple[list[str], dict[str, str], Path]:
        """PKO's retained pod: a checkout with its stack, the virtualenv and the Pulumi home
        (with the plugin) a first run left in ``cache``; its stack created by one `up`."""
        venvs = [v for v in (cache / "venvs").iterdir() if (v / "pyvenv.cfg").is_file()]
        if len(venvs) != 1:
            sys.exit(f"expected one virtualenv in {cache / 'venvs'}, found {venvs}")
        env = self.pod_env(row_dir / "warm-pod", cache, row_dir / "state")
        env["PULUMI_HOME"] = str(cache / PULUMI_HOME_DIRECTORY)
        checkout = baseline_checkout(self.source, row_dir / "warm", env)
        argv = [str(venvs[0] / "bin" / "python"), "-c", PYTHON_BASELINE, str(checkout)]
        argv.append(json.dumps(self.config(row_dir, "dev")))
        run_checked(argv, env, checkout, "'create': 3", self.server)
        return argv, env, checkout

    def measure(self, label: str, shared_cache: bool) -> Row:
        row = Row(label)
        row_dir = self.root / label.replace(" ", "-")
        (row_dir / "state").mkdir(parents=True)
        cache = row_dir / "shared-cache" if shared_cache else None
        row.first_a, first_cache = self.job_run(row_dir, "a1", "a", cache, "create=3")
        warm_argv, warm_env, checkout = self.warm_workspace(row_dir, first_cache)
        for number in range(2, 2 + RUNS_AFTER_THE_FIRST):
            repeat, _ = self.job_run(row_dir, f"a{number}", "a", cache, "same=3")
            row.repeats_a.append(repeat)
            row.warm.append(run_checked(warm_argv, warm_env, checkout, "'same': 3", self.server))
        row.first_b, _ = self.job_run(row_dir, "b1", "b", cache, "create=3")
        return row


def report(row: Row) -> None:
    assert row.first_a is not None and row.first_b is not None
    warm_times = [run.seconds for run in row.warm]
    warm = statistics.median(warm_times)
    repeats = statistics.median(run.seconds for run in row.repeats_a)
    downloads = [row.first_a.downloads, *(r.downloads for r in row.repeats_a)]
    downloads.append(row.first_b.downloads)

    def line(label: str, seconds: float, note: str = "") -> str:
        return f"  {label:<40}{seconds:7.2f}  {note}".rstrip()

    spread = f"(min {min(warm_times):.2f}, max {max(warm_times):.2f})"
    repeat_times = [r.seconds for r in row.repeats_a]
    repeat_spread = f"(min {min(repeat_times):.2f}, max {max(repeat_times):.2f})"
    print(f"{row.label}: seconds")
    print(line("warm workspace, no-change up (median)", warm, spread))
    print(line("Stack A, first run", row.first_a.seconds))
    print(line("Stack A, runs 2-5 (median)", repeats, repeat_spread))
    print(line("Stack B, first run", row.first_b.seconds))
    print(f"  ratio Stack A first / warm: {row.first_a.seconds / warm:.2f}")
    print(f"  ratio runs 2-5 / warm:      {repeats / warm:.2f}  (target <= {TARGET_REPEAT_RATIO})")
    print(
        f"  ratio Stack B first / warm: {row.first_b.seconds / warm:.2f}"
        f"  (target <= {TARGET_STACK_B_RATIO})"
    )
    print(
        f"  plugin downloads: {sum(downloads)} (A1, A2-A5, B1: "
        f"{', '.join(str(d) for d in downloads)}; warm workspace: "
        f"{sum(run.downloads for run in row.warm)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        choices=("both", "emptydir", "shared"),
        default="both",
        help="which cache setting to measure (default: both)",
    )
    options = parser.parse_args()
    try:
        tools = find_tools(("pulumi", "kubernetes_provider"))
    except ToolsMissing as error:
        sys.exit(str(error))
    provider_version = versions()["KUBERNETES_PROVIDER_VERSION"]
    pulumi_version = versions()["PULUMI_VERSION"]
    # Only the CLI on PATH: the provider must come from the plugin server.
    path = os.pathsep.join([str(tools.bin_dir("pulumi")), os.environ.get("PATH", "")])
    if found := shutil.which(PROVIDER_BINARY, path=path):
        sys.exit(f"{found} is on PATH: remove it, the runs must download the provider")
    compileall.compile_dir(REPO_ROOT / "pkobatch", quiet=1)  # as the runner image has it
    root = Path(tempfile.mkdtemp(prefix="pkobatch-run-cache-"))
    loads_before = os.getloadavg()
    rows: list[Row] = []
    try:
        source = root / "source"
        source.mkdir()
        (source / "Pulumi.yaml").write_text("name: run-cache\nruntime: python\n")
        (source / "__main__.py").write_text(PROGRAM)
        (source / "requirements.txt").write_text(f"pulumi=={pulumi_version}\n{KUBERNETES_SDK}\n")
        git("init", "-q", "-b", "main", cwd=source)
        git("add", "-A", cwd=source)
        git("commit", "-q", "-m", "program", cwd=source)
        archive = pack_plugin(
            tools.bin_dir("kubernetes_provider") / PROVIDER_BINARY, root, provider_version
        )
        base_env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PULUMI_HOME", "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION")
            and not key.startswith("PULUMI_PLUGIN_DOWNLOAD_URL")
        }
        base_env |= {
            "PATH": path,
            "PULUMI_CONFIG_PASSPHRASE": "bench",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
        }
        with PluginServer(archive) as server:
            bench = Bench(root, source, base_env, server, provider_version)
            settings = {"emptydir": False, "shared": True}
            labels = {"emptydir": "emptyDir cache", "shared": "shared PVC cache"}
            for key, shared in settings.items():
                if options.rows in ("both", key):
                    rows.append(bench.measure(labels[key], shared))
            total = server.downloads
            others = list(server.other_requests)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for row in rows:
        report(row)
    print(f"plugin downloads in all: {total} (target {TARGET_DOWNLOADS})")
    if others:
        print(f"other requests to the plugin server (404): {', '.join(others)}")
    before = ", ".join(f"{load:.2f}" for load in loads_before)
    after = ", ".join(f"{load:.2f}" for load in os.getloadavg())
    print(f"load average (1, 5, 15 min): {before} at the start, {after} at the end")
    print(f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
