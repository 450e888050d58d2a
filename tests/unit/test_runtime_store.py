"""The object store, its by-owner index (by Stack, as the controller wires it) and slimming."""

from __future__ import annotations

import json
from typing import Any

from pkobatch.api.constants import STACK_LABEL, STACK_NAME_ANNOTATION
from pkobatch.controller.stores import stack_name_of
from pkobatch.runtime.interfaces import ObjectKey
from pkobatch.runtime.store import Packing, Store, slim


def obj(
    name: str,
    rv: str = "1",
    namespace: str = "ns",
    *,
    kind: str = "Job",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": rv}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owners:
        meta["ownerReferences"] = owners
    api_version = "pulumi.com/v1" if kind == "Stack" else "batch/v1"
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def owner(name: str, *, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": name, "controller": controller}


def replace(
    store: Store, objects: list[dict[str, Any]], namespace: str | None = None
) -> tuple[list[tuple[dict[str, Any] | None, dict[str, Any]]], list[dict[str, Any]]]:
    """``store.replace`` as a reflector calls it, with the changes read out."""
    changed, deleted = store.replace([store.entry(o) for o in objects], namespace)
    return list(changed), deleted


def test_stack_name_prefers_annotation_then_controller_owner_then_label() -> None:
    long_name = "s" * 80
    assert stack_name_of(obj("s", kind="Stack")) == "s"
    assert (
        stack_name_of(
            obj(
                "j",
                labels={STACK_LABEL: "hash-1234"},
                annotations={STACK_NAME_ANNOTATION: long_name},
                owners=[owner("other")],
            )
        )
        == long_name
    )
    assert stack_name_of(obj("j", labels={STACK_LABEL: "x"}, owners=[owner("mine")])) == "mine"
    assert (
        stack_name_of(obj("j", labels={STACK_LABEL: "x"}, owners=[owner("y", controller=False)]))
        == "x"
    )
    assert stack_name_of(obj("cm")) is None


def test_index_follows_upserts_and_deletes() -> None:
    store = Store(owner_of=stack_name_of)
    job1 = obj("j1", labels={STACK_LABEL: "a"})
    job2 = obj("j2", labels={STACK_LABEL: "a"})
    store.upsert(job1)
    store.upsert(job2)
    store.upsert(obj("j3", labels={STACK_LABEL: "a"}, namespace="other"))
    assert {j["metadata"]["name"] for j in store.for_owner("ns", "a")} == {"j1", "j2"}
    # A relabelled object moves to its new Stack.
    store.upsert(obj("j2", "2", labels={STACK_LABEL: "b"}))
    assert [j["metadata"]["name"] for j in store.for_owner("ns", "a")] == ["j1"]
    assert [j["metadata"]["name"] for j in store.for_owner("ns", "b")] == ["j2"]
    assert store.delete(job1) is job1
    assert store.for_owner("ns", "a") == []
    assert store.get("ns", "j1") is None
    assert len(store) == 2


def stored_keys(store: Store) -> list[ObjectKey]:
    return [
        ObjectKey(o["metadata"]["namespace"], o["metadata"]["name"]) for o in store.list_objects()
    ]


def test_replace_reports_changed_and_deleted_within_its_namespace() -> None:
    store = Store()
    store.upsert(obj("keep", "1"))
    store.upsert(obj("bump", "1"))
    store.upsert(obj("gone", "1"))
    store.upsert(obj("elsewhere", "1", namespace="other"))
    changed, deleted = replace(store, [obj("keep", "1"), obj("bump", "2"), obj("new", "1")], "ns")
    assert sorted(new["metadata"]["name"] for _, new in changed) == ["bump", "new"]
    assert [old for old, new in changed if new["metadata"]["name"] == "new"] == [None]
    assert [d["metadata"]["name"] for d in deleted] == ["gone"]
    assert sorted(stored_keys(store)) == [
        ObjectKey("ns", "bump"),
        ObjectKey("ns", "keep"),
        ObjectKey("ns", "new"),
        ObjectKey("other", "elsewhere"),
    ]


def test_replace_without_namespace_covers_everything() -> None:
    store = Store()
    store.upsert(obj("a", namespace="x"))
    changed, deleted = replace(store, [obj("b", namespace="y")])
    assert [new["metadata"]["name"] for _, new in changed] == ["b"]
    assert [d["metadata"]["name"] for d in deleted] == ["a"]
    assert stored_keys(store) == [ObjectKey("y", "b")]


def test_slim_drops_managed_fields_and_last_applied() -> None:
    big = obj(
        "s",
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            "keep": "me",
        },
    )
    big["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    slim(big)
    assert "managedFields" not in big["metadata"]
    assert big["metadata"]["annotations"] == {"keep": "me"}


def finished(name: str, rv: str = "1", stack: str = "a") -> dict[str, Any]:
    job = obj(name, rv, labels={STACK_LABEL: stack})
    job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    return job


PACK_FINISHED = Packing(lambda o: "status" in o, dictionary=b'{"status":{"succeeded":1}}')


def test_packed_objects_read_back_equal_and_only_unpacked_ones_are_listed_as_such() -> None:
    store = Store(owner_of=stack_name_of, packing=PACK_FINISHED)
    running, done = obj("run", labels={STACK_LABEL: "a"}), finished("done")
    store.upsert(running)
    store.upsert(done)
    assert store.get("ns", "done") == done
    assert store.get("ns", "done") is not done  # decoded afresh: the dict was not kept
    assert store.get("ns", "run") is running
    assert sorted(j["metadata"]["name"] for j in store.for_owner("ns", "a")) == ["done", "run"]
    assert sorted(j["metadata"]["name"] for j in store.list_objects()) == ["done", "run"]
    assert store.list_unpacked() == [running]
    # Finishing replaces the dict with its packed form; the old one is returned.
    assert store.upsert(finished("run", "2")) is running
    assert store.list_unpacked() == []
    assert store.delete(done) == done
    assert [j["metadata"]["name"] for j in store.for_owner("ns", "a")] == ["run"]


def test_a_packed_object_moves_between_owners_and_leaves_no_empty_index() -> None:
    store = Store(owner_of=stack_name_of, packing=PACK_FINISHED)
    store.upsert(finished("j", "1", stack="a"))
    store.upsert(finished("j", "2", stack="b"))
    assert store.for_owner("ns", "a") == []
    assert [j["metadata"]["resourceVersion"] for j in store.for_owner("ns", "b")] == ["2"]
    store.delete(finished("j", "2", stack="b"))
    assert store.for_owner("ns", "b") == [] and len(store) == 0
    assert store._by_owner == {}  # no index entry outlives the objects it listed


def test_a_relist_reports_a_packed_object_only_when_its_version_changed() -> None:
    store = Store(owner_of=stack_name_of, packing=PACK_FINISHED)
    store.upsert(finished("same"))
    store.upsert(finished("bumped"))
    store.upsert(finished("gone"))
    changed, deleted = replace(store, [finished("same"), finished("bumped", "2")])
    assert [(old, new) for old, new in changed] == [(finished("bumped"), finished("bumped", "2"))]
    assert deleted == [finished("gone")]
    assert sorted(j["metadata"]["name"] for j in store.for_owner("ns", "a")) == ["bumped", "same"]


def test_packing_against_a_dictionary_of_the_usual_text_makes_an_object_small() -> None:
    def compact(value: dict[str, Any]) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    packing = Packing(lambda _: True, dictionary=compact(finished("some-job")))
    job = finished("another-job", "12345")
    text = compact(job)
    packed = packing.pack(job)
    assert packing.unpack(packed) == job
    assert len(packed) < len(text) / 4
    assert len(packed) < len(Packing(lambda _: True).pack(job))  # the dictionary is what helps
