"""Prometheus metrics: controller-runtime's names and PKO's Stack gauges, so dashboards and
alerts written for PKO work as-is, plus ``pkobatch_*`` domain metrics (docs/operations.md).

The controller label is PKO's ``stack-controller``. PKO's gauges keep PKO's names and labels:
``stacks_active``, ``programs_active``, ``stacks_failing{namespace,name}`` (1 when
``lastUpdate.state`` is failed) and ``stacks_reconciling{namespace,name}`` (1 while the
Reconciling condition is True).

Per-Stack series and the Job counts are computed from the stores at scrape time by a custom
collector, so deleted Stacks never leave stale series and nothing has to keep the numbers up
to date.

Each ``Metrics`` has its own registry (with the process/platform/GC collectors), so several
managers can live in one test process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from pkobatch.api.constants import (
    CONDITION_DRIFTED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    OPERATIONS,
)

if TYPE_CHECKING:
    from pkobatch.runtime.interfaces import Stores
    from pkobatch.runtime.workqueue import WorkQueue

JSON = dict[str, Any]
# PKO's controller name, so PKO's dashboards select pkobatch's series.
CONTROLLER: Final = "stack-controller"
RECONCILE_RESULTS: Final = ("success", "error", "requeue", "requeue_after")
OPERATION_RESULTS: Final = ("succeeded", "failed", "conflict", "cancelled", "timeout")
# controller-runtime's reconcile_time_seconds buckets.
RECONCILE_BUCKETS: Final = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0),
    *(6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0),
)
# client-go's workqueue buckets: 10 ns x 10^i, 12 buckets.
WORKQUEUE_BUCKETS: Final = tuple(1e-8 * 10**i for i in range(12))
# client-go's rest_client_rate_limiter_duration_seconds buckets.
RATE_LIMITER_BUCKETS: Final = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
OPERATION_BUCKETS: Final = (5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class Metrics:
    """All metrics of one controller process; the reconciler calls ``operation_finished``."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        self.api_host = ""

        self._reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=registry,
        )
        self._reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=registry,
        )
        self._terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=registry,
        )
        self._panics = Counter(
            "controller_runtime_reconcile_panics_total",
            "Total number of reconciliation panics (unexpected exceptions) per controller",
            ["controller"],
            registry=registry,
        )
        self._reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=registry,
        )
        self._active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=registry,
        )
        self._max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=registry,
        )
        for result in RECONCILE_RESULTS:
            self._reconcile_total.labels(CONTROLLER, result)
        for child in (self._reconcile_errors, self._terminal_errors, self._panics):
            child.labels(CONTROLLER)
        self._reconcile_time.labels(CONTROLLER)
        self._active_workers.labels(CONTROLLER)

        queue_labels = ["controller", "name"]
        self._queue_depth = Gauge(
            "workqueue_depth",
            "Current depth of workqueue",
            [*queue_labels, "priority"],
            registry=registry,
        )
        self._queue_adds = Counter(
            "workqueue_adds_total",
            "Total number of adds handled by workqueue",
            queue_labels,
            registry=registry,
        )
        self._queue_latency = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            queue_labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=registry,
        )
        self._work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            queue_labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=registry,
        )
        self._queue_retries = Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            queue_labels,
            registry=registry,
        )
        self._unfinished = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration",
            queue_labels,
            registry=registry,
        )
        self._longest = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            queue_labels,
            registry=registry,
        )

        self._leader = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease",
            ["name"],
            registry=registry,
        )
        self._rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host",
            ["code", "method", "host"],
            registry=registry,
        )
        self._rate_limiter_wait = Histogram(
            "rest_client_rate_limiter_duration_seconds",
            "Client side rate limiter latency in seconds. Broken down by verb, and host.",
            ["verb", "host"],
            buckets=RATE_LIMITER_BUCKETS,
            registry=registry,
        )
        self._watch_restarts = Counter(
            "pkobatch_watch_restarts_total",
            "Watches restarted, by resource and reason (expired, error, closed)",
            ["resource", "reason"],
            registry=registry,
        )
        self._watch_events = Counter(
            "pkobatch_watch_events_total",
            "Watch events received, by resource and type",
            ["resource", "type"],
            registry=registry,
        )
        self._operations = Counter(
            "pkobatch_stack_operations_total",
            "Pulumi operations finished, by operation and result",
            ["operation", "result"],
            registry=registry,
        )
        self._operation_duration = Histogram(
            "pkobatch_stack_operation_duration_seconds",
            "Duration of Pulumi operations (Job start to completion)",
            ["operation"],
            buckets=OPERATION_BUCKETS,
            registry=registry,
        )
        for operation in OPERATIONS:
            self._operation_duration.labels(operation)
            for op_result in OPERATION_RESULTS:
                self._operations.labels(operation, op_result)

    # -- for the reconciler ---------------------------------------------------------------

    def operation_finished(self, operation: str, result: str, duration_seconds: float) -> None:
        """A Pulumi operation ended; ``result`` is one of OPERATION_RESULTS."""
        self._operations.labels(operation, result).inc()
        if duration_seconds >= 0:
            self._operation_duration.labels(operation).observe(duration_seconds)

    # -- for the runtime ------------------------------------------------------------------

    def reconcile_finished(self, result: str, seconds: float) -> None:
        self._reconcile_total.labels(CONTROLLER, result).inc()
        self._reconcile_time.labels(CONTROLLER).observe(seconds)
        if result == "error":
            self._reconcile_errors.labels(CONTROLLER).inc()

    def terminal_error(self) -> None:
        self._terminal_errors.labels(CONTROLLER).inc()

    def panic(self) -> None:
        self._panics.labels(CONTROLLER).inc()

    def worker_started(self) -> None:
        self._active_workers.labels(CONTROLLER).inc()

    def worker_finished(self) -> None:
        self._active_workers.labels(CONTROLLER).dec()

    def set_max_concurrent(self, workers: int) -> None:
        self._max_concurrent.labels(CONTROLLER).set(workers)

    def set_leader(self, lease_name: str, leading: bool) -> None:
        self._leader.labels(lease_name).set(1 if leading else 0)

    def request_done(self, method: str, path: str, status: int) -> None:
        """The ``Kube`` request hook; watches count as GET, as in client-go."""
        code = str(status) if status else "<error>"
        method = "GET" if method == "WATCH" else method
        self._rest_requests.labels(code, method, self.api_host).inc()

    def rate_limiter_waited(self, method: str, seconds: float) -> None:
        """The ``Kube`` wait hook: how long a request waited for its rate-limit token."""
        verb = "GET" if method == "WATCH" else method
        self._rate_limiter_wait.labels(verb, self.api_host).observe(seconds)

    def set_api_server(self, url: str) -> None:
        self.api_host = urlsplit(url).netloc or url

    def watch_restarted(self, resource: str, reason: str) -> None:
        self._watch_restarts.labels(resource, reason).inc()

    def watch_event(self, resource: str, event_type: str) -> None:
        self._watch_events.labels(resource, event_type).inc()

    def queue_hooks(self, name: str = CONTROLLER) -> QueueHooks:
        """``QueueMetrics`` for the work queue ``name``."""
        return QueueHooks(self, name)

    def track_queue(self, queue: WorkQueue[Any], name: str = CONTROLLER) -> None:
        """Export ``queue``'s in-flight work (unfinished and longest-running seconds)."""
        self._unfinished.labels(CONTROLLER, name).set_function(lambda: sum(queue.processing_ages()))
        self._longest.labels(CONTROLLER, name).set_function(
            lambda: max(queue.processing_ages(), default=0.0)
        )

    def track_stores(self, stores: Stores) -> None:
        self.registry.register(_StoreCollector(stores))

    def track_admission(self, waiting: Callable[[], int], cap: int) -> None:
        """Export the cap on active Jobs and how many Stacks wait for a free slot."""
        Gauge(
            "pkobatch_jobs_waiting",
            "Stacks waiting to start a Job because max_active_jobs Jobs are active",
            registry=self.registry,
        ).set_function(lambda: float(waiting()))
        Gauge(
            "pkobatch_jobs_max_active",
            "The cap on active Jobs (setting max_active_jobs)",
            registry=self.registry,
        ).set(cap)

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))


