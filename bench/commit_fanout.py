"""Commit fan-out: a new commit on a branch that N Stacks follow, until every Stack's Job.

    .venv/bin/python bench/commit_fanout.py [--stacks 1000] [--commits 3] [--workers 8]
        [--poll-interval 60s] [--kube-qps Q] [--kube-burst B] [--push]

On a local control plane, as ``bench/fanout.py`` in its ``controller`` mode (whose pieces
this script imports): kube-controller-manager without its job-controller, and this script
playing the runner for every Job the controller creates (a result for the Job's commit, the
Job complete). The repository is a bare git repository on this machine (a ``file://`` URL:
the branch poller runs the same ``git ls-remote`` on it as on a remote one).

1. N Stacks are created with ``spec.projectRepo`` = that repository and ``spec.branch`` =
   ``main``; each runs once for the first commit and becomes Ready.
2. ``--commits`` times, once the controller is idle: a new commit is pushed to ``main``.
   For each Stack, the seconds from the push until its new Job is seen on a watch. The
   runs are held (started, not finished) until every Job exists, so while the fan-out is
   timed the controller makes only the writes before a run; then they finish and every
   Stack becomes Ready at the new commit before the next push.

With ``--push`` the controller runs its push receiver on loopback (a ``generic`` receiver,
docs/operations.md#push-webhooks) and polls only hourly (unless ``--poll-interval`` says
otherwise); right after each git push this script posts the signed webhook naming the
repository and branch, so detection is the receiver's: the webhook, one ``ls-remote``, one
reconcile.

Printed for each commit: first, p50, p99 and last of those seconds; the detection time (push
to first Job: the branch poller's wait for its next ``ls-remote``, at most the poll
interval, plus one reconcile; with ``--push``, the webhook's answer and the fetch it
starts); the fan-out (first to last Job); and the least time the controller's client rate
limit allows for the fan-out's requests: the controller's own request count between the push
and the last Job (``rest_client_requests_total``) less the Events it posted meanwhile (they
take tokens from a bucket of their own), less the burst the bucket held at the push, divided
by the QPS. A fan-out close to that bound is bound by the rate limit; one much longer is
bound by something else. Also the ``ls-remote`` calls the poller made, the time the
controller's requests waited for the rate limit, the controller's CPU time from the push to
the last Job, and the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fanout import (
    BENCH_NS,
    JSON,
    JobWatch,
    add_rate_limit_options,
    controller_process,
    count_objects,
    load,
    metric_sum,
    percentile,
    prepare_namespaces,
    say,
    stack_body,
    stack_names,
    wait_for,
)

BRANCH = "main"


# ---------------------------------------------------------------------------------------
# Figures (pure)
# ---------------------------------------------------------------------------------------


def rate_limit_bound(requests: float, qps: float, burst: float) -> float:
    """The least seconds a token bucket of ``qps`` tokens a second, holding ``burst`` at the
    start, lets ``requests`` requests through."""
    return max(0.0, requests - burst) / qps


@dataclass(frozen=True)
class CommitFanout:
    """Seconds from a push to each Stack's new Job."""

    latencies: tuple[float, ...]

    @property
    def first(self) -> float:
        return min(self.latencies)

    @property
    def last(self) -> float:
        return max(self.latencies)

    @property
    def fanout(self) -> float:
        """From the first Job to the last: what the controller takes once it saw the head."""
        return self.last - self.first

    def summary(self) -> str:
        return (
            f"first {self.first:.2f}s, p50 {statistics.median(self.latencies):.2f}s, "
            f"p99 {percentile(list(self.latencies), 0.99):.2f}s, last {self.last:.2f}s"
        )


# ---------------------------------------------------------------------------------------
# The repository
# ---------------------------------------------------------------------------------------


class Repository:
    """A bare repository (what the Stacks follow) and a clone pushing commits to it."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "repo.git"
        self._clone = root / "clone"
        self._clone.mkdir(parents=True)
        self._git("init", "-q", "--bare", "-b", BRANCH, str(self.bare))
        self._git("init", "-q", "-b", BRANCH)
        (self._clone / "Pulumi.yaml").write_text("name: bench\nruntime: yaml\n")

    @property
    def url(self) -> str:
        return self.bare.as_uri()

    def push_commit(self, message: str) -> str:
        """Commit and push to the branch; the new head."""
        self._git("add", "-A")
        self._git("commit", "-q", "--allow-empty", "-m", message)
        self._git("push", "-q", str(self.bare), f"HEAD:{BRANCH}")
        return self._git("rev-parse", "HEAD")

    def _git(self, *args: str) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._clone),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@pkobatch.invalid",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@pkobatch.invalid",
        }
        done = subprocess.run(
            ["git", *args], cwd=self._clone, env=env, capture_output=True, text=True, check=True
        )
        return done.stdout.strip()


# ---------------------------------------------------------------------------------------
# The push receiver
# ---------------------------------------------------------------------------------------

RECEIVER = "bench"


@dataclass(frozen=True)
class Webhook:
    """The controller's ``generic`` receiver on loopback, and its secret."""

    port: int
    secret: str

    def signed(self, repository: str, branch: str) -> tuple[bytes, dict[str, str]]:
        """The body and headers of a push of ``branch`` of ``repository``."""
        body = json.dumps({"repository": repository, "branch": branch}).encode()
        digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        return body, {"X-Signature": f"sha256={digest}", "Content-Type": "application/json"}

    def post(self, repository: str, branch: str) -> tuple[int, str]:
        """Send the push; the receiver's status and reply."""
        body, headers = self.signed(repository, branch)
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/hooks/{RECEIVER}", body, headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode().strip()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode().strip()

    def listening(self) -> bool:
        try:
            self.post("", BRANCH)
        except OSError:
            return False
        return True


