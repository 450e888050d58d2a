"""The manager's namespace scope (``ManagerOptions.namespace_filter``): which keys are queued
and reconciled, and what a namespace that gains or loses its labels does."""

from __future__ import annotations

from typing import Any, cast

from pkobatch.api.label_selector import parse_selector
from pkobatch.api.objects import JSON
from pkobatch.kube.client import STACKS, Kube
from pkobatch.runtime.interfaces import ObjectKey, ReconcileResult
from pkobatch.runtime.manager import (
    Manager,
    ManagerOptions,
    Watch,
    namespace_labels,
    selected,
)
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.store import Store, object_key
from pkobatch.runtime.workqueue import WorkQueue

SELECTOR = parse_selector("pulumi=enabled")


def namespace(name: str, **labels: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "resourceVersion": "7", "labels": labels, "uid": "u"},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def stack(namespace: str, name: str) -> JSON:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"}}


class Recorder:
    """A reconciler that records the keys it reconciles and those it is told to forget."""

    def __init__(self) -> None:
        self.keys: list[ObjectKey] = []
        self.forgotten: list[ObjectKey] = []

    def reconcile(self, key: ObjectKey) -> ReconcileResult:
        self.keys.append(key)
        return ReconcileResult(requeue_after=60)

    def forget(self, key: ObjectKey) -> None:
        self.forgotten.append(key)


def manager(recorder: Recorder, stacks: Store, **options: Any) -> Manager:
    # The manager is built, not run: its reflectors never call the API.
    return Manager(
        cast(Kube, object()),
        WorkQueue(),
        recorder,
        [Watch(STACKS, stacks, lambda obj: [object_key(obj)])],
        ManagerOptions(kind="Stack", **options),
        metrics=Metrics("test"),
    )


def drain(queue: WorkQueue[ObjectKey]) -> set[ObjectKey]:
    keys = set()
    while len(queue):
        key = queue.get(timeout=1)
        assert key is not None
        keys.add(key)
        queue.done(key)
    return keys


def test_the_namespace_cache_keeps_only_the_name_and_labels() -> None:
    assert namespace_labels(namespace("team-a", pulumi="enabled")) == {
        "metadata": {"name": "team-a", "resourceVersion": "7", "labels": {"pulumi": "enabled"}}
    }


def test_a_namespace_is_selected_while_it_exists_with_matching_labels() -> None:
    assert selected(SELECTOR, namespace_labels(namespace("a", pulumi="enabled")))
    assert not selected(SELECTOR, namespace_labels(namespace("a", pulumi="off")))
    assert not selected(SELECTOR, namespace_labels(namespace("a")))
    assert not selected(SELECTOR, None)


def test_without_a_namespace_filter_every_namespace_is_in_scope_and_none_is_watched() -> None:
    built = manager(Recorder(), Store())
    assert built.in_scope("anything")
    assert [r.name for r in built.reflectors] == ["stacks"]


def test_keys_of_a_namespace_whose_labels_do_not_match_are_not_reconciled() -> None:
    recorder, stacks = Recorder(), Store()
    built = manager(recorder, stacks, namespace_filter=SELECTOR)
    assert sorted(r.name for r in built.reflectors) == ["namespaces", "stacks"]
    built.namespaces.upsert(namespace_labels(namespace("on", pulumi="enabled")))
    built.namespaces.upsert(namespace_labels(namespace("off", pulumi="no")))
    assert built.in_scope("on")
    assert not built.in_scope("off")
    assert not built.in_scope("unknown")  # not listed yet, or deleted
    built._workers.process(ObjectKey("off", "s"))
    built._workers.process(ObjectKey("on", "s"))
    assert recorder.keys == [ObjectKey("on", "s")]
    assert recorder.forgotten == [ObjectKey("off", "s")]


def test_a_namespace_that_gains_or_loses_its_labels_queues_its_cached_stacks() -> None:
    stacks = Store()
    for key in (("a", "one"), ("a", "two"), ("b", "other")):
        stacks.upsert(stack(*key))
    recorder = Recorder()
    built = manager(recorder, stacks, namespace_filter=SELECTOR)
    unlabelled = namespace_labels(namespace("a"))
    labelled = namespace_labels(namespace("a", pulumi="enabled"))
    a_keys = {ObjectKey("a", "one"), ObjectKey("a", "two")}
    built.namespaces.upsert(unlabelled)
    built._namespace_changed(None, unlabelled)
    assert drain(built.queue) == set()
    built.namespaces.upsert(labelled)
    built._namespace_changed(unlabelled, labelled)
    assert drain(built.queue) == a_keys
    built._namespace_changed(labelled, labelled)  # an update that keeps the labels
    assert drain(built.queue) == set()
    # Losing them queues the keys once more: the worker has the reconciler forget them.
    built.namespaces.upsert(unlabelled)
    built._namespace_changed(labelled, unlabelled)
    for key in drain(built.queue):
        built._workers.process(key)
    assert set(recorder.forgotten) == a_keys and recorder.keys == []
    assert not built.in_scope("a")
    assert stacks.get("a", "one") is not None  # its objects stay cached
    built.namespaces.upsert(labelled)
    built._namespace_changed(unlabelled, labelled)
    built.namespaces.delete(labelled)
    built._namespace_changed(labelled, None)  # deleted: its keys go to be forgotten
    assert drain(built.queue) == a_keys


def test_a_resync_queues_only_keys_in_scope() -> None:
    stacks = Store()
    stacks.upsert(stack("on", "s"))
    stacks.upsert(stack("off", "s"))
    built = manager(Recorder(), stacks, namespace_filter=SELECTOR)
    built.namespaces.upsert(namespace_labels(namespace("on", pulumi="enabled")))
    built._resync()
    assert drain(built.queue) == {ObjectKey("on", "s")}
