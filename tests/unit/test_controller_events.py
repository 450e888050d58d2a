"""The event recorder: Events are queued by ``post`` and created by several sender threads,
each Stack's in order; a full queue drops (and counts) new ones; ``stop`` posts what is
queued, then drops.
The recorder's own rate limit is ``Kube.with_own_rate_limit`` (tests/unit/test_kube_ratelimit.py).
"""

from __future__ import annotations

import threading
from typing import Any

from pkobatch.controller.events import EventRecorder
from pkobatch.kube.client import EVENTS, KubeError, Resource

STACK = {
    "apiVersion": "pulumi.com/v1",
    "kind": "Stack",
    "metadata": {"name": "app", "namespace": "team", "uid": "u1", "resourceVersion": "7"},
}
WAIT = 30.0


class EventsApi:
    """Records the Events created; ``hold`` blocks each create until released."""

    def __init__(self, *, hold: bool = False, fail_first: bool = False) -> None:
        self.created: list[dict[str, Any]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self._hold = hold
        self._fail_next = fail_first
        self._lock = threading.Lock()
        self.done = threading.Condition(self._lock)

    def create(self, resource: Resource, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        assert resource == EVENTS and namespace == "team"
        self.entered.release()
        if self._hold:
            assert self.release.wait(WAIT)
        with self._lock:
            if self._fail_next:
                self._fail_next = False
                self.done.notify_all()
                raise KubeError(500, "InternalError", "etcd is away")
            self.created.append(body)
            self.done.notify_all()
        return body

    def reasons(self) -> list[str]:
        with self._lock:
            return [body["reason"] for body in self.created]

    def wait_for(self, count: int) -> list[str]:
        with self._lock:
            assert self.done.wait_for(lambda: len(self.created) >= count, WAIT)
        return self.reasons()


def test_events_are_posted_in_the_order_they_were_queued() -> None:
    api = EventsApi()
    recorder = EventRecorder(api, "pod")  # type: ignore[arg-type]
    recorder.start()
    try:
        for index in range(20):
            recorder.post(STACK, "Normal", f"R{index}", "note")
        assert api.wait_for(20) == [f"R{index}" for index in range(20)]
    finally:
        recorder.stop()
    first = api.created[0]
    assert first["regarding"]["uid"] == "u1" and first["reportingInstance"] == "pod"


def test_post_returns_while_the_sender_is_blocked_and_a_full_queue_drops_new_events() -> None:
    api = EventsApi(hold=True)
    dropped: list[int] = []
    recorder = EventRecorder(api, "pod", capacity=3, on_dropped=dropped.append)  # type: ignore[arg-type]
    recorder.start()
    try:
        recorder.post(STACK, "Normal", "Sending", "")
        assert api.entered.acquire(timeout=WAIT)  # the sender holds it, blocked on the API
        for reason in ("Q1", "Q2", "Q3", "Over1", "Over2"):
            recorder.post(STACK, "Normal", reason, "")  # never blocks the caller
        assert dropped == [1, 1]
        api.release.set()
        assert api.wait_for(4) == ["Sending", "Q1", "Q2", "Q3"]
        # Room again: new Events are accepted.
        recorder.post(STACK, "Normal", "Later", "")
        assert api.wait_for(5)[-1] == "Later"
    finally:
        recorder.stop()
    assert dropped == [1, 1]


def test_stop_posts_what_is_queued_and_later_events_are_dropped() -> None:
    api = EventsApi()
    dropped: list[int] = []
    recorder = EventRecorder(api, "pod", on_dropped=dropped.append)  # type: ignore[arg-type]
    for reason in ("A", "B", "C"):
        recorder.post(STACK, "Normal", reason, "")  # queued before the sender runs
    recorder.start()
    recorder.stop()
    assert api.reasons() == ["A", "B", "C"]
    recorder.post(STACK, "Normal", "AfterStop", "")
    assert dropped == [1]
    assert api.reasons() == ["A", "B", "C"]


def test_stop_drops_what_it_cannot_post_in_time() -> None:
    api = EventsApi(hold=True)
    dropped: list[int] = []
    recorder = EventRecorder(api, "pod", on_dropped=dropped.append)  # type: ignore[arg-type]
    recorder.start()
    for reason in ("Stuck", "Queued1", "Queued2"):
        recorder.post(STACK, "Normal", reason, "")
    assert api.entered.acquire(timeout=WAIT)
    recorder.stop(drain_seconds=0.05)
    assert dropped == [2]
    api.release.set()
    assert api.wait_for(1) == ["Stuck"]


def test_a_failed_post_is_logged_and_the_next_event_still_goes_out() -> None:
    api = EventsApi(fail_first=True)
    recorder = EventRecorder(api, "pod")  # type: ignore[arg-type]
    recorder.start()
    try:
        recorder.post(STACK, "Warning", "Lost", "")
        recorder.post(STACK, "Normal", "Kept", "")
        assert api.wait_for(1) == ["Kept"]
    finally:
        recorder.stop()


def test_a_stack_whose_event_hangs_holds_up_neither_other_stacks_nor_its_own_order() -> None:
    """While the API holds one Stack's Event, other senders post other Stacks' Events, and
    that Stack's later Events wait for it instead of overtaking it."""
    api = EventsApi(hold=True)
    recorder = EventRecorder(api, "pod")  # type: ignore[arg-type]
    recorder.start()
    others = [
        {**STACK, "metadata": {**STACK["metadata"], "name": f"other{index}"}} for index in range(3)
    ]
    try:
        recorder.post(STACK, "Normal", "First", "")
        assert api.entered.acquire(timeout=WAIT)  # one sender holds it
        recorder.post(STACK, "Normal", "Second", "")
        for index, other in enumerate(others):
            recorder.post(other, "Normal", f"Other{index}", "")
        # The other Stacks' Events reach the API while "First" is still held; "Second" not.
        for _ in others:
            assert api.entered.acquire(timeout=WAIT)
        assert not api.entered.acquire(timeout=0.2)
        api.release.set()
        reasons = api.wait_for(5)
    finally:
        recorder.stop()
    assert reasons.index("First") < reasons.index("Second")
    assert sorted(reasons) == ["First", "Other0", "Other1", "Other2", "Second"]
