"""Notifications end to end: the real controller, control plane and Pulumi runs, and real
HTTP receivers on loopback (docs/notifications.md).

One Stack's receiver gets exactly one signed message per event — run failed, stalled,
recovered, drift detected, destroyed — including an event that was pending (its receiver
holding the request unanswered) when the controller was SIGKILLed. A second Stack uses the
namespace default: a Slack receiver that gets its stall, and two that are down, one refusing
connections, one accepting and never answering; neither delays the first Stack's messages,
and the refused one is given up with a ``NotificationFailed`` Event. A Stack in approval mode
announces its plan awaiting approval once. The receivers'
URLs and the signing key are sentinels: they appear in no body, status, Event or log.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    create_secret,
    free_port,
    ready,
    stack_spec,
    wait_stack,
)
from sentinels import plant
from test_program_runtimes import PROGRAM_RULES, grant_program_rules, kubernetes_spec

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, EVENTS, STACKS, Kube

JSON = dict[str, Any]


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


HELD = 0  # ``Received.answered`` of a request held without an answer


@dataclass
class Receiver:
    """A webhook receiver on loopback that records every request and its answer. While
    ``holding`` is set it answers nothing until ``release`` is set."""

    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def accepted(self) -> list[JSON]:
        with self.lock:
            return [json.loads(r.body) for r in self.received if r.answered == 200]

    def requests(self) -> list[Received]:
        with self.lock:
            return list(self.received)


def serve(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            held = receiver.holding.is_set()
            with receiver.lock:
                receiver.received.append(
                    Received(dict(self.headers.items()), body, HELD if held else 200)
                )
            if held:
                receiver.release.wait(600)
            self.send_response(503 if held else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class HangingServer:
    """Accepts connections and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request; it is never answered
            conn.setblocking(False)
            self.held.append(conn)

    def open_requests(self) -> int:
        """Requests whose sender still waits for an answer (the connection is open)."""
        return sum(1 for conn in list(self.held) if _open(conn))

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.held:
            conn.close()


def _open(conn: socket.socket) -> bool:
    """Whether the peer still holds ``conn``: read what it sent until it would block (open)
    or the end of the stream (closed)."""
    while True:
        try:
            if conn.recv(65536) == b"":
                return False
        except BlockingIOError:
            return True
        except OSError:
            return False


