"""The runner's start-up overhead: a no-change `pulumi up` through `pkobatch job run`, from
the runner image's Python and from the injected runner bundle, versus a bare `pulumi up` of
the same program, measured side by side in one run, and where the difference goes.

    .venv/bin/python bench/runner_startup.py [--repetitions 7] [--bundle DIR]

The program is a YAML project with one output and no resource (the stack only), on a file://
backend, with the real Pulumi CLI and YAML language host (scripts/tools.sh):

- baseline: `pulumi up --yes --skip-preview --stack dev` in a prepared checkout;
- image: `python -m pkobatch.main job run --snapshot ...` with this virtualenv's Python and
  pkobatch compiled to bytecode (the runner image runs `pkobatch job run` from its own
  virtualenv, whose pip install compiles the modules), no cluster: the snapshot names no
  result ConfigMap, so the run makes no Kubernetes API call and prints its result;
- bundle: `<bundle>/pkobatch-runner job run --snapshot ...` (the frozen runner that an init
  container injects into runs whose image has no pkobatch), by default the one
  jobs/build-runner-bundle.sh builds from this checkout (cached; built on first use, which
  takes minutes), as the tests' `runner_bundle` fixture does.

The three are run alternately; each gets its wall-clock time and its CPU time (user and
system, of the process and every process it waited for: Pulumi, its language host, git),
which a busy machine disturbs less. Targets (issue 22): image - bare <= 0.5 s, bundle - image
<= 0.3 s. The breakdown:

- start-up, each median of the repetitions: the interpreter alone (`python -c pass`); the
  interpreter plus the imports of `job run` (`job run --help`, image and bundle, which
  parse no snapshot); the Automation API's import, which the run does on a thread while it
  fetches the source (pkobatch/runner/pulumi_start.py);
- the imports of `job run` by top-level package (self times of `python -X importtime`, one
  run);
- one traced run of each side: a `pulumi` first on PATH records when each CLI call starts and
  ends, and each line the runner prints is timestamped as it arrives, which splits the run
  into: start to the first step (interpreter, imports, snapshot and spec checks), the git
  checkout, the rest until the first sequential Pulumi call, each Pulumi call, the runner's
  own time between them and after the last one (result, exit). `pulumi version` runs during
  the checkout and is not counted in the sequence. The tracer costs a few milliseconds per
  call, so the traced runs are not the timed ones.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import itertools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runner_overhead import baseline_checkout, git, offline_env, pulumi_shim, subcommand, timed

from pkobatch.dev.images import ImageBuildFailed, build_runner_bundle
from pkobatch.dev.tools import ToolsMissing, find_tools

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_IMAGE_OVER_BARE = 0.5
TARGET_BUNDLE_OVER_IMAGE = 0.3
TRACE_ENV = "PKOBATCH_BENCH_TRACE"
NO_CHANGE = "result: succeeded (Succeeded); changes: same=1"
PROGRAM = """name: startup-bench
runtime: yaml
description: pkobatch's start-up benchmark - one output, no resource
outputs:
  greeting: hello
"""

# A `pulumi` first on PATH that records when each call starts and ends, and its arguments.
TIMING_SHIM = """#!/bin/sh
started=$(date +%s.%N)
{pulumi} "$@"
status=$?
printf '%s %s %s\\n' "$started" "$(date +%s.%N)" "$*" >> "$PKOBATCH_BENCH_TRACE"
exit $status
"""


@dataclass(frozen=True)
class Sample:
    wall: float
    cpu: float  # user + system, the process and its descendants


@dataclass(frozen=True)
class Call:
    start: float  # seconds after the run started
    end: float
    command: str


@dataclass(frozen=True)
class Timeline:
    total: float
    first_step: float  # the first line the runner printed ("fetching ...")
    checked_out: float  # "checked out <commit>"
    result: float  # "result: ..."
    calls: list[Call]


def measured(argv: list[str], env: dict[str, str], cwd: Path, expect: str = "") -> Sample:
    """Wall-clock and CPU seconds of ``argv`` and every process it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, env, cwd, expect)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Sample(wall, cpu)


def medians(samples: list[Sample]) -> Sample:
    return Sample(
        statistics.median(s.wall for s in samples), statistics.median(s.cpu for s in samples)
    )


