"""Fan-out: N Stacks applied at once, against a bare client loop doing the same API writes.

    .venv/bin/python bench/fanout.py [--stacks 1000] [--idle-seconds 60]

On a local control plane (real etcd, kube-apiserver, kube-controller-manager and the node
agent, from scripts/tools.sh), measured side by side in one run:

- controller: `pkobatch controller` (a process) watching one namespace; N Stacks are applied
  as fast as one client can; the clock runs from the first apply until every Stack has its
  Job, and until every Stack is Ready. Each Job runs a tiny real program (this file,
  `write-result`) that writes a valid RunResult ConfigMap owned by its Job, so the
  controller's whole path runs: Job, pod, result, fold, status.
- baseline: a plain loop with the same client library in another namespace: create the N
  Stacks, then per Stack the writes the controller makes before a run (finalizer, the same
  Job created suspended, status, Event) and after it (status, Event).

Prints the rate ratio controller / baseline for "every Job exists" (target >= 0.5), the time
until every Stack is Ready, the controller's peak RSS (target <= 256 MiB at 5,000 Stacks), API
requests per Stack (the controller's own client metrics and the API server's
apiserver_request_total), and writes per idle Stack per minute afterwards (target 0).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
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
WRITES = ("POST", "PUT", "PATCH", "DELETE")
TARGET_RATE_RATIO = 0.5
TARGET_RSS_MIB = 256
JSON = dict[str, Any]


# ---------------------------------------------------------------------------------------
# The Jobs' program: write a valid result and exit (stdlib + PyYAML only: it runs N times)
# ---------------------------------------------------------------------------------------


def write_result(snapshot_text: str) -> None:
    snapshot = json.loads(snapshot_text)
    with open(os.environ["KUBECONFIG"]) as handle:
        config = yaml.safe_load(handle)
    cluster = config["clusters"][0]["cluster"]
    token = config["users"][0]["user"]["token"]
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
    )
    namespace, name = snapshot["stack"]["namespace"], snapshot["jobName"]

    def call(method: str, path: str, body: JSON | None = None) -> JSON:
        request = urllib.request.Request(
            cluster["server"] + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=30) as reply:
            return dict(json.loads(reply.read()))

    job = call("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    result = {
        "schemaVersion": "pkobatch.io/run-result/v1",
        "operation": snapshot["operation"],
        "state": "succeeded",
        "reason": "Succeeded",
        "message": "",
        "stack": snapshot["stack"],
        "jobName": name,
        "generation": snapshot["generation"],
        "reconcileRequest": snapshot["reconcileRequest"],
        "commit": snapshot["commit"],
        "outputs": {"stack": snapshot["stack"]["name"]},
    }
    call(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": job["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "data": {"result.json": json.dumps(result)},
        },
    )


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


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def controller_requests(port: int, methods: tuple[str, ...] | None = None) -> float:
    return sum(
        value
        for labels, value in parse_metrics(scrape(port), "rest_client_requests_total")
        if methods is None or labels.get("method") in methods
    )


# ---------------------------------------------------------------------------------------
# The two sides
# ---------------------------------------------------------------------------------------


def stack_body(name: str) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": {"stack": "dev"},
    }


def apply_stacks(kube: Any, namespace: str, count: int) -> None:
    from pkobatch.kube.client import STACKS

    for index in range(count):
        kube.create(STACKS, stack_body(f"s{index:05d}"), namespace)


def run_baseline(kube: Any, count: int) -> tuple[float, float]:
    """Seconds for (create Stacks + the writes before each run), and for the writes after."""
    from pkobatch.api.stack import StackSpec
    from pkobatch.config import Settings
    from pkobatch.controller.events import EventRecorder
    from pkobatch.controller.jobs import Run, build_job, builtin_template
    from pkobatch.kube.client import JOBS, STACKS

    settings = Settings().job
    template = builtin_template()
    events = EventRecorder(kube, "bench-baseline")
    started = time.monotonic()
    apply_stacks(kube, BASELINE_NS, count)
    stacks, _ = kube.list_objects(STACKS, BASELINE_NS)
    for stack in stacks:
        meta = stack["metadata"]
        updated = kube.merge_patch(
            STACKS,
            meta["name"],
            {
                "metadata": {
                    "finalizers": ["finalizer.stack.pulumi.com"],
                    "resourceVersion": meta["resourceVersion"],
                }
            },
            BASELINE_NS,
        )
        run = Run("up", "sync", 1, "", "", "after::")
        job = build_job(updated, StackSpec(stack="dev"), run, settings, template)
        job["spec"]["suspend"] = True  # the same object, but no pod: only the API writes count
        kube.create(JOBS, job, BASELINE_NS)
        kube.merge_patch(
            STACKS,
            meta["name"],
            {
                "metadata": {"resourceVersion": updated["metadata"]["resourceVersion"]},
                "status": {
                    "observedGeneration": 1,
                    "currentUpdate": {
                        "generation": 1,
                        "name": job["metadata"]["name"],
                        "commit": "",
                    },
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "NotReadyInProgress",
                            "message": "reconciliation is in progress",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ],
                },
            },
            BASELINE_NS,
            subresource="status",
        )
        events.post(updated, "Normal", "StackUpdateDetected", "initial stack update")
    before_runs = time.monotonic() - started
    started = time.monotonic()
    for stack in stacks:
        name = stack["metadata"]["name"]
        kube.merge_patch(
            STACKS,
            name,
            {
                "status": {
                    "currentUpdate": None,
                    "lastUpdate": {"generation": 1, "state": "succeeded", "type": "up"},
                    "outputs": {"stack": name},
                }
            },
            BASELINE_NS,
            subresource="status",
        )
        events.post(stack, "Normal", "StackCreated", "up succeeded")
    return before_runs, time.monotonic() - started


@contextlib.contextmanager
def controller_process(
    kubeconfig: Path, count: int, work: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    from pkobatch.dev.environment import controller_argv
    from pkobatch.dev.processes import free_port

    port = free_port()
    env = {
        **os.environ,
        "PKOBATCH_JOB__COMMAND": f"{sys.executable},{Path(__file__).resolve()},write-result",
        "PKOBATCH_MAX_ACTIVE_JOBS": str(count),
        "PKOBATCH_LOG_LEVEL": "warning",
    }
    log = (work / "controller.log").open("wb")
    process = subprocess.Popen(
        controller_argv(
            kubeconfig=kubeconfig,
            namespaces=BENCH_NS,
            metrics_addr=f"127.0.0.1:{port}",
            health_addr="0",
            workers=8,
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


def measure_controller(
    kube: Any,
    tally: Tally,
    kubeconfig: Path,
    count: int,
    args: argparse.Namespace,
    work: Path,
    baseline_rate: float,
) -> None:
    from pkobatch.kube.client import JOBS, STACKS

    with controller_process(kubeconfig, count, work) as (process, port):
        own_before = Counter(tally.counts)
        server_before = apiserver_requests(kube)
        controller_before = controller_requests(port)
        started = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            applying = pool.submit(apply_stacks, kube, BENCH_NS, count)
            wait_for(
                lambda: count_objects(kube, JOBS, BENCH_NS) >= count,
                args.timeout,
                "every Job",
                0.25,
            )
            jobs_seconds = time.monotonic() - started
            applying.result()
        rate = count / jobs_seconds
        ratio = rate / baseline_rate
        verdict = "met" if ratio >= TARGET_RATE_RATIO else "NOT met"
        say(f"controller: every Job exists after {jobs_seconds:.1f}s ({rate:.1f} Stacks/s)")
        say(
            f"rate ratio controller/baseline: {ratio:.2f} "
            f"(target >= {TARGET_RATE_RATIO}: {verdict})"
        )
        say(f"controller peak RSS so far: {peak_rss_mib(process.pid):.0f} MiB")

        # Listing every Stack is not free: poll less often for large fleets.
        wait_for(
            lambda: count_ready(kube, STACKS, BENCH_NS) >= count,
            args.timeout,
            "every Stack Ready",
            max(2.0, count / 500),
        )
        say(
            f"controller: every Stack Ready after {time.monotonic() - started:.1f}s "
            f"(includes running {count} pods through the Job controller and node agent)"
        )
        own = Counter(tally.counts)
        own.subtract(own_before)
        server_delta = Counter(apiserver_requests(kube))
        server_delta.subtract(server_before)
        server_delta.subtract(own)
        controller_total = controller_requests(port) - controller_before
        say(f"API requests per Stack, controller's client: {controller_total / count:.2f}")
        say(
            "API requests per Stack, apiserver_request_total (Stacks, Job create/delete, "
            f"events.k8s.io create; this script's own removed): "
            f"{controller_relevant(server_delta) / count:.2f}"
        )

        idle_before = controller_requests(port, WRITES)
        time.sleep(args.idle_seconds)
        idle_writes = controller_requests(port, WRITES) - idle_before
        idle_per_minute = idle_writes / count / (args.idle_seconds / 60)
        say(
            f"writes per idle Stack per minute over {args.idle_seconds:.0f}s: "
            f"{idle_per_minute:.3f} (target 0)"
        )
        say(
            f"controller peak RSS: {peak_rss_mib(process.pid):.0f} MiB "
            f"(target <= {TARGET_RSS_MIB} MiB at 5,000 Stacks)"
        )


def prepare_namespaces(kube: Any) -> None:
    from pkobatch.kube.client import CLUSTERROLES, NAMESPACES, ROLEBINDINGS, SERVICEACCOUNTS

    runner_role = yaml.safe_load(
        (REPO_ROOT / "deploy/kustomize/base/runner-clusterrole.yaml").read_text()
    )
    kube.apply(CLUSTERROLES, runner_role, field_manager="bench")
    for namespace in (BENCH_NS, BASELINE_NS):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--pods", type=int, default=8, help="pods the node agent runs at once")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()

    from pkobatch.dev.controlplane import default_crds_dir
    from pkobatch.dev.environment import dev_environment
    from pkobatch.dev.tools import ToolsMissing, find_tools
    from pkobatch.kube.client import Kube

    try:
        tools = find_tools(("etcd", "kubernetes"))
    except ToolsMissing as exc:
        sys.exit(str(exc))
    count = args.stacks
    with tempfile.TemporaryDirectory(prefix="pkobatch-fanout-") as tmp:
        work = Path(tmp)
        with dev_environment(
            work / "cluster", tools, crds_dir=default_crds_dir(), max_pods=args.pods
        ) as environment:
            plane = environment.control_plane
            tally = Tally()
            kube = Kube.connect(str(plane.kubeconfig), on_request=tally.hook, qps_pool=16)
            try:
                prepare_namespaces(kube)
                say(f"fan-out of {count} Stacks (node agent runs {args.pods} pods at once)")

                baseline_before, baseline_after = run_baseline(kube, count)
                baseline_rate = count / baseline_before
                say(
                    f"baseline: {baseline_before:.1f}s to create the Stacks and their Jobs "
                    f"({baseline_rate:.1f} Stacks/s), {baseline_after:.1f}s for the status "
                    "after the runs"
                )

                measure_controller(kube, tally, plane.kubeconfig, count, args, work, baseline_rate)
            finally:
                kube.close()


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "write-result" and sys.argv[2] == "--snapshot":
        write_result(sys.argv[3])
    else:
        main()
