"""Fan-out, memory, idleness and edit latency of the controller, against a bare client
doing the same API writes with the same concurrency, measured side by side in one run.

    .venv/bin/python bench/fanout.py [--stacks 1000] [--mode controller|whole] [--history 5]
        [--workers 8] [--idle-seconds 60] [--resync 30s] [--edits 100]

On a local control plane (real etcd, kube-apiserver, kube-controller-manager; scripts/tools.sh).

Modes:

- ``controller`` (default): kube-controller-manager runs without its job-controller, so Jobs
  are created and no pod ever runs. This script plays the runner, the Job controller and the
  kubelet: for every Job the controller creates it writes the Job's result ConfigMap, a pod
  of the Job (bound to a node nothing runs) whose status vouches for the result as a
  kubelet reports the runner's termination message, and marks the Job complete (four
  requests, not counted as the controller's). The controller's whole path runs — Job,
  result, pod, fold, status — and nothing else competes for the two CPUs.
- ``whole``: the Job controller creates pods, the node agent runs them (``--pods`` at once),
  each runs ``write-result`` (this file): a short program writing a valid result with the
  runner's own writer (which vouches for it in the termination message): the whole path,
  pods included.

Phases:

1. baselines: a bare client in its own namespace: one thread applies the N Stacks,
   ``--workers`` threads take each applied Stack and make the writes the controller makes
   before a run, in its order: the Job (built by the controller's own builder, created
   suspended so no pod runs) and its inputs, the finalizer, the status, then queue the Event,
   which the controller's own event recorder posts from its sender thread (as the controller
   does: pkobatch.controller.events). The clock runs from the first apply until every Job
   exists. Twice: the workers' client **unlimited** (it also warms the API server up), then
   **limited** as the controller's is (the same token bucket settings, the Events on a bucket
   of their own).
2. controller: ``pkobatch controller`` with ``--workers`` workers and its rate limit; the same
   applier; the clock runs from the first apply until every Job exists (the same end point).
   The fan-out ratio is the limited baseline's time / the controller's (target >= 0.8): the
   controller's own cost, with the same concurrency, writes and limit on both sides. The
   ratio to the unlimited baseline is printed too: on an idle machine a client without a
   limit outruns any limited one, so that ratio shows how much the limit itself holds back.
   Then until every Stack is Ready.
3. history (controller mode): the controller stops and ``--history`` - 1 finished runs per
   Stack are added — Jobs as the controller builds them, complete, and their results — so
   with the run of phase 2 each Stack has ``--history`` runs, as after that many updates.
4. restart and idle: the controller starts again over all of it (its writes, target 0, and
   its RSS with the history: target <= 256 MiB at 10,000 Stacks with 5 runs each), then
   ``--idle-seconds`` with nothing changing; the controller's resync is shortened to
   ``--resync`` so the window covers at least one: API writes per idle Stack per minute
   (target 0).
5. latency: ``--edits`` spec edits of one Stack at a time among the idle ones: seconds from
   the edit to its Job's creation (seen on a watch), p50 and p99 (target p99 <= 1 s).

Also printed: API requests per Stack (the controller's own client metrics, and the API
server's ``apiserver_request_total`` without this script's requests), the time the
controller's requests waited for its rate limit, and the load of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_NS = "bench-controller"
BASELINE_NS = "bench-baseline"
LIMITED_BASELINE_NS = "bench-baseline-limited"
WRITES = ("POST", "PUT", "PATCH", "DELETE")
TARGET_RATE_RATIO = 0.8
# Each new Stack's reconciles until every Job exists (the echoes of its own writes dropped).
TARGET_RECONCILES_PER_STACK = 1.5
TARGET_RSS_MIB = 256
TARGET_P99_SECONDS = 1.0
# Run trigger of the finished runs the history phase adds (this script completes them).
HISTORY_TRIGGER = "history:"
JSON = dict[str, Any]


# ---------------------------------------------------------------------------------------
# The Jobs' program: write a valid result with the runner's own writer, and exit
# ---------------------------------------------------------------------------------------


def write_result(snapshot_text: str) -> None:
    from pkobatch.api.run import JOB_UID_ENV, RunResult, RunSnapshot
    from pkobatch.kube.client import Kube
    from pkobatch.runner.report import ResultWriter, termination_log_path

    snapshot = RunSnapshot.model_validate_json(snapshot_text)
    writer = ResultWriter(
        Kube.connect,
        snapshot.stack.namespace,
        snapshot.result_config_map,
        termination_log=termination_log_path(os.environ),
        job_uid=os.environ.get(JOB_UID_ENV, ""),
    )
    writer.load_job()  # as the runner does: the result copies the Job's labels
    writer.write(
        RunResult(
            operation=snapshot.operation,
            state="succeeded",
            reason="Succeeded",
            stack=snapshot.stack,
            job_name=snapshot.job_name,
            generation=snapshot.generation,
            reconcile_request=snapshot.reconcile_request,
            commit=snapshot.commit,
            outputs={"stack": snapshot.stack.name},
        )
    )
    writer.close()


# ---------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------


def parse_metrics(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        series, _, value = line.rpartition(" ")
        labels: dict[str, str] = {}
        for part in series[len(name) + 1 : -1].split('",'):
            key, _, raw = part.partition('="')
            labels[key] = raw.rstrip('"')
        samples.append((labels, float(value)))
    return samples


def apiserver_requests(kube: Any) -> Counter[tuple[str, str, str]]:
    """(group, resource, verb) -> count, from the API server's own metrics."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for labels, value in parse_metrics(kube.request_text("/metrics"), "apiserver_request_total"):
        # Counters of the API server are integers.
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[(labels.get("group", ""), resource, labels.get("verb", ""))] += int(value)
    return counts