def traced(argv: list[str], env: dict[str, str], cwd: Path, shim_dir: Path) -> Timeline:
    """One run of ``argv`` with the timing ``pulumi`` first on PATH, its lines timestamped."""
    trace = shim_dir / "trace.log"
    trace.write_text("")
    env = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}", TRACE_ENV: str(trace)}
    lines: list[tuple[float, str]] = []
    started = time.time()
    with subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.time() - started, line.rstrip()))
    total = time.time() - started
    if process.returncode != 0 or not any(NO_CHANGE in line for _, line in lines):
        sys.exit(f"traced run {argv[:3]} failed:\n" + "\n".join(line for _, line in lines))

    def at(prefix: str) -> float:
        return next(t for t, line in lines if line.startswith(f"[pkobatch] {prefix}"))

    calls = []
    for record in trace.read_text().splitlines():
        start, end, arguments = record.split(" ", 2)
        calls.append(Call(float(start) - started, float(end) - started, subcommand(arguments)))
    return Timeline(total, at("fetching"), at("checked out"), at("result:"), calls)


def import_times(python: str, env: dict[str, str]) -> tuple[int, list[tuple[str, float]]]:
    """How many modules ``job run`` imports (a count the machine's load does not change), and
    their self import times by top-level package, largest first."""
    done = subprocess.run(
        [python, "-X", "importtime", "-c", "import pkobatch.runner.command"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    totals: collections.Counter[str] = collections.Counter()
    count = 0
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            count += 1
            totals[found[2].split(".")[0]] += int(found[1]) / 1e6
    return count, totals.most_common()


def find_bundle(given: str | None) -> Path:
    if given:
        return Path(given)
    print("runner bundle: jobs/build-runner-bundle.sh (builds unless cached) ...", flush=True)
    try:
        return build_runner_bundle(sys.executable)
    except ImageBuildFailed as error:
        sys.exit(str(error))


def print_timeline(label: str, timeline: Timeline) -> None:
    sequence = [call for call in timeline.calls if call.command != "version"]
    version = [call for call in timeline.calls if call.command == "version"]
    first = sequence[0].start if sequence else timeline.total
    between = sum(b.start - a.end for a, b in itertools.pairwise(sequence))
    last = sequence[-1].end if sequence else timeline.checked_out

    def part(name: str, seconds: float) -> None:
        print(f"    {name:<64}{seconds:5.2f}")

    print(f"  {label}: {timeline.total:.2f} s in all")
    part("start to the first step (interpreter, imports, snapshot, spec)", timeline.first_step)
    part("git checkout", timeline.checked_out - timeline.first_step)
    part(
        "checkout to the first Pulumi call (version, SDK import, host)",
        first - timeline.checked_out,
    )
    for call in version:
        print(f"      (pulumi version, during the checkout: {call.start:.2f} to {call.end:.2f})")
    for call in sequence:
        part(f"pulumi {call.command}", call.end - call.start)
    part("the runner between the Pulumi calls", between)
    part("the last Pulumi call to the result (outputs, RunResult)", timeline.result - last)
    part("the result to the process's end (clean-up, exit)", timeline.total - timeline.result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--bundle", help="the runner bundle's directory (default: build/cache)")
    options = parser.parse_args()
    try:
        tools = find_tools(("pulumi", "yaml"))
    except ToolsMissing as error:
        sys.exit(str(error))
    bundle = find_bundle(options.bundle) / "pkobatch-runner"
    compileall.compile_dir(REPO_ROOT / "pkobatch", quiet=1)

    root = Path(tempfile.mkdtemp(prefix="pkobatch-bench-"))
    try:
        shim_dir = pulumi_shim(root, TIMING_SHIM, tools)
        env = {**offline_env(root, tools), "PKOBATCH_CACHE_DIR": str(root / "cache")}
        source = root / "source"
        source.mkdir()
        (source / "Pulumi.yaml").write_text(PROGRAM)
        git("init", "-q", "-b", "main", cwd=source)
        git("add", "-A", cwd=source)
        git("commit", "-q", "-m", "program", cwd=source)
        checkout = baseline_checkout(source, root / "bare", env)
        bare = ["pulumi", "--non-interactive", "up", "--yes", "--skip-preview", "--stack", "dev"]
        timed(bare, env, checkout)  # the stack's first update: every later up changes nothing
        snapshot = json.dumps(
            {
                "operation": "up",
                "stack": {"name": "bench", "namespace": "bench"},
                "jobName": "bench-up",
                "spec": {"stack": "dev", "projectRepo": source.as_uri(), "branch": "main"},
            }
        )
        python = sys.executable
        image = [python, "-m", "pkobatch.main", "job", "run", "--snapshot", snapshot]
        frozen = [str(bundle), "job", "run", "--snapshot", snapshot]
        work = root / "work"
        work.mkdir()
        for argv in (image, frozen):  # warm: the language host's and git's first start
            timed(argv, env, work, expect=NO_CHANGE)

        times: dict[str, list[Sample]] = {"bare": [], "image": [], "bundle": []}
        for _ in range(options.repetitions):
            times["bare"].append(measured(bare, env, checkout))
            times["image"].append(measured(image, env, work, expect=NO_CHANGE))
            times["bundle"].append(measured(frozen, env, work, expect=NO_CHANGE))
        reps = options.repetitions
        commands = {
            "interpreter": [python, "-c", "pass"],
            "image": [python, "-m", "pkobatch.main", "job", "run", "--help"],
            "bundle": [str(bundle), "job", "run", "--help"],
            "command": [python, "-c", "import pkobatch.runner.command"],
            "sdk": [python, "-c", "import pkobatch.runner.command, pkobatch.runner.pulumi_cli"],
        }
        startup = {
            name: medians([measured(argv, env, work) for _ in range(reps)])
            for name, argv in commands.items()
        }
        module_count, imports = import_times(python, env)
        timelines = {
            "image": traced(image, env, work, shim_dir),
            "bundle": traced(frozen, env, work, shim_dir),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    bare_m, image_m, bundle_m = (medians(times[k]) for k in ("bare", "image", "bundle"))

    def row(label: str, key: str) -> None:
        walls = [sample.wall for sample in times[key]]
        typical = medians(times[key])
        spread = f"(min {min(walls):.2f}, max {max(walls):.2f})"
        print(f"  {label:<42}{typical.wall:6.2f} {spread:<24}{typical.cpu:6.2f}")

    def over(label: str, more: Sample, less: Sample, target: float) -> None:
        wall, cpu = more.wall - less.wall, more.cpu - less.cpu
        print(f"  {label:<42}{wall:+6.2f} {'':<24}{cpu:+6.2f}  (target <= +{target})")

    print(f"no-change up of a YAML program without resources, {reps} repetitions (medians, s)")
    print(f"  {'':<42}{'wall':>6} {'':<24}{'CPU':>6}")
    row("bare pulumi up", "bare")
    row("pkobatch job run, runner image's Python", "image")
    row("pkobatch job run, runner bundle", "bundle")
    over("image - bare", image_m, bare_m, TARGET_IMAGE_OVER_BARE)
    over("bundle - image", bundle_m, image_m, TARGET_BUNDLE_OVER_IMAGE)
    print(
        f"  wall ratios to bare: image {image_m.wall / bare_m.wall:.2f}, bundle "
        f"{bundle_m.wall / bare_m.wall:.2f}"
    )
    print(f"start-up (medians of {reps}, s: wall, CPU)")

    def start(label: str, sample: Sample) -> None:
        print(f"  {label:<62}{sample.wall:5.2f} {sample.cpu:5.2f}")

    start("interpreter alone (python -c pass)", startup["interpreter"])
    start("image: interpreter + job run's imports (job run --help)", startup["image"])
    start("bundle: launcher + frozen app + imports (job run --help)", startup["bundle"])
    sdk = Sample(
        startup["sdk"].wall - startup["command"].wall, startup["sdk"].cpu - startup["command"].cpu
    )
    start("the Automation API's import (a thread, during the checkout)", sdk)
    print(f"job run's imports: {module_count} modules; self times by package (one run, s)")
    shown = [f"{name} {seconds:.3f}" for name, seconds in imports[:10]]
    rest = sum(seconds for _, seconds in imports[10:])
    print(f"  {', '.join(shown)}, others {rest:.3f}")
    print("one traced run of each (seconds; `pulumi` calls timed by a shim)")
    for label, timeline in timelines.items():
        print_timeline(label, timeline)
    print(
        "  Kubernetes API calls: none here (no result ConfigMap); in a Job, reading the Job "
        "runs on a thread and writing the result follows the last Pulumi call"
    )
    loads = ", ".join(f"{load:.2f}" for load in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {loads} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
