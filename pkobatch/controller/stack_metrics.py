"""The Stack controller's own metrics: PKO's Stack gauges, so dashboards and alerts
written for PKO work as-is, plus ``pkobatch_*`` domain metrics (docs/operations.md). They
register on the runtime's registry (``pkobatch.runtime.metrics.Metrics.registry``).

PKO's gauges keep PKO's names and labels: ``stacks_active``, ``programs_active``,
``stacks_failing{namespace,name}`` (1 when ``lastUpdate.state`` is failed) and
``stacks_reconciling{namespace,name}`` (1 while the Reconciling condition is True).

Per-Stack series and the Job counts are computed from the stores at scrape time by a custom
collector, so deleted Stacks never leave stale series and nothing has to keep the numbers up
to date.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from pkobatch.api.constants import (
    CONDITION_DRIFTED,
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    RUN_OPERATIONS,
)
from pkobatch.api.objects import JSON, condition_of, job_finished, true_condition
from pkobatch.api.status import last_update
from pkobatch.controller.stores import Stores

OPERATION_RESULTS: Final = ("succeeded", "failed", "conflict", "cancelled", "timeout")
OPERATION_BUCKETS: Final = (5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class StackMetrics:
    """What the Stack reconciler records; ``registry`` is the process's."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
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
        self._events_dropped = Counter(
            "pkobatch_events_dropped_total",
            "Kubernetes Events not posted: their queue was full or the controller was stopping",
            registry=registry,
        )
        for operation in RUN_OPERATIONS:
            self._operation_duration.labels(operation)
            for op_result in OPERATION_RESULTS:
                self._operations.labels(operation, op_result)

    def operation_finished(self, operation: str, result: str, duration_seconds: float) -> None:
        """A Pulumi operation ended; ``result`` is one of OPERATION_RESULTS."""
        self._operations.labels(operation, result).inc()
        if duration_seconds >= 0:
            self._operation_duration.labels(operation).observe(duration_seconds)

    def events_dropped(self, count: int) -> None:
        self._events_dropped.inc(count)

    def track_stores(
        self, stores: Stores, in_scope: Callable[[str], bool] = lambda _: True
    ) -> None:
        """Series of the cached Stacks and Programs of the namespaces ``in_scope`` accepts
        (those the controller reconciles: PKOBATCH_NAMESPACE_SELECTOR)."""
        self.registry.register(_StoreCollector(stores, in_scope))

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


class _StoreCollector:
    """Per-Stack series, PKO's gauges and the active-Job count, read from the stores at
    scrape time."""

    def __init__(self, stores: Stores, in_scope: Callable[[str], bool]) -> None:
        self._stores = stores
        self._in_scope = in_scope

    def _scoped(self, objects: list[JSON]) -> list[JSON]:
        return [o for o in objects if self._in_scope(str(o["metadata"].get("namespace", "")))]

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
        stacks = self._scoped(self._stores.stacks.list_objects())
        for stack in stacks:
            meta = stack.get("metadata") or {}
            spec = stack.get("spec") or {}
            status = stack.get("status") or {}
            last = last_update(status)
            key = [str(meta.get("namespace", "")), str(meta.get("name", ""))]
            ready = condition_of(stack, CONDITION_READY) or {}
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
            failing.add_metric(key, 1.0 if last.get("state") == "failed" else 0.0)
            reconciling.add_metric(key, _true(stack, CONDITION_RECONCILING))
            stall = condition_of(stack, CONDITION_STALLED) or {}
            stalled.add_metric(
                [*key, str(stall.get("reason", ""))], _true(stack, CONDITION_STALLED)
            )
            drifted.add_metric(key, _true(stack, CONDITION_DRIFTED))
            failures.add_metric(key, float(last.get("failures") or 0))
        active_stacks = GaugeMetricFamily("stacks_active", "Number of Stacks (PKO's gauge)")
        active_stacks.add_metric([], float(len(stacks)))
        active_programs = GaugeMetricFamily("programs_active", "Number of Programs (PKO's gauge)")
        active_programs.add_metric(
            [], float(len(self._scoped(self._stores.programs.list_objects())))
        )
        yield from (active_stacks, active_programs, failing, reconciling, info)
        yield from (stalled, drifted, failures)
        active = GaugeMetricFamily(
            "pkobatch_jobs_active", "pkobatch Jobs that have not finished (Complete or Failed)"
        )
        active.add_metric(
            [], float(sum(1 for job in self._stores.jobs.list_unpacked() if not job_finished(job)))
        )
        yield active

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _true(stack: JSON, condition_type: str) -> float:
    return 1.0 if true_condition(stack, condition_type) is not None else 0.0