class QueueHooks:
    """``QueueMetrics`` for one named queue."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        labels = (CONTROLLER, name)
        self._depth = metrics._queue_depth.labels(*labels, "")
        self._adds = metrics._queue_adds.labels(*labels)
        self._latency = metrics._queue_latency.labels(*labels)
        self._work = metrics._work_duration.labels(*labels)
        self._retries = metrics._queue_retries.labels(*labels)

    def added(self) -> None:
        self._adds.inc()

    def depth(self, depth: int) -> None:
        self._depth.set(depth)

    def waited(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def worked(self, seconds: float) -> None:
        self._work.observe(seconds)

    def retried(self) -> None:
        self._retries.inc()


class _StoreCollector:
    """Per-Stack series, PKO's gauges and the active-Job count, read from the stores at
    scrape time."""

    def __init__(self, stores: Stores) -> None:
        self._stores = stores

    def collect(self) -> Iterator[Metric]:
        per_stack = ["namespace", "name"]
        info = GaugeMetricFamily(
            "pkobatch_stack_info",
            "One series per Stack with its Pulumi stack, readiness, Ready reason and suspension",
            labels=["namespace", "name", "stack", "ready", "reason", "suspended"],
        )
        failing = GaugeMetricFamily(
            "stacks_failing",
            "1 when the Stack's last update failed (PKO's gauge)",
            labels=per_stack,
        )
        reconciling = GaugeMetricFamily(
            "stacks_reconciling",
            "1 while the Stack's Reconciling condition is True (PKO's gauge)",
            labels=per_stack,
        )
        stalled = GaugeMetricFamily(
            "pkobatch_stack_stalled",
            "1 while the Stack's Stalled condition is True (it needs a change or a request), "
            "with the Stalled reason",
            labels=[*per_stack, "reason"],
        )
        drifted = GaugeMetricFamily(
            "pkobatch_stack_drifted",
            "1 while the Stack's Drifted condition is True (its last drift check found changes)",
            labels=per_stack,
        )
        failures = GaugeMetricFamily(
            "pkobatch_stack_consecutive_failures",
            "Failed runs in a row for the Stack's current generation and request "
            "(status.lastUpdate.failures)",
            labels=per_stack,
        )
        stacks = self._stores.stacks.list_objects()
        for stack in stacks:
            meta = stack.get("metadata") or {}
            spec = stack.get("spec") or {}
            status = stack.get("status") or {}
            last_update = status.get("lastUpdate") or {}
            key = [str(meta.get("namespace", "")), str(meta.get("name", ""))]
            ready = _condition(status, CONDITION_READY)
            info.add_metric(
                [
                    *key,
                    str(spec.get("stack", "")),
                    str(ready.get("status", "Unknown")),
                    str(ready.get("reason", "")),
                    "true" if spec.get("suspend") else "false",
                ],
                1.0,
            )
            failing.add_metric(key, 1.0 if last_update.get("state") == "failed" else 0.0)
            reconciling.add_metric(key, _true(_condition(status, CONDITION_RECONCILING)))
            stall = _condition(status, CONDITION_STALLED)
            stalled.add_metric([*key, str(stall.get("reason", ""))], _true(stall))
            drifted.add_metric(key, _true(_condition(status, CONDITION_DRIFTED)))
            failures.add_metric(key, float(last_update.get("failures") or 0))
        active_stacks = GaugeMetricFamily("stacks_active", "Number of Stacks (PKO's gauge)")
        active_stacks.add_metric([], float(len(stacks)))
        active_programs = GaugeMetricFamily("programs_active", "Number of Programs (PKO's gauge)")
        active_programs.add_metric([], float(len(self._stores.programs.list_objects())))
        yield from (active_stacks, active_programs, failing, reconciling, info)
        yield from (stalled, drifted, failures)
        active = GaugeMetricFamily(
            "pkobatch_jobs_active", "pkobatch Jobs that have not finished (Complete or Failed)"
        )
        active.add_metric(
            [], float(sum(1 for job in self._stores.jobs.list_objects() if _active(job)))
        )
        yield active

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _condition(status: JSON, condition_type: str) -> JSON:
    conditions = status.get("conditions") or ()
    return next((c for c in conditions if c.get("type") == condition_type), {})


def _true(condition: JSON) -> float:
    return 1.0 if condition.get("status") == "True" else 0.0


def _active(job: JSON) -> bool:
    status = job.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return False
    return True