def controller_relevant(counts: Counter[tuple[str, str, str]]) -> float:
    """Requests to what the controller writes: Stacks, Job creation/deletion, its Events."""
    total = 0.0
    for (group, resource, verb), value in counts.items():
        if group == "pulumi.com" or (
            (group, resource) in (("batch", "jobs"), ("events.k8s.io", "events"))
            and verb in ("POST", "DELETE")
        ):
            total += value
    return total


def writes_by_resource(
    kube: Any,
    tally: Tally,
    server_before: Counter[tuple[str, str, str]],
    own_before: Counter[tuple[str, str, str]],
) -> str:
    """The writes the API server counted since ``server_before``, less this script's own
    since ``own_before``, by resource and verb: who wrote, when the target is none."""
    delta = Counter(apiserver_requests(kube))
    delta.subtract(server_before)
    own = Counter(tally.counts)
    own.subtract(own_before)
    delta.subtract(own)
    writes = {
        f"{verb} {group + '/' if group else ''}{resource}": count
        for (group, resource, verb), count in delta.items()
        if verb in WRITES and count > 0 and resource != "leases"
    }
    return ", ".join(f"{what}: {count}" for what, count in sorted(writes.items())) or "none"


class Tally:
    """Counts this script's own requests, to subtract them from the API server's numbers."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def hook(self, method: str, path: str, status: int) -> None:
        parts = path.strip("/").split("/")
        if parts[0] not in ("api", "apis") or len(parts) < 3:
            return
        group = "" if parts[0] == "api" else parts[1]
        resource = parts[-1] if len(parts) % 2 == 0 else parts[-2]
        if "stacks" in parts:
            resource = "stacks" if parts[-1] != "status" else "stacks/status"
        verb = method if method != "GET" else ("LIST" if len(parts) % 2 == 0 else "GET")
        self.counts[(group, resource, "WATCH" if method == "WATCH" else verb)] += 1


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def count_objects(kube: Any, resource: Any, namespace: str) -> int:
    page = kube.request("GET", resource.path(namespace), query={"limit": 1})
    remaining = int((page.get("metadata") or {}).get("remainingItemCount") or 0)
    return len(page.get("items") or []) + remaining


def count_ready(kube: Any, stacks_resource: Any, namespace: str) -> int:
    items, _ = kube.list_objects(stacks_resource, namespace)
    ready = 0
    for stack in items:
        for condition in (stack.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                ready += 1
    return ready


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


# ---------------------------------------------------------------------------------------
# Stacks, runs and their results
# ---------------------------------------------------------------------------------------


def stack_body(name: str) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {"stack": "dev"},
    }


def stack_names(count: int) -> list[str]:
    return [f"s{index:05d}" for index in range(count)]


def apply_stacks(kube: Any, namespace: str, count: int, applied: Callable[[JSON], None]) -> None:
    from pkobatch.kube.client import STACKS

    for name in stack_names(count):
        applied(kube.create(STACKS, stack_body(name), namespace))


def result_of(job: JSON, **fields: Any) -> JSON:
    """The RunResult a successful run of ``job`` writes (what ``write-result`` writes)."""
    from pkobatch.api.constants import JOB_STACK_UID_ANNOTATION, RUN_ANNOTATION
    from pkobatch.controller.stores import stack_name_of

    meta = job["metadata"]
    run = json.loads(meta["annotations"][RUN_ANNOTATION])
    stack = {
        "name": stack_name_of(job),
        "namespace": meta["namespace"],
        "uid": meta["annotations"][JOB_STACK_UID_ANNOTATION],
    }
    return {
        "schemaVersion": "pkobatch.io/run-result/v1",
        "operation": run["operation"],
        "state": "succeeded",
        "reason": "Succeeded",
        "message": "",
        "stack": stack,
        "jobName": meta["name"],
        "generation": run["generation"],
        "reconcileRequest": run["reconcile_request"],
        "commit": run["commit"],
        "outputs": {"stack": stack["name"]},
        "changes": {"same": 1},
        "pulumiVersion": "3.259.0",
        **fields,
    }


def result_configmap(job: JSON, result: JSON) -> JSON:
    from pkobatch.controller.job_builder import owned_by_job

    meta = job["metadata"]
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": meta["name"], "labels": meta["labels"]},
        "data": {"result.json": json.dumps(result)},
    }
    return owned_by_job(configmap, meta["name"], meta["uid"])


def running_status(at: str) -> JSON:
    """What the Job controller records once the Job's pod exists and is ready."""
    return {"status": {"startTime": at, "active": 1, "ready": 1}}


