"""Reflector edge cases a real API server cannot produce on demand: a watch that ends with
ERROR 410 at a chosen moment, a watch answered with 410, a stalled stream, a closed stream.

The fake is a loopback HTTP server with scripted responses (docs/development.md allows this only for
such edge cases); the normal list/watch flow is tested against the real API server in
tests/integration/test_runtime_reflector_apiserver.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from pkobatch.kube.client import STACKS, Kube
from pkobatch.runtime.reflector import Reflector
from pkobatch.runtime.store import Store

JSON = dict[str, Any]


def stack(name: str, rv: str) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
    }


def event(kind: str, obj: JSON) -> JSON:
    return {"type": kind, "object": obj}


def expired() -> JSON:
    status = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
    return {"type": "ERROR", "object": {**status, "message": "too old resource version"}}


@dataclass
class Watch:
    """A scripted watch response: events, then close — or stall (send nothing more)."""

    events: list[JSON] = field(default_factory=list)
    stall: bool = False
    status: int = 200


@dataclass
class FakeApi:
    lists: list[tuple[list[JSON], str]]
    watches: list[Watch]
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((url.path, query))
        if query.get("watch") != "true":
            items, rv = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            body = {"kind": "StackList", "metadata": {"resourceVersion": rv}, "items": items}
            self._send(handler, 200, json.dumps(body).encode())
            return
        script = self.watches.pop(0) if self.watches else Watch(stall=True)
        if script.status != 200:
            reason = "Expired" if script.status == 410 else "InternalError"
            status = {"kind": "Status", "code": script.status, "reason": reason}
            self._send(handler, script.status, json.dumps(status).encode())
            return
        # Chunked, one event per chunk, as the API server streams watches.
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for item in script.events:
            line = json.dumps(item).encode() + b"\n"
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            handler.wfile.flush()
        if script.stall:
            self.release.wait(30)
        handler.wfile.write(b"0\r\n\r\n")
        handler.close_connection = True

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def watch_versions(self) -> list[str]:
        return [q.get("resourceVersion", "") for _, q in self.requests if q.get("watch")]

    def list_count(self) -> int:
        return sum(1 for _, q in self.requests if not q.get("watch"))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[FakeApi], Kube]]:
    servers: list[tuple[ThreadingHTTPServer, FakeApi]] = []

    def start(api: FakeApi) -> Kube:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                api.handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, api))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "fake",
                            "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                        }
                    ],
                    "users": [{"name": "fake", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        return Kube.connect(str(kubeconfig))

    yield start
    for server, api in servers:
        api.release.set()
        server.shutdown()
        server.server_close()


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str | None, str | None]] = []

    def __call__(self, old: JSON | None, new: JSON | None) -> None:
        def describe(obj: JSON | None) -> str | None:
            if obj is None:
                return None
            return f"{obj['metadata']['name']}@{obj['metadata']['resourceVersion']}"

        self.changes.append((describe(old), describe(new)))


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def reflector(kube: Kube, store: Store, recorder: Recorder, **kwargs: Any) -> Reflector:
    return Reflector(kube, STACKS, store, recorder, read_timeout=30, backoff=(0.01, 0.05), **kwargs)


def test_list_then_watch_applies_events_and_bookmarks(serve: Callable[[FakeApi], Kube]) -> None:
    api = FakeApi(
        lists=[([stack("a", "5"), stack("b", "6")], "10")],
        watches=[
            Watch(
                events=[
                    event("MODIFIED", stack("a", "11")),
                    event("ADDED", stack("c", "12")),
                    event("BOOKMARK", {"kind": "Stack", "metadata": {"resourceVersion": "20"}}),
                    event("DELETED", stack("b", "21")),
                ],
                stall=True,
            )
        ],
    )
    store, recorder = Store(), Recorder()
    r = reflector(serve(api), store, recorder)
    r.start()
    try:
        wait_for(lambda: r.resource_version == "21")
        assert r.synced.is_set()
        assert recorder.changes == [
            (None, "a@5"),
            (None, "b@6"),
            ("a@5", "a@11"),
            (None, "c@12"),
            ("b@21", None),
        ]
        assert sorted(o["metadata"]["name"] for o in store.list_objects()) == ["a", "c"]
        assert api.watch_versions() == ["10"]
        query = api.requests[-1][1]
        assert query["allowWatchBookmarks"] == "true"
        assert 300 <= int(query["timeoutSeconds"]) <= 600
    finally:
        r.stop()


def test_error_410_during_watch_relists_and_reports_what_changed(
    serve: Callable[[FakeApi], Kube],
) -> None:
    api = FakeApi(
        lists=[([stack("a", "5"), stack("b", "6")], "10"), ([stack("a", "30")], "31")],
        watches=[Watch(events=[expired()]), Watch(stall=True)],
    )
    store, recorder = Store(), Recorder()
    r = reflector(serve(api), store, recorder)
    r.start()
    try:
        wait_for(lambda: r.lists == 2 and len(api.watch_versions()) == 2)
        assert api.watch_versions() == ["10", "31"]
        assert recorder.changes[2:] == [("a@5", "a@30"), ("b@6", None)]
        assert [o["metadata"]["name"] for o in store.list_objects()] == ["a"]
    finally:
        r.stop()


def test_the_first_lists_changes_go_to_on_initial_list_a_relists_to_on_change(
    serve: Callable[[FakeApi], Kube],
) -> None:
    api = FakeApi(
        lists=[([stack("a", "5"), stack("b", "6")], "10"), ([stack("a", "30")], "31")],
        watches=[Watch(events=[event("ADDED", stack("c", "11")), expired()]), Watch(stall=True)],
    )
    initial, later = Recorder(), Recorder()
    r = reflector(serve(api), Store(), later, on_initial_list=initial)
    r.start()
    try:
        wait_for(lambda: r.lists == 2 and len(api.watch_versions()) == 2)
        assert initial.changes == [(None, "a@5"), (None, "b@6")]
        # Watch events, and what a relist finds changed or gone, are changes as they come.
        assert later.changes == [(None, "c@11"), ("a@5", "a@30"), ("b@6", None), ("c@11", None)]
    finally:
        r.stop()


def test_watch_answered_with_410_relists(serve: Callable[[FakeApi], Kube]) -> None:
    api = FakeApi(
        lists=[([stack("a", "5")], "10"), ([stack("a", "5")], "40")],
        watches=[Watch(status=410), Watch(stall=True)],
    )
    store, recorder = Store(), Recorder()
    r = reflector(serve(api), store, recorder)
    r.start()
    try:
        wait_for(lambda: len(api.watch_versions()) == 2)
        assert api.watch_versions() == ["10", "40"]
        assert api.list_count() == 2
        assert recorder.changes == [(None, "a@5")], "an unchanged object is not reported again"
    finally:
        r.stop()


def test_stalled_watch_times_out_and_resumes_from_the_last_version(
    serve: Callable[[FakeApi], Kube],
) -> None:
    api = FakeApi(
        lists=[([], "10")],
        watches=[Watch(events=[event("ADDED", stack("a", "11"))], stall=True), Watch(stall=True)],
    )
    store, recorder = Store(), Recorder()
    r = Reflector(serve(api), STACKS, store, recorder, read_timeout=0.5, backoff=(0.01, 0.05))
    r.start()
    try:
        wait_for(lambda: len(api.watch_versions()) == 2)
        assert api.watch_versions() == ["10", "11"]
        assert api.list_count() == 1, "a stalled watch resumes without listing again"
    finally:
        r.stop()


def test_closed_watch_resumes_without_listing(serve: Callable[[FakeApi], Kube]) -> None:
    api = FakeApi(
        lists=[([], "10")],
        watches=[Watch(events=[event("ADDED", stack("a", "11"))]), Watch(stall=True)],
    )
    store, recorder = Store(), Recorder()
    r = reflector(serve(api), store, recorder)
    r.start()
    try:
        wait_for(lambda: len(api.watch_versions()) == 2)
        assert api.watch_versions() == ["10", "11"]
        assert api.list_count() == 1
    finally:
        r.stop()


def test_repeated_watch_failures_back_off_then_relist(serve: Callable[[FakeApi], Kube]) -> None:
    api = FakeApi(lists=[([], "10")], watches=[Watch(status=500) for _ in range(5)])
    store, recorder = Store(), Recorder()
    r = reflector(serve(api), store, recorder)
    r.start()
    try:
        wait_for(lambda: api.list_count() == 2)
        assert api.watch_versions()[:5] == ["10"] * 5
    finally:
        r.stop()


def test_stop_ends_a_stalled_watch_promptly(serve: Callable[[FakeApi], Kube]) -> None:
    api = FakeApi(lists=[([], "10")], watches=[Watch(stall=True)])
    r = reflector(serve(api), Store(), Recorder())
    r.start()
    wait_for(lambda: len(api.watch_versions()) == 1)
    time.sleep(0.1)
    started = time.monotonic()
    r.stop(timeout=10)
    assert time.monotonic() - started < 10
    assert r._thread is not None and not r._thread.is_alive()
