"""A work queue with client-go's semantics (k8s.io/client-go/util/workqueue), for threads.

- ``add(key)`` coalesces: a key already waiting is not queued twice.
- A key being processed is never handed to a second worker: adding it marks it *dirty* and
  ``done(key)`` puts it back in the queue, so the newest state is always seen once more.
- ``add_after(key, delay)`` keeps only the earliest pending time per key; due keys are moved
  into the queue by whichever thread looks next (no timer thread). ``reschedule`` moves or
  drops a pending time that became moot (client-go's expectations: the event a wake-up
  waited for came first), so the later time it hid still comes.
- ``add_rate_limited(key)`` delays by the key's exponential backoff; ``forget(key)`` resets it.
- ``add_low_priority(key)`` (controller-runtime's priority queue, for a resync) puts the
  key behind every key added normally: a periodic resync of 10,000 Stacks must not make an
  edit wait for 10,000 reconciles. Adding a waiting low-priority key normally moves it up;
  adding a waiting normal key at low priority changes nothing.

One deliberate difference: after ``shutdown()`` ``get()`` returns None at once instead of
draining the queue — on SIGTERM workers finish what they hold and take nothing new; the
next leader re-lists and rebuilds the queue anyway.

The clock is injectable (monotonic seconds) so tests control time.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)
Clock = Callable[[], float]


class QueueMetrics(Protocol):
    def added(self) -> None: ...

    def depth(self, depth: int) -> None: ...

    def waited(self, seconds: float) -> None:
        """A key left the queue ``seconds`` after it was added."""
        ...

    def worked(self, seconds: float) -> None:
        """A worker finished a key after ``seconds``."""
        ...

    def retried(self) -> None: ...


class ExponentialBackoff(Generic[K]):
    """Per-key delay ``base * 2**failures`` capped at ``cap`` (Flux: 750 ms -> 15 min)."""

    def __init__(self, base: float = 0.75, cap: float = 900.0) -> None:
        self._base = base
        self._cap = cap
        self._failures: dict[K, int] = {}
        self._lock = threading.Lock()

    def when(self, key: K) -> float:
        with self._lock:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        return float(min(self._cap, self._base * 2 ** min(failures, 62)))

    def forget(self, key: K) -> None:
        with self._lock:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._lock:
            return self._failures.get(key, 0)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        clock: Clock = time.monotonic,
        backoff: ExponentialBackoff[K] | None = None,
        metrics: QueueMetrics | None = None,
    ) -> None:
        self._clock = clock
        self._backoff: ExponentialBackoff[K] = backoff or ExponentialBackoff()
        self._metrics = metrics
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        # Low priority: (key, entry number); an entry counts only while ``_low_queued``
        # holds its number (a key moved up leaves a stale entry behind).
        self._low: deque[tuple[K, int]] = deque()
        self._low_queued: dict[K, int] = {}
        # Keys added at low priority while processing: queued low again by ``done``.
        self._low_dirty: set[K] = set()
        self._dirty: set[K] = set()
        self._added_at: dict[K, float] = {}
        self._processing: dict[K, float] = {}
        self._ready_at: dict[K, float] = {}
        self._timers: list[tuple[float, int, K]] = []
        self._sequence = itertools.count()
        self._shutting_down = False

    def __len__(self) -> int:
        with self._cond:
            return self._depth()

    def add(self, key: K) -> None:
        with self._cond:
            self._add(key)

    def add_low_priority(self, key: K) -> None:
        with self._cond:
            self._add(key, low_priority=True)

    def add_after(self, key: K, delay: float) -> None:
        with self._cond:
            if self._shutting_down:
                return
            if delay <= 0:
                self._add(key)
                return
            ready_at = self._clock() + delay
            pending = self._ready_at.get(key)
            if pending is not None and pending <= ready_at:
                return
            self._ready_at[key] = ready_at
            heapq.heappush(self._timers, (ready_at, next(self._sequence), key))
            self._cond.notify()

    def reschedule(self, key: K, due_within: float, delay: float | None) -> bool:
        """Move ``key``'s pending time, if it is due within ``due_within`` seconds, to
        ``delay`` seconds from now (None: drop it). False when no such time is pending."""
        with self._cond:
            pending = self._ready_at.get(key)
            if pending is None or pending > self._clock() + due_within:
                return False
            del self._ready_at[key]  # its timer entry is stale from now on
            if delay is not None:
                self.add_after(key, delay)
            return True

    def add_rate_limited(self, key: K) -> None:
        if self._metrics:
            self._metrics.retried()
        self.add_after(key, self._backoff.when(key))

    def forget(self, key: K) -> None:
        self._backoff.forget(key)

    def failures(self, key: K) -> int:
        return self._backoff.failures(key)

    def get(self, timeout: float | None = None) -> K | None:
        """The next key (now processing until ``done``), or None on shutdown or timeout."""
        give_up_at = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = self._clock()
                self._promote_due(now)
                if self._shutting_down:
                    return None
                key = self._pop()
                if key is not None:
                    self._dirty.discard(key)
                    self._processing[key] = now
                    if self._metrics:
                        self._metrics.waited(now - self._added_at.pop(key, now))
                        self._metrics.depth(self._depth())
                    else:
                        self._added_at.pop(key, None)
                    return key
                wait = max(0.0, self._timers[0][0] - now) if self._timers else None
                if give_up_at is not None:
                    remaining = give_up_at - time.monotonic()
                    if remaining <= 0:
                        return None
                    wait = remaining if wait is None else min(wait, remaining)
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        with self._cond:
            started = self._processing.pop(key, None)
            if started is not None and self._metrics:
                self._metrics.worked(self._clock() - started)
            if key in self._dirty and not self._shutting_down:
                self._enqueue(key, key in self._low_dirty)
            self._low_dirty.discard(key)

    def shutdown(self) -> None:
        with self._cond:
            self._shutting_down = True
            self._cond.notify_all()

    def processing_ages(self) -> list[float]:
        """Seconds each in-flight key has been processed so far (for metrics)."""
        with self._cond:
            now = self._clock()
            return [now - started for started in self._processing.values()]

    def _add(self, key: K, low_priority: bool = False) -> None:
        if self._shutting_down:
            return
        if key in self._dirty:
            if not low_priority:
                self._low_dirty.discard(key)
                if self._low_queued.pop(key, None) is not None:
                    self._enqueue(key, False)
            return
        self._dirty.add(key)
        self._added_at[key] = self._clock()
        if self._metrics:
            self._metrics.added()
        if key in self._processing:
            if low_priority:
                self._low_dirty.add(key)
            return
        self._enqueue(key, low_priority)

    def _enqueue(self, key: K, low_priority: bool) -> None:
        if low_priority:
            entry = next(self._sequence)
            self._low.append((key, entry))
            self._low_queued[key] = entry
        else:
            self._queue.append(key)
        if self._metrics:
            self._metrics.depth(self._depth())
        self._cond.notify()

    def _pop(self) -> K | None:
        if self._queue:
            return self._queue.popleft()
        while self._low:
            key, entry = self._low.popleft()
            if self._low_queued.get(key) == entry:
                del self._low_queued[key]
                return key
        return None

    def _depth(self) -> int:
        return len(self._queue) + len(self._low_queued)

    def _promote_due(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            ready_at, _, key = heapq.heappop(self._timers)
            if self._ready_at.get(key) == ready_at:
                del self._ready_at[key]
                self._add(key)
