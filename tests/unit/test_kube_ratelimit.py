"""The client-side token bucket, alone (a fake clock) and in front of every request of a
``Kube`` (a loopback HTTP server standing in for the API server's answers); and what a
``Kube`` list keeps of each page."""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pkobatch.kube.client import CONFIGMAPS, Kube
from pkobatch.kube.ratelimit import TokenBucket


class FakeClock:
    """Time that moves only when someone sleeps (or the test advances it)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def bucket(qps: float, burst: int, clock: FakeClock) -> TokenBucket:
    return TokenBucket(qps, burst, clock=clock, sleep=clock.sleep)


def test_a_full_bucket_lets_burst_requests_through_then_spaces_them_at_qps() -> None:
    clock = FakeClock()
    limiter = bucket(10, 3, clock)
    waits = [limiter.wait() for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0, 0.1, 0.2, 0.3])
    assert clock.slept == pytest.approx([0.1, 0.2, 0.3])


def test_tokens_refill_with_time_but_never_beyond_burst() -> None:
    clock = FakeClock()
    limiter = bucket(5, 2, clock)
    assert [limiter.wait(), limiter.wait()] == [0, 0]
    clock.now += 0.2  # one token back
    assert limiter.wait() == 0
    assert limiter.wait() == pytest.approx(0.2)
    clock.now += 3600  # a long quiet spell saves up only `burst` tokens
    assert [limiter.wait(), limiter.wait()] == [0, 0]
    assert limiter.wait() == pytest.approx(0.2)


def test_take_refuses_without_going_into_debt_and_says_how_long_to_wait() -> None:
    clock = FakeClock()
    limiter = bucket(0.5, 2, clock)
    assert [limiter.take(), limiter.take()] == [0, 0]
    assert limiter.take() == pytest.approx(2.0)  # one token takes 2 s at 0.5 a second
    clock.now += 1.0
    assert limiter.take() == pytest.approx(1.0)  # refusals took nothing
    clock.now += 1.0
    assert limiter.take() == 0
    assert clock.slept == []


def test_over_any_window_at_most_burst_plus_qps_times_its_length_are_granted() -> None:
    clock = FakeClock()
    limiter = bucket(5, 10, clock)
    grants = []
    for _ in range(500):  # 500 callers asking at once, as after a burst of edits
        grants.append(clock.now + limiter.reserve())
    start = grants[0]
    for window in (1.0, 10.0, 60.0):
        granted = sum(1 for at in grants if at <= start + window)
        assert granted <= 10 + 5 * window
    assert grants[-1] - start == pytest.approx((500 - 10) / 5)


def test_threads_share_one_bucket_and_each_gets_its_own_slot() -> None:
    clock = FakeClock()  # time stands still: only the reservations order the callers
    limiter = bucket(1000, 1, clock)
    waits: list[float] = []
    lock = threading.Lock()

    def ask() -> None:
        for _ in range(25):
            waited = limiter.wait()
            with lock:
                waits.append(waited)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 100 requests through a 1-token bucket at 1000/s: one slot each, 1 ms apart.
    assert sorted(waits) == pytest.approx([index / 1000 for index in range(100)])


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (1, 0)])
def test_a_bucket_that_would_never_grant_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(qps, burst)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if "watch=true" in self.path:
            body = json.dumps({"type": "BOOKMARK", "object": {"metadata": {}}}).encode() + b"\n"
        else:
            body = json.dumps({"items": [], "metadata": {"resourceVersion": "7"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    yield path
    server.shutdown()
    server.server_close()


def limited_client(kubeconfig: Path, clock: FakeClock, waited: list[tuple[str, float]]) -> Kube:
    """A client with a bucket of 2 at 10/s on ``clock``, its waits recorded in ``waited``."""
    return Kube.connect(
        str(kubeconfig),
        rate_limiter=bucket(10, 2, clock),
        on_wait=lambda method, seconds: waited.append((method, seconds)),
    )


def test_every_request_of_a_client_takes_a_token_and_reports_its_wait(kubeconfig: Path) -> None:
    clock = FakeClock()
    waited: list[tuple[str, float]] = []
    kube = limited_client(kubeconfig, clock, waited)
    try:
        kube.list_objects(CONFIGMAPS, "ns")
        kube.get_or_none(CONFIGMAPS, "a", "ns")
        kube.request("GET", CONFIGMAPS.path("ns"))
        events = list(kube.watch(CONFIGMAPS, "ns", timeout_seconds=1))
    finally:
        kube.close()
    assert [event.type for event in events] == ["BOOKMARK"]
    assert [method for method, _ in waited] == ["GET", "GET", "GET", "WATCH"]
    assert [seconds for _, seconds in waited] == pytest.approx([0, 0, 0.1, 0.2])
    assert clock.slept == pytest.approx([0.1, 0.2])


def test_a_client_without_a_limiter_never_waits(kubeconfig: Path) -> None:
    waited: list[tuple[str, float]] = []
    kube = Kube.connect(str(kubeconfig), on_wait=lambda m, s: waited.append((m, s)))
    try:
        for _ in range(5):
            kube.list_objects(CONFIGMAPS, "ns")
    finally:
        kube.close()
    assert waited == []


def test_a_client_with_its_own_rate_limit_has_a_bucket_of_the_same_size_to_itself(
    kubeconfig: Path,
) -> None:
    clock = FakeClock()
    waited: list[tuple[str, float]] = []
    kube = limited_client(kubeconfig, clock, waited)
    events = kube.with_own_rate_limit()
    try:
        for _ in range(3):
            kube.list_objects(CONFIGMAPS, "ns")
        # The first client's bucket is empty; the second's is full, then refills at 10/s.
        for _ in range(3):
            events.request("GET", CONFIGMAPS.path("ns"))
    finally:
        kube.close()
    # Time stands still: each bucket lets its burst through, then its third waits 0.1 s.
    assert [seconds for _, seconds in waited] == pytest.approx([0, 0, 0.1, 0, 0, 0.1])


def test_a_client_without_a_limiter_gives_one_without_a_limiter(kubeconfig: Path) -> None:
    waited: list[tuple[str, float]] = []
    kube = Kube.connect(str(kubeconfig), on_wait=lambda m, s: waited.append((m, s)))
    try:
        kube.with_own_rate_limit().list_objects(CONFIGMAPS, "ns")
    finally:
        kube.close()
    assert waited == []


def test_a_listed_object_is_let_go_once_its_transform_has_run(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start-up list hands each object to the cache's transform (which keeps part of it,
    or packs it); the whole object must not live on until its page ends."""

    class Whole(dict[str, object]):  # a dict that can be referenced weakly
        pass

    def page(*_args: object, **_kwargs: object) -> dict[str, object]:
        items = [Whole(name=f"o{index}") for index in range(3)]
        return {"items": items, "metadata": {"resourceVersion": "9"}}

    kube = Kube.connect(str(kubeconfig))
    monkeypatch.setattr(kube, "request", page)
    seen: list[weakref.ref[Whole]] = []
    alive_at_each_transform: list[list[bool]] = []

    def transform(obj: dict[str, object]) -> str:
        alive_at_each_transform.append([ref() is not None for ref in seen])
        assert isinstance(obj, Whole)
        seen.append(weakref.ref(obj))
        return str(obj["name"])

    try:
        names, version = kube.list_objects(CONFIGMAPS, "ns", transform=transform)
    finally:
        kube.close()
    assert (names, version) == (["o0", "o1", "o2"], "9")
    assert alive_at_each_transform == [[], [False], [False, False]]