def complete_status(at: str, started: str) -> JSON:
    """A Job status the API server accepts as finished successfully."""
    return {
        "status": {
            "startTime": started,
            "completionTime": at,
            "active": 0,
            "ready": 0,
            "succeeded": 1,
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "lastTransitionTime": at,
                    "lastProbeTime": at,
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                }
                for kind in ("SuccessCriteriaMet", "Complete")
            ],
        }
    }


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def start_run(kube: Any, job: JSON) -> str:
    """Mark ``job`` running, as the Job controller would once its pod is ready; the start."""
    from pkobatch.kube.client import JOBS

    started = now_rfc3339()
    meta = job["metadata"]
    kube.merge_patch(
        JOBS, meta["name"], running_status(started), meta["namespace"], subresource="status"
    )
    return started


def run_pod(job: JSON) -> JSON:
    """The pod the Job controller would create for ``job``: owned by it, labelled as its
    pods are, bound to a node no agent runs (so nothing runs it)."""
    from pkobatch.api.run import JOB_UID_LABEL
    from pkobatch.controller.job_builder import owned_by_job

    meta = job["metadata"]
    labels = {JOB_UID_LABEL: meta["uid"], "batch.kubernetes.io/job-name": meta["name"]}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{meta['name']}-run", "labels": labels},
        "spec": {
            "nodeName": "bench-no-node",
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{"name": "pulumi", "image": "bench"}],
        },
    }
    return owned_by_job(pod, meta["name"], meta["uid"])


def vouched_status(result_text: str, at: str) -> JSON:
    """The pod's status once its runner vouched for ``result_text`` and exited (as the
    kubelet reports the termination message)."""
    from pkobatch.api.run import result_digest_line

    terminated = {
        "exitCode": 0,
        "reason": "Completed",
        "message": result_digest_line(result_text),
        "startedAt": at,
        "finishedAt": at,
    }
    return {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "pulumi",
                    "image": "bench",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }


def finish_run(kube: Any, job: JSON, started: str) -> None:
    """What a successful run leaves: its result, its pod vouching for it, its Job complete."""
    from pkobatch.kube.client import CONFIGMAPS, JOBS, PODS, AlreadyExists

    namespace = job["metadata"]["namespace"]
    result = result_configmap(job, result_of(job))
    with contextlib.suppress(AlreadyExists):
        kube.create(CONFIGMAPS, result, namespace)
    pod = run_pod(job)
    with contextlib.suppress(AlreadyExists):
        kube.create(PODS, pod, namespace)
    kube.merge_patch(
        PODS,
        pod["metadata"]["name"],
        vouched_status(result["data"]["result.json"], now_rfc3339()),
        namespace,
        subresource="status",
    )
    kube.merge_patch(
        JOBS,
        job["metadata"]["name"],
        complete_status(now_rfc3339(), started),
        namespace,
        subresource="status",
    )


