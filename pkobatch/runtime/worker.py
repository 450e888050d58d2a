"""Worker threads: take a key, reconcile it, act on the outcome (controller-runtime's
``reconcileHandler``):

- ``ReconcileResult()`` -> forget the key's backoff; ``success``;
- ``requeue_after > 0`` -> forget, then ``add_after``; ``requeue_after``;
- ``requeue_after <= 0`` -> rate-limited requeue; ``requeue``;
- ``TerminalError`` -> forget, no requeue; ``error`` (and a terminal error);
- any other exception -> rate-limited requeue; ``error`` (a non-API exception is also a
  "panic": a bug, logged with its traceback).

The queue guarantees one worker per key at a time; ``done`` is always called.
"""

from __future__ import annotations

import logging
import threading
import time

from pkobatch.kube.client import KubeError
from pkobatch.runtime.interfaces import ObjectKey, Reconciler, TerminalError
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.structured_logging import reconcile_context
from pkobatch.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(
        self,
        queue: WorkQueue[ObjectKey],
        reconciler: Reconciler,
        metrics: Metrics,
        workers: int,
        *,
        kind: str,
    ) -> None:
        """``kind``: what the keys name (the ``controllerKind`` of log lines)."""
        self._queue = queue
        self._kind = kind
        self._reconciler = reconciler
        self._metrics = metrics
        self._threads = [
            threading.Thread(target=self._run, name=f"worker-{i}", daemon=True)
            for i in range(workers)
        ]
        metrics.set_max_concurrent(workers)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers to finish (after the queue shut down); False on timeout."""
        give_up_at = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(None if give_up_at is None else max(0.0, give_up_at - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self) -> None:
        while (key := self._queue.get()) is not None:
            self.process(key)

    def process(self, key: ObjectKey) -> None:
        self._metrics.worker_started()
        started = time.monotonic()
        outcome = "error"
        try:
            with reconcile_context(self._kind, key):
                outcome = self._reconcile(key)
        finally:
            self._metrics.reconcile_finished(outcome, time.monotonic() - started)
            self._metrics.worker_finished()
            self._queue.done(key)

    def _reconcile(self, key: ObjectKey) -> str:
        queue = self._queue
        try:
            result = self._reconciler.reconcile(key)
        except TerminalError as exc:
            queue.forget(key)
            self._metrics.terminal_error()
            log.error("Reconciler error (terminal, not retried): %s", exc)
            return "error"
        except KubeError as exc:
            queue.add_rate_limited(key)
            log.warning(
                "Reconciler error, retrying: %s", exc, extra={"retries": queue.failures(key)}
            )
            return "error"
        except Exception:
            queue.add_rate_limited(key)
            self._metrics.panic()
            log.exception("Reconciler failed unexpectedly, retrying")
            return "error"
        if result.requeue_after is None:
            queue.forget(key)
            return "success"
        if result.requeue_after <= 0:
            queue.add_rate_limited(key)
            return "requeue"
        queue.forget(key)
        queue.add_after(key, result.requeue_after)
        return "requeue_after"
