"""What the Job runner costs on top of Pulumi: a no-change `up` through `pkobatch job run`
versus a bare `up` of the same program making the same Pulumi CLI calls, measured side by side
in one run, for a Python and a YAML program.

    .venv/bin/python bench/runner_overhead.py [--repetitions 5]

Both sides are fresh processes on the same stack (file:// backend, real Pulumi CLI and YAML
language host from scripts/tools.sh), run alternately; pkobatch's modules are compiled to
bytecode first, as the runner image's pip install does:

- runner: `python -m pkobatch.main job run --snapshot ...`: a fresh git checkout (file://
  URL), the dependency cache, config, `up`, masked outputs, the RunResult (no cluster: the
  snapshot names no result ConfigMap);
- baseline, on an already prepared checkout of the same program:
  - Python (the tests' `files` program plus a requirements.txt, `pulumi==<version>`, so the
    runner builds a virtualenv): a hand-written Automation API program — `Stack.select`,
    `set_all_config`, `up(show_secrets=False)` — reading the outputs once, masked, as the
    runner does (the SDK's own workspace reads them twice, the second time with
    `--show-secrets`);
  - YAML (the tests' `yaml` program): the CLI itself, `pulumi install --no-plugins`, `stack
    select`, `config set-all`, `up`, `stack output --json`, `stack history` (the update's
    summary), from a shell.

Before timing, one traced run of each side (a `pulumi` first on PATH that logs its
arguments) records the Pulumi CLI subcommands it makes; the benchmark stops when the two sides
differ, so the comparison stays like for like. Both sides make, per no-change up:

- Python: `version`, `stack select`, `config set-all`, `up`, `stack output` (masked: no
  `--show-secrets`), `stack history`;
- YAML: `version`, `install`, `stack select`, `config set-all`, `up`, `stack output`,
  `stack history`.

(The runner starts `version` while it checks out the source, see
pkobatch/runner/pulumi_start.py; the other calls run one after another on both sides.)
"cold" is the runner's first run with an empty cache, "warm" the rest. Prints medians and the
ratios runner / baseline (target: warm <= 1.3).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pkobatch.dev.tools import Tools, ToolsMissing, find_tools, versions

REPO_ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = REPO_ROOT / "tests" / "fixtures" / "programs"
TARGET_WARM_RATIO = 1.3
TRACE_ENV = "PKOBATCH_BENCH_TRACE"

PYTHON_BASELINE = """
import json, runpy, sys
from pulumi import automation as auto

class MaskedOutputs(auto.LocalWorkspace):
    # One masked `stack output --json`, as the runner reads outputs.
    def stack_outputs(self, stack_name):
        out = self._run_pulumi_cmd_sync(["stack", "output", "--json", "--stack", stack_name])
        return {k: auto.OutputValue(value=v, secret=v == "[secret]")
                for k, v in json.loads(out.stdout or "{}").items()}