class JobWatch:
    """Watches the Jobs of a namespace: when each was first seen (by Stack and generation),
    and, in controller mode, plays the runner for each new one."""

    def __init__(self, kube: Any, namespace: str, runner: ThreadPoolExecutor | None) -> None:
        self._kube = kube
        self._namespace = namespace
        self._runner = runner
        self._lock = threading.Lock()
        self.seen: dict[tuple[str, int], float] = {}
        self._names: set[str] = set()
        self._stop = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[str] = []
        # Runs start at once (as the Job controller and a kubelet would start them) but
        # are held, running, until ``release()``: while the fan-out is timed, the
        # controller makes only the writes before a run, as the baseline does.
        self._gate = threading.Event()
        self._held: list[tuple[JSON, str]] = []
        self._listed = threading.Event()

    def release(self) -> None:
        """Finish the held runs, and every later one as soon as it has started."""
        with self._lock:
            self._gate.set()
            held, self._held = self._held, []
        if self._runner is not None:
            for job, started in held:
                self._runner.submit(self._finish, job, started)

    def start(self) -> None:
        """Returns once the watch's starting point is listed: every Job created after this
        call is seen."""
        self._thread.start()
        self._listed.wait(60)

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.stop()
        self._thread.join(10)

    def count(self) -> int:
        with self._lock:
            return len(self._names)

    def arrived(self, stack: str, generation: int) -> bool:
        return self.first_seen(stack, generation) is not None

    def first_seen(self, stack: str, generation: int) -> float | None:
        with self._lock:
            return self.seen.get((stack, generation))

    def _run(self) -> None:
        from pkobatch.api.constants import RUN_ANNOTATION
        from pkobatch.controller.stores import stack_name_of
        from pkobatch.kube.client import JOBS, KubeError

        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    _, version = self._kube.list_objects(JOBS, self._namespace, page_size=1)
                    self._listed.set()
                self._stream = self._kube.watch(
                    JOBS, self._namespace, resource_version=version, timeout_seconds=300
                )
                for event in self._stream:
                    at = time.monotonic()
                    meta = event.object.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    if event.type != "ADDED":
                        continue
                    run = json.loads((meta.get("annotations") or {}).get(RUN_ANNOTATION, "{}"))
                    key = (str(stack_name_of(event.object)), int(run.get("generation", 0)))
                    with self._lock:
                        self._names.add(str(meta.get("name")))
                        self.seen.setdefault(key, at)
                    finished = any(
                        c.get("type") == "Complete"
                        for c in (event.object.get("status") or {}).get("conditions") or ()
                    )
                    history = str(run.get("trigger", "")).startswith(HISTORY_TRIGGER)
                    if self._runner is not None and not finished and not history:
                        self._runner.submit(self._start, event.object)
            except KubeError as exc:
                if self._stop.is_set():
                    return
                if exc.status == 410:
                    version = ""
                time.sleep(0.5)

    def _start(self, job: JSON) -> None:
        try:
            started = start_run(self._kube, job)
        except Exception as exc:  # reported at the end; a benchmark must not hide errors
            self.errors.append(f"{job['metadata']['name']}: {exc}")
            return
        with self._lock:
            if not self._gate.is_set():
                self._held.append((job, started))
                return
        self._finish(job, started)

    def _finish(self, job: JSON, started: str) -> None:
        try:
            finish_run(self._kube, job, started)
        except Exception as exc:
            self.errors.append(f"{job['metadata']['name']}: {exc}")


# ---------------------------------------------------------------------------------------
# The baselines: a bare client, as concurrent as the controller, the same writes
# ---------------------------------------------------------------------------------------


