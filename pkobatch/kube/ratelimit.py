"""Client-side rate limiting of API requests: client-go's token bucket (``QPS`` and ``Burst``).

Every request of one ``Kube`` — reads, writes, list pages and the start of each watch — takes
one token before it is sent. The bucket holds at most ``burst`` tokens and refills at ``qps``
tokens per second, so over any window of ``t`` seconds at most ``burst + qps * t`` requests
leave the process, however many threads ask. This protects the API server when thousands of
Stacks change at once (a new commit on a shared branch, a controller restart).

Tokens are *reserved* under the lock and waited for outside it: callers are served in the
order they asked, and a waiting thread never blocks the others from reserving theirs
(``golang.org/x/time/rate``'s ``Reserve`` + sleep, which client-go uses).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """``qps`` tokens per second, at most ``burst`` saved up; starts full."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0:
            raise ValueError(f"qps must be positive, got {qps}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        self.qps = float(qps)
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._updated = clock()

    def another(self) -> TokenBucket:
        """A new full bucket of the same size, rate and clock, shared with no one."""
        return TokenBucket(self.qps, self.burst, clock=self._clock, sleep=self._sleep)

    def _refill(self) -> None:
        """Add the tokens earned since the last call (under the lock)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.qps)
        self._updated = now

    def reserve(self) -> float:
        """Take one token now, possibly going into debt; the seconds until it is covered."""
        with self._lock:
            self._refill()
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def take(self) -> float:
        """Take one token if the bucket holds one (0.0); otherwise take nothing and return the
        seconds until one is there: for callers that refuse rather than wait (the push
        receiver answers 429 with that as Retry-After)."""
        with self._lock:
            self._refill()
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) / self.qps

    def wait(self) -> float:
        """Block until this caller's token is available; returns the seconds waited."""
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)
        return delay