work_dir, config = sys.argv[1], json.loads(sys.argv[2])
workspace = MaskedOutputs(
    work_dir=work_dir,
    program=lambda: runpy.run_path(work_dir + "/__main__.py", run_name="__main__"),
)
stack = auto.Stack.select("dev", workspace)
stack.set_all_config({k: auto.ConfigValue(v) for k, v in config.items()})
result = stack.up(show_secrets=False)
assert result.summary.result == "succeeded", result.summary
print(dict(result.summary.resource_changes or {}))
"""

# The runner's CLI calls for an up, from a shell (flags the Automation API adds for its own
# bookkeeping — an event log, --exec-kind — are left out).
YAML_BASELINE = """set -e
pulumi version >/dev/null
pulumi --non-interactive install --no-plugins
pulumi --non-interactive stack select --stack dev
pulumi --non-interactive config set-all --json "$1" --stack dev
pulumi --non-interactive up --yes --skip-preview --stack dev
pulumi --non-interactive stack output --json --stack dev
pulumi --non-interactive stack history --json --page-size 1 --page 1 --stack dev >/dev/null
"""

# A `pulumi` first on PATH that records each call's subcommand, then runs the real CLI.
TRACE_SHIM = """#!/bin/sh
printf '%s\\n' "$*" >> "$PKOBATCH_BENCH_TRACE"
exec {pulumi} "$@"
"""


@dataclass(frozen=True)
class Program:
    name: str
    fixture: str
    config: dict[str, str]
    runner_no_change: str  # what the runner prints for an up that changed nothing
    baseline_no_change: str  # what the baseline prints for it


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


def subcommand(call: str) -> str:
    """``stack output --json --stack dev`` -> ``stack output``; ``--show-secrets`` is kept
    because it is a different (decrypting) read."""
    words = [w for w in shlex.split(call) if w != "--non-interactive"]
    command: list[str] = []
    for word in words:
        if word.startswith("-"):
            break
        command.append(word)
    if "--show-secrets" in words:
        command.append("--show-secrets")
    return " ".join(command)


def traced_calls(argv: list[str], env: dict[str, str], cwd: Path, shim_dir: Path) -> list[str]:
    trace = shim_dir / "trace.log"
    trace.write_text("")
    traced_env = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}", TRACE_ENV: str(trace)}
    timed(argv, traced_env, cwd)
    return [subcommand(line) for line in trace.read_text().splitlines()]


def pulumi_shim(root: Path, script: str, tools: Tools) -> Path:
    """A new directory ``root``/shim holding ``script`` as ``pulumi`` (``{pulumi}`` in it: the
    real CLI), to put first on PATH."""
    shim_dir = root / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "pulumi"
    shim.write_text(script.format(pulumi=shlex.quote(tools.binary("pulumi", "pulumi"))))
    shim.chmod(0o755)
    return shim_dir


def offline_env(root: Path, tools: Tools) -> dict[str, str]:
    """This environment with the Pulumi CLI and plugins of ``tools`` first on PATH, and
    everything of Pulumi's under ``root``: a file:// backend, nothing downloaded."""
    (root / "state").mkdir()
    return {
        **os.environ,
        "PATH": os.pathsep.join([*tools.pulumi_path(), os.environ.get("PATH", "")]),
        "HOME": str(root / "home"),
        "PULUMI_HOME": str(root / "pulumi-home"),
        "PULUMI_BACKEND_URL": (root / "state").as_uri(),
        "PULUMI_CONFIG_PASSPHRASE": "bench",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "TMPDIR": str(root),
    }