def run_baseline(applier: Any, kube: Any, count: int, workers: int, namespace: str) -> float:
    """Seconds from the first apply (by ``applier``) until every Stack's Job (and the writes
    before it, by ``workers`` threads sharing ``kube``) exist in ``namespace``."""
    from pkobatch.api.run import Run
    from pkobatch.api.stack.spec import StackSpec
    from pkobatch.config import Settings
    from pkobatch.controller.events import EventRecorder
    from pkobatch.controller.job_builder import build_run, builtin_template, owned_by_job
    from pkobatch.kube.client import CONFIGMAPS, JOBS, SECRETS, STACKS

    settings = Settings().job
    template = builtin_template()
    events = EventRecorder(kube.with_own_rate_limit(), namespace)
    applied: queue.Queue[JSON | None] = queue.Queue()
    job_created: list[float] = []

    def before_run(stack: JSON) -> None:
        meta = stack["metadata"]
        run = Run("up", "sync", 1, "", "", "after::")
        objects = build_run(stack, StackSpec(stack="dev"), run, settings, template)
        job = objects.job
        job["spec"]["suspend"] = True  # the same object, but no pod: only the API writes count
        created = kube.create(JOBS, job, namespace)
        job_created.append(time.monotonic())
        for item in objects.inputs:
            owned = owned_by_job(item, job["metadata"]["name"], created["metadata"]["uid"])
            kube.create(SECRETS if item["kind"] == "Secret" else CONFIGMAPS, owned, namespace)
        updated = kube.merge_patch(
            STACKS,
            meta["name"],
            {
                "metadata": {
                    "finalizers": ["finalizer.stack.pulumi.com"],
                    "resourceVersion": meta["resourceVersion"],
                }
            },
            namespace,
        )
        kube.merge_patch(
            STACKS,
            meta["name"],
            {
                "metadata": {"resourceVersion": updated["metadata"]["resourceVersion"]},
                "status": {
                    "observedGeneration": 1,
                    "currentUpdate": {
                        "generation": 1,
                        "reconcileRequest": "",
                        "name": job["metadata"]["name"],
                        "commit": "",
                    },
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "NotReadyInProgress",
                            "message": "reconciliation is in progress",
                            "lastTransitionTime": now_rfc3339(),
                        },
                        {
                            "type": "Reconciling",
                            "status": "True",
                            "reason": "StackProcessing",
                            "message": "running up",
                            "lastTransitionTime": now_rfc3339(),
                        },
                    ],
                },
            },
            namespace,
            subresource="status",
        )
        events.post(updated, "Normal", "StackUpdateDetected", "initial stack update")

    def worker() -> None:
        while (stack := applied.get()) is not None:
            before_run(stack)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    events.start()
    for thread in threads:
        thread.start()
    started = time.monotonic()
    apply_stacks(applier, namespace, count, applied.put)
    for _ in threads:
        applied.put(None)
    for thread in threads:
        thread.join()
    events.stop()
    return max(job_created) - started


