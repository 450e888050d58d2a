"""Reflectors against the real API server: create/update/delete of Stacks, label-selected
ConfigMaps indexed by Stack, and a re-list after the server answers a watch with 410."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pkobatch.api.constants import RESULT_KEY, STACK_LABEL
from pkobatch.controller.cache_transforms import cache_result
from pkobatch.controller.stores import stack_name_of
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, STACKS, Kube, WatchStream
from pkobatch.runtime.reflector import Reflector
from pkobatch.runtime.store import Store

JSON = dict[str, Any]


def stack(name: str, namespace: str, branch: str = "main") -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "stack": f"org/{name}/dev",
            "projectRepo": "https://example.com/r",
            "branch": branch,
        },
    }


class Changes:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        kind = "deleted" if new is None else ("added" if old is None else "modified")
        with self.lock:
            self.seen.append((kind, obj["metadata"]["name"]))

    def has(self, kind: str, name: str) -> bool:
        with self.lock:
            return (kind, name) in self.seen


@pytest.fixture
def reflectors() -> Iterator[list[Reflector]]:
    started: list[Reflector] = []
    yield started
    for reflector in started:
        reflector.stop()


def test_stacks_are_mirrored_through_create_update_delete(
    kube: Kube, namespace: str, reflectors: list[Reflector]
) -> None:
    kube.create(STACKS, stack("before", namespace), namespace)
    store, changes = Store(), Changes()
    reflector = Reflector(kube, STACKS, store, changes, namespace=namespace)
    reflectors.append(reflector)
    reflector.start()
    wait_until(reflector.synced.is_set, timeout=30, what="first list")
    assert changes.has("added", "before")

    kube.create(STACKS, stack("s1", namespace), namespace)
    wait_until(lambda: changes.has("added", "s1"), timeout=30, what="ADDED s1")
    kube.merge_patch(STACKS, "s1", {"spec": {"branch": "dev"}}, namespace)
    wait_until(lambda: changes.has("modified", "s1"), timeout=30, what="MODIFIED s1")
    s1 = store.get(namespace, "s1")
    assert s1 is not None and s1["spec"]["branch"] == "dev"
    assert "managedFields" not in s1["metadata"], "objects are slimmed on ingest"

    kube.delete(STACKS, "s1", namespace)
    wait_until(lambda: changes.has("deleted", "s1"), timeout=30, what="DELETED s1")
    assert store.get(namespace, "s1") is None
    assert reflector.lists == 1, "no re-list on a healthy watch"


def test_label_selected_configmaps_are_indexed_by_stack(
    kube: Kube, namespace: str, reflectors: list[Reflector]
) -> None:
    store, changes = Store(owner_of=stack_name_of), Changes()
    reflector = Reflector(
        kube,
        CONFIGMAPS,
        store,
        changes,
        namespace=namespace,
        label_selector="app.kubernetes.io/managed-by=pkobatch",
    )
    reflectors.append(reflector)
    reflector.start()
    wait_until(reflector.synced.is_set, timeout=30, what="first list")
    labels = {"app.kubernetes.io/managed-by": "pkobatch", STACK_LABEL: "web"}
    for name, meta_labels in [("ours", labels), ("theirs", {"app": "other"})]:
        kube.create(
            CONFIGMAPS,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": meta_labels},
            },
            namespace,
        )
    wait_until(lambda: changes.has("added", "ours"), timeout=30, what="ADDED ours")
    assert [cm["metadata"]["name"] for cm in store.for_owner(namespace, "web")] == ["ours"]
    assert store.get(namespace, "theirs") is None


class StaleFirstWatch(Kube):
    """The real server, asked once (when the test says so) for a long-compacted
    resourceVersion, so it answers 410 Expired at a moment the test chooses."""

    proceed: threading.Event
    stale_sent = False

    def watch(self, *args: Any, **kwargs: Any) -> WatchStream:
        if not self.stale_sent:
            self.proceed.wait(60)
            self.stale_sent = True
            kwargs["resource_version"] = "1"
        return super().watch(*args, **kwargs)


def test_expired_watch_relists_and_reports_changes_missed_meanwhile(
    cluster: Any, kube: Kube, namespace: str, reflectors: list[Reflector]
) -> None:
    kube.create(STACKS, stack("stays", namespace), namespace)
    kube.create(STACKS, stack("goes", namespace), namespace)
    stale = StaleFirstWatch.connect(str(cluster.kubeconfig))
    stale.proceed = threading.Event()
    store, changes = Store(), Changes()
    reflector = Reflector(stale, STACKS, store, changes, namespace=namespace)
    reflectors.append(reflector)
    reflector.start()
    try:
        wait_until(reflector.synced.is_set, timeout=30, what="first list")
        # Changes the reflector cannot see: its first watch has not started yet.
        kube.delete(STACKS, "goes", namespace)
        kube.create(STACKS, stack("new", namespace), namespace)
        stale.proceed.set()
        wait_until(lambda: reflector.lists == 2, timeout=60, what="re-list after 410")
        wait_until(lambda: changes.has("added", "new"), timeout=30, what="new Stack")
        assert changes.has("deleted", "goes")
        assert sorted(o["metadata"]["name"] for o in store.list_objects()) == ["new", "stays"]
        assert [name for kind, name in changes.seen if name == "stays"] == ["stays"], (
            "an unchanged Stack is not reported again after a re-list"
        )
        kube.create(STACKS, stack("after", namespace), namespace)
        wait_until(lambda: changes.has("added", "after"), timeout=30, what="watch resumed")
    finally:
        reflector.stop()
        stale.close()


def test_listed_and_watched_objects_are_cached_through_the_transform(
    kube: Kube, namespace: str, reflectors: list[Reflector]
) -> None:
    """The controller's result transform on the real server: a result listed at start and
    one that arrives by watch are both stored reduced to the fields folding reads."""

    def result_configmap(name: str) -> JSON:
        result = {
            "operation": "up",
            "state": "succeeded",
            "reason": "Succeeded",
            "stack": {"name": "web", "namespace": namespace, "uid": "u"},
            "jobName": name,
            "pulumiVersion": "3.259.0",
            "changes": {"create": 1},
        }
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "pkobatch", STACK_LABEL: "web"},
                "annotations": {"example.com/note": "not read by pkobatch"},
            },
            "data": {RESULT_KEY: json.dumps(result)},
        }

    kube.create(CONFIGMAPS, result_configmap("listed"), namespace)
    store, changes = Store(owner_of=stack_name_of), Changes()
    reflector = Reflector(
        kube,
        CONFIGMAPS,
        store,
        changes,
        namespace=namespace,
        label_selector="app.kubernetes.io/managed-by=pkobatch",
        transform=cache_result,
    )
    reflectors.append(reflector)
    reflector.start()
    wait_until(reflector.synced.is_set, timeout=30, what="first list")
    kube.create(CONFIGMAPS, result_configmap("watched"), namespace)
    wait_until(lambda: changes.has("added", "watched"), timeout=30, what="ADDED watched")
    for name in ("listed", "watched"):
        cached = store.get(namespace, name)
        assert cached is not None
        assert "managedFields" not in cached["metadata"]
        assert "annotations" not in cached["metadata"]
        kept = json.loads(cached["data"][RESULT_KEY])
        assert kept["jobName"] == name and kept["state"] == "succeeded"
        assert "pulumiVersion" not in kept and "changes" not in kept
    assert [cm["metadata"]["name"] for cm in store.for_owner(namespace, "web")] == [
        "listed",
        "watched",
    ]
