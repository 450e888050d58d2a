"""``follow_changes``, the list/watch/relist loop of ``get -w`` and ``events -w``, on the edge
a real server cannot be made to produce on demand: the watch's version expiring (410)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pkobatch.cli.fetch import follow_changes
from pkobatch.kube.client import STACKS, Gone, WatchEvent


def event(kind: str, name: str, version: str) -> WatchEvent:
    return WatchEvent(kind, {"metadata": {"name": name, "resourceVersion": version}})


class Stream:
    def __init__(self, *events: WatchEvent, gone: bool = False) -> None:
        self.events = events
        self.gone = gone

    def __iter__(self) -> Iterator[WatchEvent]:
        yield from self.events
        if self.gone:
            raise Gone(410, "Expired", "too old resource version")

    def stop(self) -> None:
        raise AssertionError("no deadline was given")


class Exhausted(Exception):
    """The script has no more watches: the test is over."""


class Kube:
    """Answers watches from a script; records the versions they start from."""

    def __init__(self, *streams: Stream) -> None:
        self.streams = list(streams)
        self.started_from: list[str] = []

    def watch(self, resource: Any, namespace: str | None, **options: Any) -> Stream:
        self.started_from.append(options["resource_version"])
        if not self.streams:
            raise Exhausted
        return self.streams.pop(0)


class Session:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube


def test_an_expired_version_relists_and_watches_on_from_the_listing() -> None:
    kube = Kube(
        Stream(event("ADDED", "a", "5"), event("BOOKMARK", "", "7"), gone=True),
        Stream(event("MODIFIED", "b", "12")),
    )
    seen: list[tuple[str, str]] = []
    with pytest.raises(Exhausted):
        follow_changes(
            Session(kube),  # type: ignore[arg-type]
            STACKS,
            "ns",
            "1",
            relist=lambda: "10",
            on_event=lambda e: seen.append((e.type, e.object["metadata"]["name"])),
            deadline=None,
        )
    # Bookmarks move the version but are not changes; after the 410 the watch starts from
    # the new listing's version, and a normally ended watch resumes from its last event.
    assert seen == [("ADDED", "a"), ("MODIFIED", "b")]
    assert kube.started_from == ["1", "10", "12"]
