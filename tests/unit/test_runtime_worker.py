"""The worker's outcome switch, metrics and log context."""

from __future__ import annotations

import io
import json
import logging

from pkobatch.kube.client import Conflict
from pkobatch.runtime.interfaces import ObjectKey, ReconcileResult, TerminalError
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.structured_logging import setup_logging
from pkobatch.runtime.worker import WorkerPool
from pkobatch.runtime.workqueue import ExponentialBackoff, WorkQueue

KEY = ObjectKey("ns", "s")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """Answers each reconcile with the next scripted outcome (a result or an exception)."""

    def __init__(self, *outcomes: ReconcileResult | Exception) -> None:
        self.outcomes = list(outcomes)
        self.log = logging.getLogger("test.reconciler")

    def reconcile(self, key: ObjectKey) -> ReconcileResult:
        self.log.info("reconciling", extra={"step": "observe"})
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def setup(
    *outcomes: ReconcileResult | Exception,
) -> tuple[WorkQueue[ObjectKey], WorkerPool, Metrics, Clock]:
    clock = Clock()
    metrics = Metrics("stack-controller")
    queue: WorkQueue[ObjectKey] = WorkQueue(
        clock=clock, backoff=ExponentialBackoff(base=1.0, cap=60), metrics=metrics.queue_hooks()
    )
    pool = WorkerPool(queue, Scripted(*outcomes), metrics, workers=2, kind="Stack")
    return queue, pool, metrics, clock


def run_one(queue: WorkQueue[ObjectKey], pool: WorkerPool) -> None:
    key = queue.get(timeout=0)
    assert key == KEY
    pool.process(key)


def total(metrics: Metrics, result: str) -> float | None:
    return metrics.registry.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": "stack-controller", "result": result}
    )


def test_result_labels_are_preinitialised() -> None:
    metrics = Metrics("stack-controller")
    for result in ("success", "error", "requeue", "requeue_after"):
        assert total(metrics, result) == 0.0


def test_success_forgets_backoff_and_does_not_requeue() -> None:
    queue, pool, metrics, clock = setup(RuntimeError("boom"), ReconcileResult())
    queue.add(KEY)
    run_one(queue, pool)
    assert queue.failures(KEY) == 1
    clock.now += 1
    run_one(queue, pool)
    assert queue.failures(KEY) == 0
    clock.now += 1000
    assert queue.get(timeout=0) is None
    assert total(metrics, "success") == 1.0
    assert total(metrics, "error") == 1.0
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_panics_total", {"controller": "stack-controller"}
        )
        == 1.0
    )


def test_requeue_after_schedules_the_key() -> None:
    queue, pool, metrics, clock = setup(ReconcileResult(requeue_after=30))
    queue.add(KEY)
    run_one(queue, pool)
    clock.now += 29
    assert queue.get(timeout=0) is None
    clock.now += 1
    assert queue.get(timeout=0) == KEY
    assert total(metrics, "requeue_after") == 1.0


def test_api_errors_retry_with_growing_backoff() -> None:
    queue, pool, metrics, clock = setup(
        Conflict(409, "Conflict", "stale"), Conflict(409, "Conflict", "stale")
    )
    queue.add(KEY)
    run_one(queue, pool)
    clock.now += 1
    run_one(queue, pool)
    clock.now += 1.5
    assert queue.get(timeout=0) is None, "second retry waits 2s"
    clock.now += 0.5
    assert queue.get(timeout=0) == KEY
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_errors_total", {"controller": "stack-controller"}
        )
        == 2.0
    )
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_panics_total", {"controller": "stack-controller"}
        )
        == 0.0
    )
    assert (
        metrics.registry.get_sample_value(
            "workqueue_retries_total",
            {"controller": "stack-controller", "name": "stack-controller"},
        )
        == 2.0
    )


def test_terminal_error_is_not_retried() -> None:
    queue, pool, metrics, clock = setup(TerminalError("spec.stack is required"))
    queue.add(KEY)
    run_one(queue, pool)
    clock.now += 10_000
    assert queue.get(timeout=0) is None
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_terminal_reconcile_errors_total", {"controller": "stack-controller"}
        )
        == 1.0
    )


def test_zero_requeue_after_is_a_rate_limited_requeue() -> None:
    queue, pool, metrics, clock = setup(ReconcileResult(requeue_after=0))
    queue.add(KEY)
    run_one(queue, pool)
    assert queue.get(timeout=0) is None
    clock.now += 1
    assert queue.get(timeout=0) == KEY
    assert total(metrics, "requeue") == 1.0


def test_reconciler_logs_carry_the_reconcile_context() -> None:
    queue, pool, _, _ = setup(ReconcileResult())
    queue.add(KEY)
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("info", "json", stream=stream)
        run_one(queue, pool)
    finally:
        root.handlers[:], root.level = saved
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    line = next(line for line in lines if line["logger"] == "test.reconciler")
    assert line["msg"] == "reconciling"
    assert line["level"] == "info"
    assert line["step"] == "observe"
    assert (line["namespace"], line["name"], line["controllerKind"]) == ("ns", "s", "Stack")
    assert len(line["reconcileID"]) == 36
    assert line["ts"].endswith("+00:00")
