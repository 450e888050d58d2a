"""Edge cases of the delivery shell (controller/delivery.py) a real receiver shows on demand
but the end-to-end test does not reach: redirects, error texts, the queue's bookkeeping.
Real HTTP servers on loopback; the API server is replaced only by the two calls used here
(reading a Secret, writing status)."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest
from fixture_plugins.receivers import Receiver as LoopbackReceiver
from fixture_plugins.receivers import flux_event_problems
from prometheus_client import CollectorRegistry

from pkobatch.config import NotificationSettings
from pkobatch.controller.decision import Decision
from pkobatch.controller.delivery import Delivery, Notifier, _Queued
from pkobatch.controller.events import EventRecorder
from pkobatch.controller.notify import Receiver
from pkobatch.controller.pinned_post import DeliveryFailed
from pkobatch.kube.client import STACKS, Kube, NotFound

STACK = {
    "apiVersion": "pulumi.com/v1",
    "kind": "Stack",
    "metadata": {"name": "web", "namespace": "team-a", "uid": "u-1"},
    "spec": {
        "stack": "dev",
        "notifications": {
            "receivers": [
                {"name": "ops", "type": "webhook", "secretRef": {"name": "ops-hook"}},
                {"name": "chat", "type": "slack", "secretRef": {"name": "chat-hook"}},
            ]
        },
    },
}
ENTRY = {
    "event": "run-failed",
    "time": "2026-11-30T12:00:00Z",
    "summary": "up web-up-1 failed",
    "receivers": {"ops": "webhook", "chat": "slack"},
}


class SecretsOnly:
    """The API calls delivery makes: Secrets by name, status patches recorded."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets
        self.patches: list[Any] = []

    def get(self, resource: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        if name not in self.secrets:
            raise NotFound(404, "NotFound", f'secrets "{name}" not found')
        data = {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[name].items()}
        return {"data": data}

    def merge_patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.patches.append(args)
        return {}


class PostedEvents:
    """What the notifier gives the Event recorder: (reason, message) of each Event."""

    instance = "controller-pod-1"

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def post(self, stack: Any, event_type: str, reason: str, message: str) -> None:
        self.posted.append((reason, message))


# The test receivers listen on loopback, which only an operator's opt-in lets notifications
# reach (the default refuses it: test_the_default_refuses_loopback_before_connecting).
LOOPBACK = ["127.0.0.0/8"]


def notifier(
    kube: SecretsOnly,
    events: PostedEvents | None = None,
    *,
    allowed: list[str] | None = None,
    max_attempts: int = 8,
) -> Notifier:
    settings = NotificationSettings(
        timeout=timedelta(seconds=5),
        allowed_cidrs=LOOPBACK if allowed is None else allowed,
        max_attempts=max_attempts,
    )
    api = cast(Kube, kube)
    recorder = cast(EventRecorder, events) if events else EventRecorder(api, "test")
    return Notifier(api, settings, CollectorRegistry(), ["team-a"], recorder)


@pytest.fixture
def server() -> Iterator[tuple[list[str], int, ThreadingHTTPServer]]:
    """A receiver answering every POST with 302 to /elsewhere; records the paths asked."""
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            paths.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args: Any) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield paths, int(httpd.server_address[1]), httpd
    httpd.shutdown()


def delivery(receiver: Receiver) -> Delivery:
    return Delivery(STACK, "run-failed/web-up-1", ENTRY, receiver, durable=True)


def test_a_redirect_is_an_answer_and_is_not_followed(
    server: tuple[list[str], int, ThreadingHTTPServer],
) -> None:
    paths, port, _ = server
    kube = SecretsOnly({"ops-hook": {"url": f"http://127.0.0.1:{port}/hook"}})
    with pytest.raises(DeliveryFailed) as failed:
        notifier(kube)._send(delivery(Receiver("ops", "webhook", "ops-hook")))
    assert failed.value.status == 302
    assert paths == ["/hook"]


def test_no_answer_names_neither_the_url_nor_the_key() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    url = f"http://127.0.0.1:{port}/hook?token=url-token-1234"
    kube = SecretsOnly({"ops-hook": {"url": url, "signingKey": "key-5678"}})
    with pytest.raises(DeliveryFailed) as failed:
        notifier(kube)._send(delivery(Receiver("ops", "webhook", "ops-hook")))
    assert failed.value.status is None
    text = str(failed.value)
    assert text.startswith("no answer from 127.0.0.1:")
    assert "url-token-1234" not in text and "key-5678" not in text and str(port) not in text
    assert failed.value.public == "delivery failed"


