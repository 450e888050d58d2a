"""Prometheus metrics of the runtime, with controller-runtime's and client-go's names
(reconciles, work queue, leader election, REST requests) plus ``pkobatch_watch_*``
(docs/operations.md), so dashboards and alerts written for controller-runtime work as-is.

The ``controller`` label is the name the caller gives. What a reconciler measures about
its own objects registers on the same ``registry`` (``pkobatch.controller.stack_metrics``).

The scrape is negotiated as Prometheus does it: OpenMetrics when the ``Accept`` header asks
for it (else the text format 0.0.4), gzip when ``Accept-Encoding`` allows it.

Each ``Metrics`` has its own registry (with the process/platform/GC collectors), so several
managers can live in one test process.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from pkobatch.runtime.workqueue import WorkQueue

RECONCILE_RESULTS: Final = ("success", "error", "requeue", "requeue_after")
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


class Metrics:
    """The runtime's metrics of one controller process, labelled ``controller``."""

    def __init__(self, controller: str) -> None:
        self.controller = controller
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
            self._reconcile_total.labels(self.controller, result)
        for child in (self._reconcile_errors, self._terminal_errors, self._panics):
            child.labels(self.controller)
        self._reconcile_time.labels(self.controller)
        self._active_workers.labels(self.controller)

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

    # -- for the runtime ------------------------------------------------------------------

    def reconcile_finished(self, result: str, seconds: float) -> None:
        self._reconcile_total.labels(self.controller, result).inc()
        self._reconcile_time.labels(self.controller).observe(seconds)
        if result == "error":
            self._reconcile_errors.labels(self.controller).inc()

    def terminal_error(self) -> None:
        self._terminal_errors.labels(self.controller).inc()

    def panic(self) -> None:
        self._panics.labels(self.controller).inc()

    def worker_started(self) -> None:
        self._active_workers.labels(self.controller).inc()

    def worker_finished(self) -> None:
        self._active_workers.labels(self.controller).dec()

    def set_max_concurrent(self, workers: int) -> None:
        self._max_concurrent.labels(self.controller).set(workers)

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

    def queue_hooks(self, name: str | None = None) -> QueueHooks:
        """``QueueMetrics`` for the work queue ``name``."""
        return QueueHooks(self, name or self.controller)

    def track_queue(self, queue: WorkQueue[Any], name: str | None = None) -> None:
        """Export ``queue``'s in-flight work (unfinished and longest-running seconds)."""
        labels = (self.controller, name or self.controller)
        self._unfinished.labels(*labels).set_function(lambda: sum(queue.processing_ages()))
        self._longest.labels(*labels).set_function(
            lambda: max(queue.processing_ages(), default=0.0)
        )

    def exposition(
        self, accept: str = "", accept_encoding: str = ""
    ) -> tuple[Mapping[str, str], bytes]:
        """The registry's exposition in the format ``accept`` asks for, gzipped if
        ``accept_encoding`` allows; with its Content-Type (and Content-Encoding) header."""
        encoder, content_type = choose_encoder(accept)
        body = bytes(encoder(self.registry))
        if gzip_accepted(accept_encoding):
            return {"Content-Type": content_type, "Content-Encoding": "gzip"}, gzip.compress(body)
        return {"Content-Type": content_type}, body


class QueueHooks:
    """``QueueMetrics`` for one named queue."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        labels = (metrics.controller, name)
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
