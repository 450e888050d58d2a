"""The work queue's client-go semantics, with a hand-driven clock."""

from __future__ import annotations

import threading
import time

from pkobatch.runtime.workqueue import ExponentialBackoff, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingMetrics:
    def __init__(self) -> None:
        self.adds = 0
        self.depths: list[int] = []
        self.waits: list[float] = []
        self.works: list[float] = []
        self.retries = 0

    def added(self) -> None:
        self.adds += 1

    def depth(self, depth: int) -> None:
        self.depths.append(depth)

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def worked(self, seconds: float) -> None:
        self.works.append(seconds)

    def retried(self) -> None:
        self.retries += 1


def drain(queue: WorkQueue[str]) -> list[str]:
    keys = []
    while (key := queue.get(timeout=0)) is not None:
        keys.append(key)
    return keys


def test_duplicate_adds_coalesce_and_order_is_fifo() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    for key in ["a", "b", "a", "c", "b"]:
        queue.add(key)
    assert len(queue) == 3
    assert drain(queue) == ["a", "b", "c"]


def test_key_added_while_processing_waits_for_done() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add("a")
    queue.add("a")
    assert queue.get(timeout=0) is None, "a key being processed must not be handed out again"
    queue.done("a")
    assert queue.get(timeout=0) == "a"
    queue.done("a")
    assert queue.get(timeout=0) is None


def test_never_two_workers_on_the_same_key() -> None:
    queue: WorkQueue[str] = WorkQueue()
    in_flight: set[str] = set()
    overlaps: list[str] = []
    processed: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while (key := queue.get()) is not None:
            with lock:
                if key in in_flight:
                    overlaps.append(key)
                in_flight.add(key)
            time.sleep(0.001)
            with lock:
                in_flight.discard(key)
                processed.append(key)
            queue.done(key)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for i in range(2000):
        queue.add(f"k{i % 5}")
        if i % 50 == 0:
            time.sleep(0.001)
    deadline = time.monotonic() + 30
    while (len(queue) or queue.processing_ages()) and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.shutdown()
    for thread in threads:
        thread.join(10)
    assert overlaps == []
    assert set(processed) == {f"k{i}" for i in range(5)}


def test_add_after_fires_when_due_and_keeps_the_earliest_time() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 10)
    queue.add_after("a", 30)  # later: ignored
    queue.add_after("b", 20)
    queue.add_after("b", 5)  # earlier: wins
    assert queue.get(timeout=0) is None
    clock.advance(5)
    assert drain(queue) == ["b"]
    queue.done("b")
    clock.advance(5)
    assert drain(queue) == ["a"]
    queue.done("a")
    clock.advance(100)
    assert drain(queue) == [], "superseded timers must not fire again"


def test_reschedule_moves_or_drops_a_moot_time_and_leaves_another_alone() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    for key, delay in (("a", 10), ("b", 10), ("c", 60)):
        queue.add_after(key, delay)
    queue.add_after("a", 3600)  # hidden behind the earlier time
    assert queue.reschedule("a", 11, 3600)  # its 10 s wake-up is moot: the later one stays
    assert queue.reschedule("b", 11, None)
    assert not queue.reschedule("c", 11, None)  # due later: not the time asked about
    assert not queue.reschedule("d", 11, None)
    clock.advance(60)
    assert drain(queue) == ["c"]
    queue.done("c")
    clock.advance(3539)
    assert drain(queue) == []
    clock.advance(1)
    assert drain(queue) == ["a"]


def test_add_after_zero_adds_at_once() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    queue.add_after("a", 0)
    assert queue.get(timeout=0) == "a"


def test_due_key_coalesces_with_a_queued_one() -> None:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(clock=clock)
    queue.add_after("a", 1)
    queue.add("a")
    clock.advance(2)
    assert drain(queue) == ["a"]


def test_blocking_get_wakes_up_for_a_delayed_key() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 0.05)
    assert queue.get(timeout=10) == "a"


def test_rate_limited_adds_back_off_exponentially_until_forgotten() -> None:
    clock = FakeClock()
    metrics = RecordingMetrics()
    queue: WorkQueue[str] = WorkQueue(
        clock=clock, backoff=ExponentialBackoff(base=1.0, cap=4.0), metrics=metrics
    )
    delays = []
    for _ in range(4):
        queue.add_rate_limited("a")
        waited = 0.0
        while queue.get(timeout=0) is None:
            clock.advance(0.5)
            waited += 0.5
        queue.done("a")
        delays.append(waited)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert queue.failures("a") == 4
    assert metrics.retries == 4
    queue.forget("a")
    assert queue.failures("a") == 0
    queue.add_rate_limited("a")
    clock.advance(1.0)
    assert queue.get(timeout=0) == "a"


def test_backoff_is_per_key() -> None:
    backoff: ExponentialBackoff[str] = ExponentialBackoff(base=0.5, cap=100)
    assert [backoff.when("a") for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.when("b") == 0.5


def test_shutdown_stops_handing_out_keys_and_wakes_blocked_getters() -> None:
    queue: WorkQueue[str] = WorkQueue()
    results: list[str | None] = []
    getter = threading.Thread(target=lambda: results.append(queue.get()))
    getter.start()
    time.sleep(0.05)
    queue.shutdown()
    getter.join(10)
    assert results == [None]
    queue.add("a")
    assert queue.get(timeout=0) is None


def test_metrics_hooks_see_adds_depth_latency_and_work() -> None:
    clock = FakeClock()
    metrics = RecordingMetrics()
    queue: WorkQueue[str] = WorkQueue(clock=clock, metrics=metrics)
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert metrics.adds == 2
    clock.advance(3)
    assert queue.get(timeout=0) == "a"
    assert metrics.waits == [3.0]
    clock.advance(2)
    assert queue.processing_ages() == [2.0]
    queue.done("a")
    assert metrics.works == [2.0]
    assert metrics.depths[-1] == 1


def test_low_priority_keys_wait_behind_every_normal_key_in_their_own_order() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    for key in ["r1", "r2", "r3"]:
        queue.add_low_priority(key)  # a resync
    queue.add("edit")
    queue.add_low_priority("r1")  # coalesces, keeps its place
    assert len(queue) == 4
    assert queue.get(timeout=0) == "edit"
    queue.add("later-edit")
    assert drain(queue) == ["later-edit", "r1", "r2", "r3"]
    assert len(queue) == 0


def test_a_normal_add_moves_a_waiting_low_priority_key_up_once() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    for key in ["r1", "r2", "r3"]:
        queue.add_low_priority(key)
    queue.add("r3")  # the Stack changed while its resync waited
    queue.add("r2")
    queue.add_low_priority("r3")  # a resync again changes nothing
    assert len(queue) == 3
    assert drain(queue) == ["r3", "r2", "r1"]  # and no stale second r2/r3
    for key in ["r1", "r2", "r3"]:
        queue.done(key)
    assert queue.get(timeout=0) is None


def test_a_key_processing_comes_back_at_the_priority_it_was_added_with() -> None:
    queue: WorkQueue[str] = WorkQueue(clock=FakeClock())
    queue.add("a")
    queue.add("b")
    assert queue.get(timeout=0) == "a"
    queue.add_low_priority("a")  # resynced while processing
    queue.done("a")
    assert drain(queue) == ["b", "a"]
    queue.done("a")
    queue.done("b")
    assert queue.get(timeout=0) is None
    queue.add("a")
    assert queue.get(timeout=0) == "a"
    queue.add_low_priority("a")
    queue.add("a")  # then changed: normal priority wins
    queue.add_low_priority("c")
    queue.done("a")
    assert drain(queue) == ["a", "c"]