def test_a_url_that_is_not_http_is_refused_without_repeating_it() -> None:
    kube = SecretsOnly({"ops-hook": {"url": "ftp://user:pw-9999@example.com/"}})
    with pytest.raises(DeliveryFailed, match="must hold an http\\(s\\) URL") as failed:
        notifier(kube)._send(delivery(Receiver("ops", "webhook", "ops-hook")))
    assert "pw-9999" not in str(failed.value)


def test_a_missing_secret_is_named_and_retried() -> None:
    with pytest.raises(DeliveryFailed, match="Secret ops-hook does not exist") as failed:
        notifier(SecretsOnly({}))._send(delivery(Receiver("ops", "webhook", "ops-hook")))
    assert failed.value.status is None  # no answer: retried


def test_an_entry_seen_again_is_queued_once_per_receiver() -> None:
    notify = notifier(SecretsOnly({}))
    status = {"notifications": {"pending": {"run-failed/web-up-1": ENTRY}}}
    notify.track(STACK, status, durable=True)
    notify.track(STACK, status, durable=True)  # a stale cache shows it again
    assert notify.depth() == 2  # ops and chat, once each


def test_a_receiver_gets_one_delivery_at_a_time() -> None:
    notify = notifier(SecretsOnly({}))
    status = {
        "notifications": {
            "pending": {
                "run-failed/web-up-1": {**ENTRY, "receivers": {"ops": "webhook"}},
                "stalled/x": {**ENTRY, "event": "stalled", "receivers": {"ops": "webhook"}},
                "run-failed/web-up-2": {**ENTRY, "receivers": {"chat": "slack"}},
            }
        }
    }
    notify.track(STACK, status, durable=True)
    now = 1e12
    first = notify._next_due(now)
    second = notify._next_due(now)
    assert first is not None and second is not None
    targets = {first.delivery.receiver.name, second.delivery.receiver.name}
    assert targets == {"ops", "chat"}
    # The other event for "ops" waits while "ops" is busy.
    assert notify._next_due(now) is None
    assert notify.depth() == 3


def test_add_events_writes_the_outbox_into_the_decisions_status() -> None:
    notify = notifier(SecretsOnly({}))
    old = {"lastUpdate": {"name": "web-up-1", "type": "up", "state": "succeeded"}}
    new = {"lastUpdate": {"name": "web-up-2", "type": "up", "state": "failed", "message": "x"}}
    decision = Decision(status=dict(new))
    outbox = notify.add_events({**STACK, "status": old}, decision, datetime.now(UTC))
    assert decision.status is outbox and outbox is not None
    assert set(outbox["notifications"]["pending"]) == {"run-failed/web-up-2"}
    # Without receivers (no spec.notifications, no namespace default) nothing is stored.
    quiet = {**STACK, "spec": {"stack": "dev"}, "status": old}
    decision = Decision(status=dict(new))
    assert notify.add_events(quiet, decision, datetime.now(UTC)) == new
    # A Stack being released: its decided status carries the events, for delivery from memory.
    released = Decision(status=None, decided_status=dict(new))
    outbox = notify.add_events({**STACK, "status": old}, released, datetime.now(UTC))
    assert released.status is None and outbox is not None
    assert set(outbox["notifications"]["pending"]) == {"run-failed/web-up-2"}


def test_the_default_refuses_loopback_before_connecting(
    receivers_on_loopback: Callable[[], tuple[LoopbackReceiver, int]],
) -> None:
    inbox, port = receivers_on_loopback()
    for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
        kube = SecretsOnly({"ops-hook": {"url": f"http://{host}:{port}/hook"}})
        with pytest.raises(DeliveryFailed) as failed:
            notifier(kube, allowed=[])._send(delivery(Receiver("ops", "webhook", "ops-hook")))
        assert failed.value.status is None  # like no answer: retried, then given up
        assert "destination refused: " in str(failed.value)
        assert "127.0.0.1 is a loopback address" in str(failed.value)
        assert failed.value.public == "delivery failed"
    assert inbox.requests() == []