@pytest.fixture
def receivers_on_loopback() -> Iterator[Callable[[], tuple[Receiver, int]]]:
    """``start()`` -> (receiver, port): a recording webhook receiver, shut down after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start() -> tuple[Receiver, int]:
        state = Receiver()
        servers.append(serve(state))
        return state, int(servers[-1].server_address[1])

    yield start
    for server in servers:
        server.shutdown()


@pytest.fixture
def hanging() -> Iterator[HangingServer]:
    server = HangingServer()
    yield server
    server.close()


def hook_secret(kube: Kube, namespace: str, name: str, url: str, key: str = "") -> None:
    create_secret(kube, namespace, name, {"url": url, **({"signingKey": key} if key else {})})


def receivers(*names: str) -> JSON:
    return {
        "receivers": [
            {"name": name, "type": "webhook", "secretRef": {"name": f"{name}-hook"}}
            for name in names
        ]
    }


def pending(stack: JSON) -> JSON:
    return dict(((stack.get("status") or {}).get("notifications") or {}).get("pending") or {})


def events_of(messages: list[JSON], stack: str) -> list[str]:
    return sorted(m["eventId"] for m in messages if m["stack"]["name"] == stack)


def test_each_event_reaches_its_receiver_once_signed_across_a_restart(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    pulumi_bin: Path,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
    hanging: HangingServer,
) -> None:
    bind_runner(kube, namespace)
    inbox, port = receivers_on_loopback()
    slack, slack_port = receivers_on_loopback()
    signing_key = plant("notify-signing-key")
    ops_url = f"http://127.0.0.1:{port}/hook?t={plant('notify-url')}"
    hook_secret(kube, namespace, "ops-hook", ops_url, signing_key)
    refused_url = f"http://127.0.0.1:{free_port()}/x?t={plant('notify-refused-url')}"
    hook_secret(kube, namespace, "refused-hook", refused_url)
    hook_secret(kube, namespace, "hanging-hook", f"http://127.0.0.1:{hanging.port}/x")
    hook_secret(kube, namespace, "chat-hook", f"http://127.0.0.1:{slack_port}/services/T/B")
    # The namespace default: for every Stack without spec.notifications.
    default = {
        "receivers": [
            *receivers("refused", "hanging")["receivers"],
            {
                "name": "chat",
                "type": "slack",
                "secretRef": {"name": "chat-hook"},
                "events": ["stalled"],
            },
        ]
    }
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "notifications",
                "labels": {"pkobatch.io/notifications": "default"},
            },
            "data": {"notifications.yaml": json.dumps(default)},
        },
        namespace,
    )
    settings = {
        "PKOBATCH_RETRY__MAX_FAILURES": "1",
        "PKOBATCH_NOTIFICATIONS__BACKOFF_BASE": "1s",
        "PKOBATCH_NOTIFICATIONS__BACKOFF_CAP": "2s",
        "PKOBATCH_NOTIFICATIONS__MAX_ATTEMPTS": "3",
        # The hanging receiver keeps its request open all test long.
        "PKOBATCH_NOTIFICATIONS__TIMEOUT": "1h",
    }
    controller = ControllerProcess(cluster, namespace, tmp_path / "controller", env=settings)
    controller.start()
    try:
        broken = git_repo("syntax-error")
        # A Stack whose receivers (the namespace default) are down, one refusing, one
        # hanging, fails like any other...
        apply_stack(kube, namespace, "other", stack_spec(broken, pulumi_env, stack="other"))
        wait_until(lambda: hanging.open_requests() == 1, timeout=600, what="a hanging delivery")

        # ... and while its delivery hangs, every event of "app" reaches "ops".
        app = receivers("ops")
        apply_stack(
            kube,
            namespace,
            "app",
            stack_spec(broken, pulumi_env, destroyOnFinalize=True, notifications=app),
        )
        # First failure, the retry's failure, then Stalled (at most 1 failure retried).
        wait_until(
            lambda: len(events_of(inbox.accepted(), "app")) == 3,
            timeout=600,
            what="run-failed twice and stalled for app",
        )
        failed = events_of(inbox.accepted(), "app")
        assert [e.split("/")[0] for e in failed] == ["run-failed", "run-failed", "stalled"]
        assert hanging.open_requests() == 1
        # The hanging delivery is in flight, "other"'s later events wait behind it.
        assert controller.metric("pkobatch_notifications_queue_depth") >= 1
        stalled = wait_stack(
            kube,
            namespace,
            "other",
            lambda s: condition(s, "Stalled").get("reason") == "UpdateFailed",
        )
        assert pending(stalled), "other's events stay pending while its receivers are down"
        wait_until(
            lambda: any(
                e["reason"] == "NotificationFailed" and "receiver refused" in e.get("note", "")
                for e in kube.list_objects(EVENTS, namespace)[0]
            ),
            timeout=120,
            what="the refused receiver to be given up",
        )
        assert controller.metric("pkobatch_notifications_retried_total") >= 2
        assert controller.metric("pkobatch_notifications_failed_total", event="run-failed") >= 1
        assert controller.metric("pkobatch_notifications_sent_total", event="stalled") >= 2
        # The default's Slack receiver got "other"'s stall; "app" has its own list.
        wait_until(lambda: len(slack.accepted()) == 1, timeout=120, what="the Slack message")
        (text,) = [m["text"] for m in slack.accepted()]
        assert text.startswith(f"[stalled] Stack {namespace}/other: stalled (UpdateFailed)")
        assert text.endswith(f"Details: `pkobatch describe -n {namespace} other`")

        # The fix succeeds while "ops" holds its requests unanswered: the recovery is
        # pending in the status when the controller is SIGKILLed, and sent once after.
        inbox.holding.set()
        fixed = git_repo()
        apply_stack(
            kube,
            namespace,
            "app",
            stack_spec(fixed, pulumi_env, destroyOnFinalize=True, notifications=app),
        )
        wait_until(
            lambda: any(r.answered == HELD for r in inbox.requests()),
            timeout=300,
            what="the recovery's first attempt",
        )
        assert any(
            k.startswith("run-recovered/") for k in pending(kube.get(STACKS, "app", namespace))
        )
        controller.kill()
        inbox.holding.clear()
        inbox.release.set()
        controller.start()
        wait_until(
            lambda: any(e.startswith("run-recovered/") for e in events_of(inbox.accepted(), "app")),
            timeout=300,
            what="run-recovered after the restart",
        )
        wait_stack(kube, namespace, "app", lambda s: ready(s) and not pending(s))

        # A scheduled drift check finds a file changed behind Pulumi's back.
        drift = stack_spec(
            fixed,
            pulumi_env,
            destroyOnFinalize=True,
            notifications=app,
            driftDetection={"schedule": "* * * * *"},
        )
        apply_stack(kube, namespace, "app", drift)
        wait_stack(kube, namespace, "app", lambda s: ready(s) and current(s))
        (pulumi_env.files_dir / "file-0.txt").write_text("changed behind Pulumi's back")
        wait_until(
            lambda: any(
                e.startswith("drift-detected/") for e in events_of(inbox.accepted(), "app")
            ),
            timeout=300,
            what="drift-detected",
        )

        kube.delete(STACKS, "app", namespace)
        wait_until(
            lambda: any(e.startswith("destroyed/") for e in events_of(inbox.accepted(), "app")),
            timeout=300,
            what="destroyed",
        )
        # Every delivery settled: nothing more can arrive for "app".
        wait_until(
            lambda: kube.get_or_none(STACKS, "app", namespace) is None,
            timeout=120,
            what="app to be gone",
        )
        assert hanging.open_requests() == 1
    finally:
        controller.stop()

    assert len(slack.accepted()) == 1
    assert all("X-Pkobatch-Signature" not in r.headers for r in slack.requests())

    messages = [m for m in inbox.accepted() if m["stack"]["name"] == "app"]
    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids)), f"a message was accepted twice: {ids}"
    assert sorted(m["event"] for m in messages) == sorted(
        ["run-failed", "run-failed", "stalled", "run-recovered", "drift-detected", "destroyed"]
    )
    for request in inbox.requests():
        text = request.body.decode() + json.dumps(request.headers)
        assert signing_key not in text and ops_url not in text
        digest = hmac.new(signing_key.encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers["X-Pkobatch-Signature"] == f"sha256={digest}"
        body = json.loads(request.body)
        assert request.headers["X-Pkobatch-Delivery"] == body["id"]
        assert body["describe"] == f"pkobatch describe -n {namespace} {body['stack']['name']}"
    recovered = next(m for m in messages if m["event"] == "run-recovered")
    assert recovered["run"]["operation"] == "up" and recovered["stack"]["stack"] == "dev"
    destroyed = next(m for m in messages if m["event"] == "destroyed")
    assert destroyed["run"]["operation"] == "destroy"
    log = controller.log_text()
    assert "notify-url" not in log and "notify-refused-url" not in log
    assert "notify-signing-key" not in log


def current(stack: JSON) -> bool:
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return bool(last.get("generation") == stack["metadata"]["generation"])


def test_a_plan_awaiting_approval_is_announced_once(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    kubernetes_provider: Path,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    inbox, port = receivers_on_loopback()
    signing_key = plant("notify-approval-key")
    hook_secret(kube, namespace, "ops-hook", f"http://127.0.0.1:{port}/hook", signing_key)
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    spec = kubernetes_spec(git_repo("k8s-yaml"), pulumi_env, namespace)
    spec["approval"] = {"required": True}
    spec["notifications"] = {**receivers("ops"), "events": ["approval-pending"]}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (s.get("status") or {}).get("approval", {}).get("state") == "Pending",
        what="a plan awaiting approval",
    )
    record = stack["status"]["approval"]
    wait_until(lambda: len(inbox.accepted()) == 1, timeout=120, what="the approval message")
    wait_stack(kube, namespace, "app", lambda s: not pending(s), what="the delivery recorded")
    (message,) = inbox.accepted()
    assert message["event"] == "approval-pending"
    assert message["eventId"] == f"approval-pending/{record['planID']}"
    assert message["run"] == {"name": record["previewJob"], "operation": "preview"}
    assert message["summary"].startswith(f"plan {record['planID']} awaits approval")
    (request,) = inbox.requests()
    digest = hmac.new(signing_key.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Pkobatch-Signature"] == f"sha256={digest}"
    # Nothing else happens until someone approves: no second message.
    assert len(inbox.accepted()) == 1
