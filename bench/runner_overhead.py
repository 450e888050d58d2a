"""What the Job runner costs on top of Pulumi: a no-change `up` through `pkobatch job run`
versus the bare Automation API `up` of the same program, measured side by side in one run.

    .venv/bin/python bench/runner_overhead.py [--repetitions 5]

Both sides are fresh processes on the same stack (file:// backend, real Pulumi CLI from
scripts/tools.sh), run alternately:

- baseline: a script that does what a hand-written Automation API program does — a
  LocalWorkspace on an already prepared checkout, `Stack.select`, `up()`;
- runner: `python -m pkobatch.main job run --snapshot ...`: a fresh git checkout (file://
  URL), the dependency cache, config, `up`, masked outputs, the RunResult (no cluster: the
  snapshot names no result ConfigMap).

The program is the tests' `files` program plus a requirements.txt (`pulumi==<version>`), so the
runner builds a virtualenv: "cold" is the first run with an empty cache, "warm" the rest.
Prints medians and the ratios runner / baseline (target: warm <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pkobatch.dev.tools import ToolsMissing, find_tools, versions

REPO_ROOT = Path(__file__).resolve().parents[1]
PROGRAM = REPO_ROOT / "tests" / "fixtures" / "programs" / "files"
TARGET_WARM_RATIO = 1.3
# What each side prints for an up that changed nothing (the program has 3 resources).
RUNNER_NO_CHANGE = "result: succeeded (Succeeded); changes: same=3"
BASELINE_NO_CHANGE = "{'same': 3}"

BASELINE = """
import runpy, sys
from pulumi import automation as auto
work_dir = sys.argv[1]
workspace = auto.LocalWorkspace(
    work_dir=work_dir,
    program=lambda: runpy.run_path(work_dir + "/__main__.py", run_name="__main__"),
)
result = auto.Stack.select("dev", workspace).up()
assert result.summary.result == "succeeded", result.summary
print(dict(result.summary.resource_changes or {}))
"""


def git(*args: str, cwd: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@pkobatch.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@pkobatch.invalid",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def timed(argv: list[str], env: dict[str, str], cwd: Path, expect: str = "") -> float:
    """Seconds ``argv`` took; exits when it fails or its output lacks ``expect``."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        sys.exit(f"{argv[1:4]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    options = parser.parse_args()
    try:
        pulumi_bin = find_tools(("pulumi",)).bin_dir("pulumi")
    except ToolsMissing as error:
        sys.exit(str(error))

    root = Path(tempfile.mkdtemp(prefix="pkobatch-bench-"))
    try:
        source = root / "source"
        shutil.copytree(PROGRAM, source)
        (source / "requirements.txt").write_text(f"pulumi=={versions()['PULUMI_VERSION']}\n")
        git("init", "-q", "-b", "main", cwd=source)
        git("add", "-A", cwd=source)
        git("commit", "-q", "-m", "program", cwd=source)
        files = root / "files"
        files.mkdir()
        (root / "state").mkdir()
        env = {
            **os.environ,
            "PATH": os.pathsep.join([str(pulumi_bin), os.environ.get("PATH", "")]),
            "HOME": str(root / "home"),
            "PULUMI_HOME": str(root / "pulumi-home"),
            "PULUMI_BACKEND_URL": (root / "state").as_uri(),
            "PULUMI_CONFIG_PASSPHRASE": "bench",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_PYTHON_CMD": sys.executable,
            "PKOBATCH_CACHE_DIR": str(root / "cache"),
            "TMPDIR": str(root),
        }

        # The baseline's checkout, with its stack and config, as a hand-written program has.
        checkout = root / "baseline"
        shutil.copytree(source, checkout, ignore=shutil.ignore_patterns(".git"))
        for args in (
            ["stack", "init", "dev"],
            ["config", "set", "directory", str(files)],
        ):
            subprocess.run(
                ["pulumi", "--non-interactive", *args],
                cwd=checkout,
                env=env,
                check=True,
                capture_output=True,
            )
        baseline = [sys.executable, "-c", BASELINE, str(checkout)]
        timed(baseline, env, root)  # creates the resources: every later up changes nothing

        snapshot = {
            "operation": "up",
            "stack": {"name": "bench", "namespace": "bench"},
            "jobName": "bench-up",
            "spec": {
                "stack": "dev",
                "projectRepo": source.as_uri(),
                "branch": "main",
                "config": {"directory": str(files)},
            },
        }
        runner = [sys.executable, "-m", "pkobatch.main", "job", "run"]
        runner += ["--snapshot", json.dumps(snapshot)]

        cold = timed(runner, env, root, expect=RUNNER_NO_CHANGE)
        warm: list[float] = []
        bare: list[float] = []
        for _ in range(options.repetitions):
            warm.append(timed(runner, env, root, expect=RUNNER_NO_CHANGE))
            bare.append(timed(baseline, env, root, expect=BASELINE_NO_CHANGE))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base = statistics.median(bare)
    warm_median = statistics.median(warm)

    def row(label: str, times: list[float]) -> str:
        spread = f"(min {min(times):.2f}, max {max(times):.2f})"
        return f"  {label:<30}{statistics.median(times):6.2f}  {spread}"

    print(f"no-change up, {options.repetitions} repetitions each (medians, seconds)")
    print(row("bare Automation API up", bare))
    print(row("pkobatch job run, warm cache", warm))
    print(f"  {'pkobatch job run, cold cache':<30}{cold:6.2f}  (one run: builds the virtualenv)")
    print(f"ratio warm / bare: {warm_median / base:.2f}  (target <= {TARGET_WARM_RATIO})")
    print(f"ratio cold / bare: {cold / base:.2f}")


if __name__ == "__main__":
    main()