def test_the_name_is_resolved_once_and_the_checked_address_is_dialled(
    receivers_on_loopback: Callable[[], tuple[LoopbackReceiver, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS rebinding: a name that answers an allowed address when checked and another one
    later cannot redirect the request, because the checked address is the one dialled."""
    inbox, port = receivers_on_loopback()
    answers = iter(["127.0.0.1", "169.254.169.254"])
    asked: list[str] = []
    resolve = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "hooks.example":
            return resolve(host, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    kube = SecretsOnly({"ops-hook": {"url": f"http://hooks.example:{port}/hook"}})
    notifier(kube, allowed=["127.0.0.1/32"])._send(delivery(Receiver("ops", "webhook", "ops-hook")))
    assert asked == ["hooks.example"]
    assert [r.headers["Host"] for r in inbox.requests()] == [f"hooks.example:{port}"]


FAILED = "notification run-failed/web-up-1 to receiver ops failed: "


def attempt_first(notify: Notifier, entry: dict[str, Any]) -> _Queued:
    """Queue ``entry`` (the Stack's one pending event) and make its first due attempt."""
    notify.track(STACK, {"notifications": {"pending": {"run-failed/web-up-1": entry}}}, True)
    item = notify._next_due(1e12)
    assert item is not None
    notify._attempt(item)
    return item


def test_failed_attempts_are_recorded_and_counting_goes_on_after_a_restart() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    hooks = {"ops-hook": {"url": f"http://127.0.0.1:{port}/hook"}}
    kube, events = SecretsOnly(hooks), PostedEvents()
    # A restarted controller: the entry records two failed attempts to "ops".
    entry = {**ENTRY, "receivers": {"ops": "webhook"}, "attempts": {"ops": 2}}
    item = attempt_first(notifier(kube, events, max_attempts=3), entry)
    assert item.attempt == 3
    assert events.posted == [("NotificationFailed", FAILED + "delivery failed (attempt 3 of 3)")]
    assert kube.patches[-1][1:3] == (
        "web",
        {"status": {"notifications": {"pending": {"run-failed/web-up-1": None}}}},
    )


def test_an_attempt_that_will_be_retried_is_recorded_in_the_entry() -> None:
    kube, events = SecretsOnly({}), PostedEvents()
    notify = notifier(kube, events)
    item = attempt_first(notify, {**ENTRY, "receivers": {"ops": "webhook"}})
    assert item.attempt == 1
    recorded = {"run-failed/web-up-1": {"attempts": {"ops": 1}}}
    assert kube.patches == [
        (STACKS, "web", {"status": {"notifications": {"pending": recorded}}}, "team-a")
    ]
    assert events.posted == []  # retried: attempt 2 waits for its time
    assert [q.attempt for q in notify._heap] == [2]


def test_all_attempts_made_before_a_restart_give_up_at_once() -> None:
    kube, events = SecretsOnly({}), PostedEvents()
    entry = {**ENTRY, "receivers": {"ops": "webhook"}, "attempts": {"ops": 3}}
    attempt_first(notifier(kube, events, max_attempts=3), entry)
    assert events.posted == [("NotificationFailed", FAILED + "delivery failed (attempt 3 of 3)")]


def test_a_missing_secret_is_the_only_reason_an_event_names() -> None:
    kube, events = SecretsOnly({}), PostedEvents()
    attempt_first(
        notifier(kube, events, max_attempts=1), {**ENTRY, "receivers": {"ops": "webhook"}}
    )
    assert events.posted == [
        (
            "NotificationFailed",
            FAILED + "its Secret ops-hook is missing, unreadable or holds no usable url "
            "(attempt 1 of 1)",
        )
    ]


def test_a_flux_receiver_gets_flux_events_and_a_429_repeat_is_delivered(
    receivers_on_loopback: Callable[..., tuple[LoopbackReceiver, int]],
) -> None:
    """notification-controller's event server answers 202, and 429 to an event it already
    has (its duplicate filter): both mean the event arrived, neither is retried."""
    inbox, port = receivers_on_loopback(202, flux_event_problems)
    kube, events = SecretsOnly({"nc": {"url": f"http://127.0.0.1:{port}/"}}), PostedEvents()
    flux = delivery(Receiver("flux", "flux", "nc"))

    notifier(kube, events)._send(flux)
    inbox.answer = 429
    notifier(kube, events)._send(flux)

    first, repeat = inbox.requests()
    assert (first.answered, first.problems) == (202, [])
    assert repeat.answered == 429 and repeat.body == first.body
    event = json.loads(first.body)
    assert event["reportingInstance"] == PostedEvents.instance
    assert event["involvedObject"]["uid"] == "u-1"
    assert "X-Pkobatch-Signature" not in first.headers