def configure_receiver(work: Path) -> Webhook:
    """Settings (in this process's environment, which ``controller_process`` passes on)
    for a receiver on a free loopback port; the webhook that reaches it."""
    from pkobatch.dev.processes import free_port

    webhook = Webhook(free_port(), secrets.token_hex(32))
    secrets_dir = work / "receivers"
    secrets_dir.mkdir()
    (secrets_dir / RECEIVER).write_text(webhook.secret)
    os.environ.update(
        {
            "PKOBATCH_RECEIVER__ADDR": f"127.0.0.1:{webhook.port}",
            "PKOBATCH_RECEIVER__RECEIVERS": f"{RECEIVER}=generic",
            "PKOBATCH_RECEIVER__SECRETS_DIR": str(secrets_dir),
        }
    )
    return webhook


# ---------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------


def tracking_body(name: str, url: str) -> JSON:
    body = stack_body(name)
    body["spec"].update(projectRepo=url, branch=BRANCH)
    return body


def count_at(kube: Any, commit: str) -> int:
    """Stacks Ready after a run of ``commit``."""
    from pkobatch.api.constants import CONDITION_READY
    from pkobatch.api.objects import true_condition
    from pkobatch.api.status import last_update
    from pkobatch.kube.client import STACKS

    stacks, _ = kube.list_objects(STACKS, BENCH_NS)
    return sum(
        1
        for stack in stacks
        if last_update(stack.get("status")).get("lastSuccessfulCommit") == commit
        and true_condition(stack, CONDITION_READY)
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_idle(port: int, timeout: float) -> None:
    """Nothing queued in the controller, and its rate limiter's bucket full again."""
    wait_for(lambda: metric_sum(port, "workqueue_depth") == 0, timeout, "an idle controller")
    time.sleep(5)


def measure_commit(
    kube: Any,
    repo: Repository,
    runner: ThreadPoolExecutor,
    controller: tuple[int, int],
    index: int,
    args: argparse.Namespace,
    limits: tuple[float, int],
    webhook: Webhook | None,
) -> CommitFanout:
    from pkobatch.kube.client import EVENTS

    count = args.stacks
    qps, burst = limits
    pid, port = controller
    wait_until_idle(port, args.timeout)
    jobs = JobWatch(kube, BENCH_NS, runner)
    jobs.start()
    try:
        requests_before = metric_sum(port, "rest_client_requests_total")
        waited_before = metric_sum(port, "rest_client_rate_limiter_duration_seconds_sum")
        reconciles_before = metric_sum(port, "controller_runtime_reconcile_total")
        polls_before = metric_sum(port, "pkobatch_git_ls_remote_total")
        events_before = count_objects(kube, EVENTS, BENCH_NS)
        cpu_before = cpu_seconds(pid)
        commit = repo.push_commit(f"commit {index}")
        pushed = time.monotonic()
        if webhook is not None:
            status, reply = webhook.post(repo.url, BRANCH)
            if status != 202:
                raise RuntimeError(f"the push receiver answered {status}: {reply}")
            say(f"  webhook answered {status} after {time.monotonic() - pushed:.3f}s: {reply}")
        wait_for(lambda: jobs.count() >= count, args.timeout, "every Stack's new Job", 0.05)
        cpu = cpu_seconds(pid) - cpu_before
        requests = metric_sum(port, "rest_client_requests_total") - requests_before
        events = count_objects(kube, EVENTS, BENCH_NS) - events_before
        limited = requests - events
        waited = metric_sum(port, "rest_client_rate_limiter_duration_seconds_sum") - waited_before
        reconciles = metric_sum(port, "controller_runtime_reconcile_total") - reconciles_before
        polls = metric_sum(port, "pkobatch_git_ls_remote_total") - polls_before
        seen = [jobs.first_seen(name, 1) for name in stack_names(count)]
        missing = sum(1 for at in seen if at is None)
        if missing:
            raise RuntimeError(f"{missing} Jobs are not of generation 1: see the controller log")
        result = CommitFanout(tuple(at - pushed for at in seen if at is not None))
        bound = rate_limit_bound(limited, qps, burst)
        versus = f"fan-out / bound {result.fanout / bound:.2f}" if bound else "within the burst"
        say(
            f"commit {index} ({commit[:12]}) -> Job created, {count} Stacks: "
            f"{result.summary()}; {load()}"
        )
        say(
            f"  detection (push -> first Job) {result.first:.2f}s; fan-out (first -> last Job) "
            f"{result.fanout:.2f}s; rate limit bound for its {limited / count:.2f} requests "
            f"per Stack ({limited:.0f} at {qps:g} QPS, burst {burst}): {bound:.2f}s "
            f"({versus}); "
            f"and {events / count:.2f} Events per Stack (their own bucket)"
        )
        say(
            f"  {reconciles / count:.2f} reconciles per Stack, {polls:.0f} ls-remote calls, "
            f"requests waited {waited:.1f}s in all for the rate limit; controller CPU from the "
            f"push to the last Job {cpu:.1f}s ({cpu / count * 1000:.1f} ms per Stack, "
            f"{cpu / result.fanout if result.fanout else float('nan'):.2f} of a core over the "
            "fan-out)"
        )
        jobs.release()
        wait_for(lambda: count_at(kube, commit) >= count, args.timeout, "every Stack Ready", 2.0)
        say(f"  every Stack Ready at {commit[:12]} after {time.monotonic() - pushed:.1f}s")
        for error in jobs.errors[:5]:
            say(f"  runner error: {error}")
        return result
    finally:
        jobs.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--commits", type=int, default=3, help="commits pushed and timed")
    parser.add_argument("--workers", type=int, default=8, help="the controller's workers")
    parser.add_argument(
        "--poll-interval", help="the controller's PKOBATCH_POLL_INTERVAL (default: its default)"
    )
    add_rate_limit_options(parser)
    parser.add_argument(
        "--push",
        action="store_true",
        help="post a signed webhook to the controller's push receiver after each git push "
        "(and poll hourly unless --poll-interval is given)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    # Stopped from outside, still stop the control plane and the controller on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.poll_interval or args.push:
        os.environ["PKOBATCH_POLL_INTERVAL"] = args.poll_interval or "1h"

    from pkobatch.config import Settings
    from pkobatch.dev.controlplane import CONTROLLERS, default_crds_dir
    from pkobatch.dev.environment import dev_environment
    from pkobatch.dev.tools import ToolsMissing, find_tools
    from pkobatch.kube.client import STACKS, Kube

    defaults = Settings()
    qps = args.kube_qps or defaults.kube_qps
    burst = args.kube_burst or defaults.kube_burst
    try:
        tools = find_tools(("etcd", "kubernetes"))
    except ToolsMissing as exc:
        sys.exit(str(exc))
    count = args.stacks
    with tempfile.TemporaryDirectory(prefix="pkobatch-commit-fanout-") as tmp:
        work = Path(tmp)
        repo = Repository(work / "git")
        first = repo.push_commit("commit 0")
        webhook = configure_receiver(work) if args.push else None
        with dev_environment(
            work / "cluster",
            tools,
            crds_dir=default_crds_dir(),
            max_pods=1,  # no pod runs: there is no job-controller
            controllers=[c for c in CONTROLLERS if c != "job-controller"],
        ) as environment:
            plane = environment.control_plane
            kube = Kube.connect(str(plane.kubeconfig), qps_pool=32)
            runner = ThreadPoolExecutor(4)
            try:
                prepare_namespaces(kube)
                say(
                    f"commit fan-out: {count} Stacks on branch {BRANCH} of {repo.url}, "
                    f"{args.workers} workers, poll interval {defaults.poll_interval}, "
                    f"rate limit {qps:g} QPS, burst {burst}"
                    f"{'; pushed through the receiver' if webhook else ''}; {load()}"
                )
                with controller_process(plane.kubeconfig, count, work, args, None) as (
                    process,
                    port,
                ):
                    jobs = JobWatch(kube, BENCH_NS, runner)
                    jobs.start()
                    jobs.release()
                    started = time.monotonic()
                    try:
                        for name in stack_names(count):
                            kube.create(STACKS, tracking_body(name, repo.url), BENCH_NS)
                        wait_for(
                            lambda: count_at(kube, first) >= count,
                            args.timeout,
                            "every Stack Ready at the first commit",
                            2.0,
                        )
                    finally:
                        jobs.stop()
                    say(
                        f"every Stack created and Ready at the first commit after "
                        f"{time.monotonic() - started:.1f}s"
                    )
                    if webhook is not None:
                        wait_for(webhook.listening, args.timeout, "the push receiver")
                    results = [
                        measure_commit(
                            kube,
                            repo,
                            runner,
                            (process.pid, port),
                            index,
                            args,
                            (qps, burst),
                            webhook,
                        )
                        for index in range(1, args.commits + 1)
                    ]
                    if len(results) > 1:
                        pooled = CommitFanout(tuple(t for r in results for t in r.latencies))
                        say(f"all {len(results)} commits: {pooled.summary()}; {load()}")
            finally:
                runner.shutdown(wait=True, cancel_futures=True)
                kube.close()


if __name__ == "__main__":
    main()