# ---------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def controller_process(
    kubeconfig: Path, count: int, work: Path, args: argparse.Namespace, resync: str | None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``pkobatch controller``; ``resync``: its resync period (None: the default)."""
    from pkobatch.dev.environment import controller_argv
    from pkobatch.dev.processes import free_port

    port = free_port()
    env = {
        **os.environ,
        "PKOBATCH_JOB__COMMAND": f"{sys.executable},{Path(__file__).resolve()},write-result",
        "PKOBATCH_MAX_ACTIVE_JOBS": str(count),
        "PKOBATCH_LOG_LEVEL": "warning",
        **({"PKOBATCH_RESYNC_PERIOD": resync} if resync else {}),
        **({"PKOBATCH_KUBE_QPS": str(args.kube_qps)} if args.kube_qps else {}),
        **({"PKOBATCH_KUBE_BURST": str(args.kube_burst)} if args.kube_burst else {}),
    }
    log = (work / "controller.log").open("ab")
    process = subprocess.Popen(
        controller_argv(
            kubeconfig=kubeconfig,
            namespaces=BENCH_NS,
            metrics_addr=f"127.0.0.1:{port}",
            health_addr="0",
            workers=args.workers,
        ),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _serving(port, process), 60, "the controller's metrics endpoint")
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _serving(port: int, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError("the controller exited; see its log")
    try:
        scrape(port)
    except OSError:
        return False
    return True


def say(line: str) -> None:
    """Results are printed as soon as they are known: a long run that is cut short still
    reports what it measured."""
    print(line, flush=True)


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of ``pid``."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", float("nan")), values.get("VmHWM", float("nan"))


def report_rss(pid: int, when: str) -> None:
    current, peak = rss_mib(pid)
    say(f"controller RSS {when}: {current:.0f} MiB (peak so far {peak:.0f} MiB)")


def load() -> str:
    return "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def metric_sum(port: int, name: str, methods: tuple[str, ...] | None = None) -> float:
    return sum(
        value
        for labels, value in parse_metrics(scrape(port), name)
        if methods is None or labels.get("method") in methods
    )


def add_history(kube: Any, count: int, runs: int, workers: int) -> None:
    """``runs`` earlier finished runs per Stack, as they would have been left: the Job the
    controller builds (complete) and its result."""
    from pkobatch.api.run import Run
    from pkobatch.api.stack.spec import StackSpec
    from pkobatch.config import Settings
    from pkobatch.controller.job_builder import build_run, builtin_template
    from pkobatch.kube.client import CONFIGMAPS, JOBS, STACKS

    settings = Settings().job
    template = builtin_template()
    stacks, _ = kube.list_objects(STACKS, BENCH_NS)

    def one(stack: JSON) -> None:
        for index in range(runs):
            run = Run("up", "sync", 1, "", "", f"{HISTORY_TRIGGER}{index}")
            job = build_run(stack, StackSpec(stack="dev"), run, settings, template).job
            created = kube.create(JOBS, job, BENCH_NS)
            kube.create(CONFIGMAPS, result_configmap(created, result_of(created)), BENCH_NS)
            # Finished now: a completion time long past would have kube-controller-manager's
            # TTL-after-finished controller delete these Jobs (and the controller their
            # results) while the restart and idle phases count writes.
            at = now_rfc3339()
            kube.merge_patch(
                JOBS,
                created["metadata"]["name"],
                complete_status(at, at),
                BENCH_NS,
                subresource="status",
            )

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, stacks))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure_latency(kube: Any, jobs: JobWatch, count: int, edits: int, timeout: float) -> None:
    from pkobatch.kube.client import STACKS

    names = stack_names(count)
    step = max(1, count // max(1, edits))
    latencies = []
    for index in range(edits):
        name = names[(index * step) % count]
        started = time.monotonic()
        updated = kube.merge_patch(
            STACKS, name, {"spec": {"config": {"bench:edit": str(index)}}}, BENCH_NS
        )
        generation = int(updated["metadata"]["generation"])
        wait_for(
            functools.partial(jobs.arrived, name, generation),
            timeout,
            f"the Job of edit {index} ({name})",
            0.005,
        )
        seen = jobs.first_seen(name, generation)
        assert seen is not None
        latencies.append(seen - started)
        time.sleep(0.2)  # no backlog: one edit at a time
    say(
        f"edit -> Job created, one edit at a time among {count} idle Stacks ({edits} edits): "
        f"p50 {statistics.median(latencies):.3f}s, p99 {percentile(latencies, 0.99):.3f}s, "
        f"max {max(latencies):.3f}s (target p99 <= {TARGET_P99_SECONDS}s)"
    )


def measure_controller(
    kube: Any,
    tally: Tally,
    kubeconfig: Path,
    count: int,
    args: argparse.Namespace,
    work: Path,
    baselines: tuple[float, float],
) -> None:
    """``baselines``: the limited and the unlimited baseline's seconds."""
    from pkobatch.kube.client import STACKS

    runner = ThreadPoolExecutor(4) if args.mode == "controller" else None
    jobs = JobWatch(kube, BENCH_NS, runner)
    jobs.start()
    try:
        with controller_process(kubeconfig, count, work, args, None) as (process, port):
            own_before = Counter(tally.counts)
            server_before = apiserver_requests(kube)
            controller_before = metric_sum(port, "rest_client_requests_total")
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                applying = pool.submit(apply_stacks, kube, BENCH_NS, count, lambda _: None)
                wait_for(lambda: jobs.count() >= count, args.timeout, "every Job", 0.05)
                jobs_seconds = time.monotonic() - started
                applying.result()
            limited_seconds, unlimited_seconds = baselines
            ratio = limited_seconds / jobs_seconds
            verdict = "met" if ratio >= TARGET_RATE_RATIO else "NOT met"
            say(
                f"controller: every Job exists after {jobs_seconds:.1f}s "
                f"({count / jobs_seconds:.1f} Stacks/s); {load()}"
            )
            say(
                f"fan-out ratio controller/limited baseline: {ratio:.2f} "
                f"(target >= {TARGET_RATE_RATIO}: {verdict}); controller/unlimited baseline: "
                f"{unlimited_seconds / jobs_seconds:.2f}"
            )
            report_rss(process.pid, "when every Job exists")
            reconciles = metric_sum(port, "controller_runtime_reconcile_total")
            per_stack = reconciles / count
            say(
                f"reconciles per new Stack before its Job exists: {per_stack:.2f} (target <= "
                f"{TARGET_RECONCILES_PER_STACK}: "
                f"{'met' if per_stack <= TARGET_RECONCILES_PER_STACK else 'NOT met'})"
            )
            jobs.release()

            wait_for(
                lambda: count_ready(kube, STACKS, BENCH_NS) >= count,
                args.timeout,
                "every Stack Ready",
                max(2.0, count / 500),
            )
            say(f"controller: every Stack Ready after {time.monotonic() - started:.1f}s")
            own = Counter(tally.counts)
            own.subtract(own_before)
            server_delta = Counter(apiserver_requests(kube))
            server_delta.subtract(server_before)
            server_delta.subtract(own)
            controller_total = metric_sum(port, "rest_client_requests_total") - controller_before
            say(f"API requests per Stack, controller's client: {controller_total / count:.2f}")
            say(
                "API requests per Stack, apiserver_request_total (Stacks, Job create/delete, "
                f"events.k8s.io create; this script's own removed): "
                f"{controller_relevant(server_delta) / count:.2f}"
            )
            waited = metric_sum(port, "rest_client_rate_limiter_duration_seconds_sum")
            say(f"controller requests waited {waited:.1f}s in all for the client rate limit")
            report_rss(process.pid, "when every Stack is Ready")

        if args.history > 1 and args.mode == "controller":
            # Added while no controller runs, as a restarted controller finds the runs of
            # Stacks updated that often: this script creates a Job and then marks it
            # finished, and a controller watching in between would rightly adopt it as an
            # orphaned run and fold its result, which no pod vouches for, as a failure to
            # retry.
            extra = args.history - 1
            history_started = time.monotonic()
            add_history(kube, count, extra, 2 * args.workers)
            wait_for(
                lambda: jobs.count() >= count * args.history,
                args.timeout,
                "every history Job seen",
                0.5,
            )
            say(
                f"history: {extra} more finished runs per Stack added in "
                f"{time.monotonic() - history_started:.0f}s "
                f"({count * args.history} Jobs and results in all)"
            )

        # The idle phase runs a restarted controller whose resync is short enough for the
        # window to cover one (a short resync during the fan-out would re-queue every Stack
        # again and again and slow it): it lists everything, history included, reconciles
        # every Stack, and then must stay quiet.
        with controller_process(kubeconfig, count, work, args, args.resync) as (process, port):
            server_before, own_before = apiserver_requests(kube), Counter(tally.counts)
            restarted = time.monotonic()
            wait_for(
                lambda: (
                    metric_sum(port, "controller_runtime_reconcile_total") >= count
                    and metric_sum(port, "workqueue_depth") == 0
                ),
                args.timeout,
                "the restarted controller to reconcile every Stack",
                1.0,
            )
            startup_writes = metric_sum(port, "rest_client_requests_total", WRITES)
            say(
                f"restarted controller (resync every {args.resync}): every Stack reconciled "
                f"after {time.monotonic() - restarted:.1f}s with {startup_writes:.0f} writes "
                f"(target 0); {load()}"
            )
            say(
                "  writes at the API server (Leases and this script's own left out): "
                + writes_by_resource(kube, tally, server_before, own_before)
            )
            report_rss(process.pid, "after the restart's list and first reconciles")
            server_before, own_before = apiserver_requests(kube), Counter(tally.counts)
            idle_before = metric_sum(port, "rest_client_requests_total", WRITES)
            reads_before = metric_sum(port, "rest_client_requests_total")
            reconciles_before = metric_sum(port, "controller_runtime_reconcile_total")
            time.sleep(args.idle_seconds)
            idle_writes = metric_sum(port, "rest_client_requests_total", WRITES) - idle_before
            idle_all = metric_sum(port, "rest_client_requests_total") - reads_before
            idle_reconciles = (
                metric_sum(port, "controller_runtime_reconcile_total") - reconciles_before
            )
            minutes = args.idle_seconds / 60
            say(
                f"idle {args.idle_seconds:.0f}s ({idle_reconciles / count:.1f} reconciles per "
                f"Stack): {idle_writes / count / minutes:.4f} writes per idle Stack per minute "
                f"(target 0), {idle_all / minutes:.1f} requests per minute in all"
            )
            say(
                "  writes at the API server (Leases and this script's own left out): "
                + writes_by_resource(kube, tally, server_before, own_before)
            )
            report_rss(process.pid, "after the idle window")

            if args.edits and args.mode == "controller":
                measure_latency(kube, jobs, count, args.edits, args.timeout)
            _, peak = rss_mib(process.pid)
            say(
                f"restarted controller peak RSS: {peak:.0f} MiB at {count} Stacks with "
                f"{args.history} runs each (target <= {TARGET_RSS_MIB} MiB at 10,000 Stacks "
                f"with 5 runs each); {load()}"
            )
    finally:
        jobs.stop()
        if runner is not None:
            runner.shutdown(wait=True, cancel_futures=True)
        for error in jobs.errors[:5]:
            say(f"runner error: {error}")


