"""A reconcile never starts from a cached Stack that the controller's own previous reconcile
already replaced (``reconcile.OwnWrites``): it waits for the watch to bring the written
version instead of deciding again from the old one (API calls answered by a stand-in)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from pkobatch.api.constants import FINALIZER
from pkobatch.config import Settings
from pkobatch.controller.cache_transforms import cache_job, cache_stack
from pkobatch.controller.reconcile import (
    CONFLICT_RETRY,
    OWN_WRITE_SECONDS,
    POD_CHECK_SLACK,
    OwnWrites,
    StackReconciler,
)
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import StackKey, Stores
from pkobatch.kube.client import Conflict, NotFound, Resource

KEY = StackKey("team", "app")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_replaced_version_is_behind_until_the_cache_shows_another() -> None:
    clock = Clock()
    writes = OwnWrites(clock)
    assert not writes.behind(KEY, "5")
    writes.record(KEY, "5")  # e.g. the finalizer write: 5 -> 6
    writes.record(KEY, "6")  # then the status write: 6 -> 7
    assert writes.behind(KEY, "5") and writes.behind(KEY, "6")
    assert not writes.behind(StackKey("team", "other"), "5")
    assert not writes.behind(KEY, "7")  # the cache caught up: nothing awaited any more
    assert not writes.behind(KEY, "6")


def test_a_write_whose_version_never_shows_is_awaited_only_for_a_while() -> None:
    clock = Clock()
    writes = OwnWrites(clock)
    writes.record(KEY, "5")
    clock.now += OWN_WRITE_SECONDS - 1
    assert writes.behind(KEY, "5")
    clock.now += 2
    assert not writes.behind(KEY, "5")


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to ``target``."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


class ApiServer:
    """The Stack as the API server has it; Jobs and Events created, Stack patches applied."""

    def __init__(self, stack: dict[str, Any]) -> None:
        self.stack = stack
        self.requests: list[str] = []
        self.jobs: list[dict[str, Any]] = []

    def with_own_rate_limit(self) -> ApiServer:
        return self

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> Any:
        self.requests.append(f"GET {resource.plural}/{name}")
        for job in self.jobs:
            if resource.plural == "jobs" and job["metadata"]["name"] == name:
                return job
        raise NotFound(404, "NotFound", name)

    def list_objects(self, *_: Any, **__: Any) -> tuple[list[Any], str]:
        return [], "1"

    def create(self, resource: Resource, body: Any, namespace: str | None = None) -> Any:
        self.requests.append(f"POST {resource.plural}")
        created = copy.deepcopy(body)
        created["metadata"].update(uid=f"uid-{len(self.jobs)}", resourceVersion="50")
        created["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
        if resource.plural == "jobs":
            self.jobs.append(created)
        return created

    def merge_patch(self, resource: Resource, name: str, patch: Any, *_: Any, **__: Any) -> Any:
        what = "/status" if "status" in patch else ""
        self.requests.append(f"PATCH {resource.plural}{what}")
        meta = self.stack["metadata"]
        if patch["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.stack = merged(self.stack, {k: v for k, v in patch.items() if k != "metadata"})
        if "finalizers" in patch["metadata"]:
            self.stack["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        self.stack["metadata"]["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.stack)


class Enqueuer:
    def __init__(self) -> None:
        self.queued: list[StackKey] = []
        self.rescheduled: list[tuple[StackKey, float, float | None]] = []

    def enqueue(self, key: StackKey, after: float | None = None) -> None:
        self.queued.append(key)

    def reschedule(self, key: StackKey, due_within: float, after: float | None) -> None:
        self.rescheduled.append((key, due_within, after))


def reconciler_on(
    api: ApiServer, stores: Stores, enqueuer: Enqueuer | None = None
) -> StackReconciler:
    return StackReconciler(
        api,  # type: ignore[arg-type]
        stores,
        Settings(),
        StackMetrics(CollectorRegistry()),
        enqueuer or Enqueuer(),
    )


def test_a_reconcile_that_finds_its_own_write_not_yet_cached_waits_for_it() -> None:
    created = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": "app",
            "namespace": "team",
            "uid": "stack-uid",
            "resourceVersion": "5",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"stack": "dev"},
    }
    api = ApiServer(copy.deepcopy(created))
    stores = Stores.empty()
    stores.stacks.upsert(cache_stack(copy.deepcopy(created)))
    reconciler = reconciler_on(api, stores)
    reconciler.reconcile(KEY)
    assert api.requests == ["POST jobs", "PATCH stacks", "PATCH stacks/status"]
    assert FINALIZER in api.stack["metadata"]["finalizers"]

    # The Job's watch event woke the Stack; the cache still has it as created.
    stores.jobs.upsert(cache_job(copy.deepcopy(api.jobs[0])))
    api.requests.clear()
    reconciler.reconcile(KEY)
    assert api.requests == []

    # The written version arrives: the reconcile goes ahead and finds nothing to do.
    stores.stacks.upsert(cache_stack(copy.deepcopy(api.stack)))
    reconciler.reconcile(KEY)
    assert api.requests == []
    assert api.stack["status"]["currentUpdate"]["name"] == api.jobs[0]["metadata"]["name"]

    # A reconciler that did not make the write decides again from the old version: its
    # write is refused by the precondition, and it retries a second later.
    stale = Stores.empty()
    stale.stacks.upsert(cache_stack(copy.deepcopy(created)))
    stale.jobs.upsert(cache_job(copy.deepcopy(api.jobs[0])))
    assert reconciler_on(api, stale).reconcile(KEY).requeue_after == CONFLICT_RETRY
    assert api.requests == ["PATCH stacks"]


def new_stack() -> dict[str, Any]:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": "app",
            "namespace": "team",
            "uid": "stack-uid",
            "resourceVersion": "5",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"stack": "dev"},
    }


def reconciler_of_new_stack(
    enqueuer: Enqueuer | None = None,
) -> tuple[dict[str, Any], ApiServer, Stores, StackReconciler]:
    """A Stack just created, the API server and the stores holding it, and a reconciler."""
    created = new_stack()
    api = ApiServer(copy.deepcopy(created))
    stores = Stores.empty()
    stores.stacks.upsert(cache_stack(copy.deepcopy(created)))
    return created, api, stores, reconciler_on(api, stores, enqueuer)


def test_the_watch_events_of_a_reconciles_own_writes_are_echoes() -> None:
    created, api, _, reconciler = reconciler_of_new_stack()
    reconciler.reconcile(KEY)  # Job, finalizer (5 -> 6), status (6 -> 7)
    writes = reconciler.own_writes
    job = cache_job(copy.deepcopy(api.jobs[0]))
    assert writes.echoed_job(KEY, None, job)
    with_finalizer = {**api.stack, "metadata": {**api.stack["metadata"], "resourceVersion": "6"}}
    assert writes.echoed_stack(KEY, created, cache_stack(copy.deepcopy(with_finalizer)))
    assert writes.echoed_stack(KEY, with_finalizer, cache_stack(copy.deepcopy(api.stack)))
    # Then someone else's edit of the same Stack is news again.
    edited = copy.deepcopy(api.stack)
    edited["metadata"].update(resourceVersion="8", generation=2)
    assert not writes.echoed_stack(KEY, api.stack, edited)
    assert not writes.echoed_job(KEY, None, job)  # a Job of the same name made again


def test_the_start_of_a_reconciles_job_wakes_nothing_and_its_end_does() -> None:
    _, api, _, reconciler = reconciler_of_new_stack()
    # The Job it creates asks to be looked at once its pod should exist.
    assert reconciler.reconcile(KEY).requeue_after == 10
    writes = reconciler.own_writes
    job = cache_job(copy.deepcopy(api.jobs[0]))
    started = copy.deepcopy(job)
    started["metadata"]["resourceVersion"] = "51"
    started["status"] = {"startTime": "2026-01-01T00:00:01Z", "active": 1, "ready": 1}
    assert writes.echoed_job(KEY, job, started)
    finished = copy.deepcopy(started)
    finished["metadata"]["resourceVersion"] = "52"
    finished["status"] = {
        "startTime": "2026-01-01T00:00:01Z",
        "succeeded": 1,
        "conditions": [{"type": "Complete", "status": "True"}],
    }
    assert not writes.echoed_job(KEY, started, finished)


def job_status(job: dict[str, Any], version: str, **status: Any) -> dict[str, Any]:
    return {**job, "metadata": {**job["metadata"], "resourceVersion": version}, "status": status}


def test_a_job_that_shows_its_pod_ready_ends_the_wait_to_look_at_that_pod() -> None:
    enqueuer = Enqueuer()
    _, api, _, reconciler = reconciler_of_new_stack(enqueuer)
    assert reconciler.reconcile(KEY).requeue_after == 10  # only to look at the Job's pod
    job = cache_job(copy.deepcopy(api.jobs[0]))
    other = job_status(job, "60", active=1, ready=1)
    other["metadata"]["name"] = "another-job"
    reconciler.echoed_job(KEY, None, other)
    active = job_status(job, "51", startTime="2026-01-01T00:00:01Z", active=1)
    assert reconciler.echoed_job(KEY, job, active)
    # Another Job, or a pod created but not ready: the look at its start is still due.
    assert enqueuer.rescheduled == []
    ready = job_status(job, "52", startTime="2026-01-01T00:00:01Z", active=1, ready=1)
    assert reconciler.echoed_job(KEY, active, ready)
    [(key, due_within, after)] = enqueuer.rescheduled
    assert key == KEY and after is None  # nothing else asked for the Stack
    assert 10 < due_within <= 10 + POD_CHECK_SLACK
    reconciler.echoed_job(KEY, ready, job_status(ready, "53", **ready["status"], failed=0))
    assert len(enqueuer.rescheduled) == 1  # once


def test_a_reconcile_whose_job_started_meanwhile_asks_no_look_at_its_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, api, stores, reconciler = reconciler_of_new_stack()
    apply = reconciler._actor.apply

    def apply_while_the_pod_starts(stack: Any, decision: Any) -> None:
        apply(stack, decision)
        job = cache_job(copy.deepcopy(api.jobs[0]))
        stores.jobs.upsert(
            job_status(job, "51", startTime="2026-01-01T00:00:01Z", active=1, ready=1)
        )

    monkeypatch.setattr(reconciler._actor, "apply", apply_while_the_pod_starts)
    assert reconciler.reconcile(KEY).requeue_after is None


def test_no_echo_is_dropped_while_a_reconcile_waits_for_it() -> None:
    enqueuer = Enqueuer()
    created, api, _, reconciler = reconciler_of_new_stack(enqueuer)
    reconciler.reconcile(KEY)
    reconciler.reconcile(KEY)  # woken by something else, finds version 5: waits
    assert enqueuer.queued == []
    written = cache_stack(copy.deepcopy(api.stack))
    assert not reconciler.own_writes.echoed_stack(KEY, created, written)
    assert not reconciler.own_writes.echoed_job(KEY, None, cache_job(copy.deepcopy(api.jobs[0])))


def test_a_reconcile_that_waits_for_a_version_the_cache_got_meanwhile_is_queued_again() -> None:
    # The written version's event may be judged an echo (and dropped) between the
    # reconcile's read of the cache and its decision to wait: it queues the Stack itself.
    enqueuer = Enqueuer()
    _, api, stores, reconciler = reconciler_of_new_stack(enqueuer)
    reconciler.reconcile(KEY)
    behind = reconciler.own_writes.behind

    def behind_while_the_event_arrives(key: StackKey, version: str) -> bool:
        stores.stacks.upsert(cache_stack(copy.deepcopy(api.stack)))
        return behind(key, version)

    reconciler.own_writes.behind = behind_while_the_event_arrives  # type: ignore[method-assign]
    assert api.requests == ["POST jobs", "PATCH stacks", "PATCH stacks/status"]
    api.requests.clear()
    reconciler.reconcile(KEY)
    assert api.requests == []
    assert enqueuer.queued == [KEY]