def baseline_checkout(source: Path, checkout: Path, env: dict[str, str]) -> Path:
    """The baseline's checkout of ``source``, with its stack ``dev``, as a hand-written
    program has."""
    shutil.copytree(source, checkout, ignore=shutil.ignore_patterns(".git"))
    subprocess.run(
        ["pulumi", "--non-interactive", "stack", "init", "dev"],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return checkout


def measure(
    program: Program,
    root: Path,
    env: dict[str, str],
    shim_dir: Path,
    repetitions: int,
) -> dict[str, list[float]]:
    work = root / program.name
    source = work / "source"
    shutil.copytree(PROGRAMS / program.fixture, source)
    if program.fixture == "files":
        (source / "requirements.txt").write_text(f"pulumi=={versions()['PULUMI_VERSION']}\n")
    git("init", "-q", "-b", "main", cwd=source)
    git("add", "-A", cwd=source)
    git("commit", "-q", "-m", "program", cwd=source)
    env = {**env, "PKOBATCH_CACHE_DIR": str(work / "cache")}

    checkout = baseline_checkout(source, work / "baseline", env)
    if program.fixture == "files":
        baseline = [sys.executable, "-c", PYTHON_BASELINE, str(checkout)]
        baseline.append(json.dumps(program.config))
    else:
        # `config set-all --json` takes what `pulumi config --json` prints.
        config = {key: {"value": value, "secret": False} for key, value in program.config.items()}
        baseline = ["sh", "-c", YAML_BASELINE, "baseline", json.dumps(config)]
    timed(baseline, env, checkout)  # creates the resources: every later up changes nothing

    snapshot = {
        "operation": "up",
        "stack": {"name": "bench", "namespace": "bench"},
        "jobName": "bench-up",
        "spec": {
            "stack": "dev",
            "projectRepo": source.as_uri(),
            "branch": "main",
            "config": program.config,
        },
    }
    runner = [sys.executable, "-m", "pkobatch.main", "job", "run"]
    runner += ["--snapshot", json.dumps(snapshot)]

    cold = timed(runner, env, work, expect=program.runner_no_change)
    runner_calls = traced_calls(runner, env, work, shim_dir)
    baseline_calls = traced_calls(baseline, env, checkout, shim_dir)
    print(f"{program.name}: Pulumi CLI calls per up: {', '.join(runner_calls)}")
    if runner_calls != baseline_calls:
        sys.exit(
            f"{program.name}: the two sides make different Pulumi CLI calls; fix the baseline\n"
            f"  runner:   {runner_calls}\n  baseline: {baseline_calls}"
        )
    warm: list[float] = []
    bare: list[float] = []
    for _ in range(repetitions):
        warm.append(timed(runner, env, work, expect=program.runner_no_change))
        bare.append(timed(baseline, env, checkout, expect=program.baseline_no_change))
    return {"cold": [cold], "warm": warm, "bare": bare}


def report(program: Program, times: dict[str, list[float]], repetitions: int) -> None:
    bare = statistics.median(times["bare"])
    warm = statistics.median(times["warm"])
    cold = times["cold"][0]

    def row(label: str, values: list[float]) -> str:
        spread = f"(min {min(values):.2f}, max {max(values):.2f})"
        return f"  {label:<34}{statistics.median(values):6.2f}  {spread}"

    print(f"{program.name}: no-change up, {repetitions} repetitions each (medians, seconds)")
    baseline_label = "bare Automation API up" if program.fixture == "files" else "bare pulumi up"
    print(row(baseline_label, times["bare"]))
    print(row("pkobatch job run, warm cache", times["warm"]))
    print(f"  {'pkobatch job run, cold cache':<34}{cold:6.2f}  (one run)")
    print(f"  ratio warm / bare: {warm / bare:.2f}  (target <= {TARGET_WARM_RATIO})")
    print(f"  ratio cold / bare: {cold / bare:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    options = parser.parse_args()
    try:
        tools = find_tools(("pulumi", "yaml"))
    except ToolsMissing as error:
        sys.exit(str(error))

    # As in the runner image, whose pip install compiles them: the runner's modules load from
    # bytecode, not from source recompiled on every run (PYTHONDONTWRITEBYTECODE, editable
    # installs).
    compileall.compile_dir(REPO_ROOT / "pkobatch", quiet=1)
    root = Path(tempfile.mkdtemp(prefix="pkobatch-bench-"))
    try:
        files = root / "files"
        files.mkdir()
        shim_dir = pulumi_shim(root, TRACE_SHIM, tools)
        env = {**offline_env(root, tools), "PULUMI_PYTHON_CMD": sys.executable}
        programs = [
            # The files program has 3 resources (2 files and the stack), the YAML one only
            # the stack.
            Program(
                "python",
                "files",
                {"directory": str(files)},
                "result: succeeded (Succeeded); changes: same=3",
                "{'same': 3}",
            ),
            Program(
                "yaml",
                "yaml",
                {"greeting": "bench"},
                "result: succeeded (Succeeded); changes: same=1",
                "bench from YAML",
            ),
        ]
        results = [
            (program, measure(program, root, env, shim_dir, options.repetitions))
            for program in programs
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for program, times in results:
        report(program, times, options.repetitions)
    # Both sides are timed alternately, but the runner's overlap of its checkout with Pulumi's
    # start needs a free core: say how busy the machine was.
    loads = ", ".join(f"{load:.2f}" for load in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {loads} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