def prepare_namespaces(kube: Any) -> None:
    from pkobatch.kube.client import CLUSTERROLES, NAMESPACES, ROLEBINDINGS, SERVICEACCOUNTS

    runner_role = yaml.safe_load(
        (REPO_ROOT / "deploy/kustomize/base/runner-clusterrole.yaml").read_text()
    )
    kube.apply(CLUSTERROLES, runner_role, field_manager="bench")
    for namespace in (BENCH_NS, BASELINE_NS, LIMITED_BASELINE_NS):
        kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "pkobatch-runner"}},
        BENCH_NS,
    )
    binding = yaml.safe_load((REPO_ROOT / "deploy/kustomize/runner/rolebinding.yaml").read_text())
    kube.create(ROLEBINDINGS, binding, BENCH_NS)


def add_rate_limit_options(parser: argparse.ArgumentParser) -> None:
    """``--kube-qps`` and ``--kube-burst``, which ``controller_process`` passes on."""
    parser.add_argument(
        "--kube-qps", type=float, help="the controller's rate limit (default: its default)"
    )
    parser.add_argument("--kube-burst", type=int, help="the controller's burst (default: its)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument(
        "--mode",
        choices=("controller", "whole"),
        default="controller",
        help="controller: no pods, this script plays the runner; whole: pods run",
    )
    parser.add_argument("--history", type=int, default=5, help="runs per Stack (controller)")
    parser.add_argument("--workers", type=int, default=8, help="controller workers = baseline")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--resync", default="30s", help="the controller's resync period")
    parser.add_argument("--edits", type=int, default=100, help="latency samples (controller)")
    parser.add_argument("--pods", type=int, default=8, help="pods the node agent runs at once")
    add_rate_limit_options(parser)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    # Stopped from outside, still stop the control plane and the controller on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from pkobatch.api.durations import parse_duration
    from pkobatch.config import load_settings
    from pkobatch.dev.controlplane import CONTROLLERS, default_crds_dir
    from pkobatch.dev.environment import dev_environment
    from pkobatch.dev.tools import ToolsMissing, find_tools
    from pkobatch.kube.client import Kube
    from pkobatch.kube.ratelimit import TokenBucket

    if parse_duration(args.resync).total_seconds() > args.idle_seconds:
        sys.exit("--idle-seconds must cover at least one --resync period")
    try:
        tools = find_tools(("etcd", "kubernetes"))
    except ToolsMissing as exc:
        sys.exit(str(exc))
    controllers = (
        [c for c in CONTROLLERS if c != "job-controller"]
        if args.mode == "controller"
        else CONTROLLERS
    )
    count = args.stacks
    with tempfile.TemporaryDirectory(prefix="pkobatch-fanout-") as tmp:
        work = Path(tmp)
        with dev_environment(
            work / "cluster",
            tools,
            crds_dir=default_crds_dir(),
            max_pods=args.pods,
            controllers=controllers,
        ) as environment:
            plane = environment.control_plane
            tally = Tally()
            kube = Kube.connect(str(plane.kubeconfig), on_request=tally.hook, qps_pool=32)
            try:
                prepare_namespaces(kube)
                # The controller's limit: its settings, with these flags passed on.
                settings = load_settings(kube_qps=args.kube_qps, kube_burst=args.kube_burst)
                limit = f"rate limit {settings.kube_qps:g} QPS, burst {settings.kube_burst}"
                say(
                    f"fan-out of {count} Stacks, mode {args.mode}, {args.workers} workers, "
                    f"{limit}; {load()}"
                )
                unlimited_seconds = run_baseline(kube, kube, count, args.workers, BASELINE_NS)
                say(
                    f"baseline ({args.workers} threads, bare client, no limit): every Job exists "
                    f"after {unlimited_seconds:.1f}s ({count / unlimited_seconds:.1f} Stacks/s)"
                )
                limited = Kube.connect(
                    str(plane.kubeconfig),
                    on_request=tally.hook,
                    qps_pool=32,
                    rate_limiter=TokenBucket(settings.kube_qps, settings.kube_burst),
                )
                try:
                    limited_seconds = run_baseline(
                        kube, limited, count, args.workers, LIMITED_BASELINE_NS
                    )
                finally:
                    limited.close()
                say(
                    f"baseline ({args.workers} threads, bare client, {limit}): every Job exists "
                    f"after {limited_seconds:.1f}s ({count / limited_seconds:.1f} Stacks/s)"
                )
                measure_controller(
                    kube,
                    tally,
                    plane.kubeconfig,
                    count,
                    args,
                    work,
                    (limited_seconds, unlimited_seconds),
                )
            finally:
                kube.close()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "write-result" and sys.argv[2] == "--snapshot":
        write_result(sys.argv[3])
    else:
        main()
