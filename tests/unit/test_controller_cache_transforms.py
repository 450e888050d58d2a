"""What the controller caches of each object (pkobatch.controller.cache_transforms): small,
and every decision ``decide`` makes from the cached objects is the one it makes from the whole
ones."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

from decision_world import World, deployed_world

from pkobatch.api.constants import (
    OPERATION_LABEL,
    RECONCILE_REQUEST_ANNOTATION,
    RESULT_KEY,
    RUN_ANNOTATION,
)
from pkobatch.api.run import Run, RunResult
from pkobatch.controller.cache_transforms import (
    FOLDED_RESULT_FIELDS,
    cache_job,
    cache_result,
    cache_stack,
    folded_result,
)
from pkobatch.controller.decision import Decision
from pkobatch.controller.observe import of_stack
from pkobatch.controller.stores import SETTLED_RUNS, Stores, stack_name_of

JSON = dict[str, Any]
MANAGED_FIELDS = [{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}}]
# The condition the Job controller sets before a finished Job's final one.
INTERIM_CONDITION = {"Complete": "SuccessCriteriaMet", "Failed": "FailureTarget"}


def noisy(obj: JSON) -> JSON:
    """``obj`` as the API server sends it: managed fields, foreign annotations and, on a
    finished Job, the interim condition before its final one."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    meta["managedFields"] = MANAGED_FIELDS
    meta.setdefault("annotations", {})["argocd.argoproj.io/tracking-id"] = "app:pulumi.com/Stack"
    if obj.get("kind") == "Job":
        conditions = (obj.get("status") or {}).get("conditions") or []
        obj["status"]["conditions"] = [
            *(
                {**c, "type": INTERIM_CONDITION[c["type"]], "reason": "Interim"}
                for c in conditions
                if c.get("type") in INTERIM_CONDITION
            ),
            *conditions,
        ]
    return obj


class CachedWorld(World):
    """The same world, planned from what the controller's cache keeps: transformed, and
    read back from the controller's stores (finished runs packed)."""

    def observed_objects(self) -> tuple[JSON, list[JSON], dict[str, JSON]]:
        stores = Stores.empty()
        for job in self.jobs.values():
            stores.jobs.upsert(cache_job(noisy(job)))
        for cm in self.results.values():
            stores.configmaps.upsert(cache_result(noisy(cm)))
        meta = self.stack["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        return (
            cache_stack(noisy(self.stack)),
            stores.jobs.for_owner(namespace, name),
            {cm["metadata"]["name"]: cm for cm in stores.configmaps.for_owner(namespace, name)},
        )


def same_decisions(whole: World, cached: World) -> Decision:
    """Step both worlds once; their decisions must agree on everything they write."""
    expected, got = whole.step(), cached.step()
    assert got.status == expected.status
    assert got.create_job == expected.create_job
    assert got.delete_jobs == expected.delete_jobs
    assert got.delete_results == expected.delete_results
    assert got.finalizer == expected.finalizer
    assert got.requeue_after == expected.requeue_after
    assert [(e.reason, e.message) for e in got.events] == [
        (e.reason, e.message) for e in expected.events
    ]
    return got


def test_a_run_folds_the_same_from_the_cache_outputs_secrets_and_project_info() -> None:
    whole, cached = World(), CachedWorld()
    same_decisions(whole, cached)
    for world in (whole, cached):
        world.finish(outputs={"url": "http://x", "pass": "hunter2"}, secret_outputs=["pass"])
    folded = same_decisions(whole, cached)
    assert folded.status is not None and folded.status["outputs"]["pass"] == "[secret]"
    assert folded.status["projectInfo"] == {"name": "app", "runtime": "python"}


def test_failures_retries_deadlines_and_history_plan_the_same_from_the_cache() -> None:
    whole, cached = World(), CachedWorld()
    same_decisions(whole, cached)
    pruned = []
    for _ in range(7):  # more runs than the history keeps: old Jobs are pruned
        for world in (whole, cached):
            world.finish(state="failed", reason="ProgramError", message="boom")
        pruned += same_decisions(whole, cached).delete_jobs
        for world in (whole, cached):
            world.advance(3600)
            world.edit_spec(branch=f"b{world.counter}")
        same_decisions(whole, cached)
    assert pruned, "the history limit pruned old Jobs"
    for world in (whole, cached):
        world.annotate(RECONCILE_REQUEST_ANNOTATION, "now")
    same_decisions(whole, cached)
    for world in (whole, cached):
        world.fail_job(reason="DeadlineExceeded")
    deadline = same_decisions(whole, cached)
    assert deadline.status is not None
    assert "deadline of" in deadline.status["lastUpdate"]["message"]


def test_a_job_keeps_what_the_controller_reads_not_its_pod_template_or_interim_conditions() -> None:
    world = World()
    world.step()
    job = noisy(next(iter(world.jobs.values())))
    job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"}
    condition = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:05:00Z"}
    job["status"] = {
        **status,
        "uncountedTerminatedPods": {},
        "conditions": [{**condition, "lastProbeTime": "2026-01-01T00:05:00Z"}],
    }
    job["status"]["conditions"].insert(0, {**condition, "type": "SuccessCriteriaMet"})
    cached = cache_job(job)
    assert Run.from_job(cached) == Run.from_job(job) is not None
    assert of_stack(cached, "stack-uid") and stack_name_of(cached) == "app"
    assert cached["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:00Z"
    assert cached["spec"] == {"activeDeadlineSeconds": job["spec"]["activeDeadlineSeconds"]}
    assert cached["status"] == {**status, "conditions": [condition]}
    assert "managedFields" not in cached["metadata"]
    assert set(cached["metadata"]["annotations"]) >= {RUN_ANNOTATION}
    assert "argocd.argoproj.io/tracking-id" not in cached["metadata"]["annotations"]
    assert len(json.dumps(cached)) * 2 < len(json.dumps(job)), "the pod template is most of it"


def test_a_stack_loses_only_metadata_noise() -> None:
    world = deployed_world()
    world.annotate(RECONCILE_REQUEST_ANNOTATION, "r1")
    world.stack["metadata"]["labels"] = {"team": "a"}
    stack = noisy(world.stack)
    cached = cache_stack(stack)
    assert cached["spec"] == stack["spec"] and cached["status"] == stack["status"]
    assert cached["metadata"]["annotations"] == {RECONCILE_REQUEST_ANNOTATION: "r1"}
    assert cached["metadata"]["labels"] == {"team": "a"}
    assert cached["metadata"]["finalizers"] == stack["metadata"]["finalizers"]
    assert "managedFields" not in cached["metadata"]


def test_stacks_decoded_apart_share_their_status_keys_and_enumerated_values() -> None:
    # Each watch event is decoded on its own, into fresh strings; the cache keeps one of each.
    text = json.dumps(deployed_world().stack)
    first, second = (cache_stack(json.loads(text)) for _ in range(2))
    whole = json.loads(text)
    assert first["spec"] == whole["spec"] and first["status"] == whole["status"]
    ready = [
        next(c for c in stack["status"]["conditions"] if c["type"] == "Ready")
        for stack in (first, second)
    ]
    assert ready[0]["status"] is ready[1]["status"] and ready[0]["reason"] is ready[1]["reason"]
    keys = [next(k for k in stack["status"] if k == "lastUpdate") for stack in (first, second)]
    assert keys[0] is keys[1]
    assert first["status"]["lastUpdate"]["state"] is second["status"]["lastUpdate"]["state"]


def interned(value: str) -> bool:
    """Whether ``value`` is the interned copy of its text (a fresh equal string is not)."""
    return sys.intern("".join(list(value))) is value


def test_jobs_share_their_fixed_strings_but_keep_their_own_names_uids_and_times() -> None:
    world = World()
    world.step()
    job = next(iter(world.jobs.values()))
    job["status"] = {
        "conditions": [
            {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:05:00Z"}
        ]
    }
    cached = cache_job(json.loads(json.dumps(job)))
    meta = cached["metadata"]
    (condition,) = cached["status"]["conditions"]
    (owner,) = meta["ownerReferences"]
    for shared in (condition["type"], condition["status"], owner["kind"], cached["kind"]):
        assert interned(shared), shared
    assert interned(meta["labels"][OPERATION_LABEL])
    # Unique to this run: interned, they could outlive it.
    for own in (
        meta["name"],
        meta["uid"],
        owner["uid"],
        owner["name"],
        meta["annotations"][RUN_ANNOTATION],
        condition["lastTransitionTime"],
    ):
        assert not interned(own), own


def test_result_json_keeps_the_folded_fields_only() -> None:
    world = World()
    world.step()
    name = world.finish(outputs={"a": 1})
    configmap = world.results[name]
    full = json.loads(configmap["data"][RESULT_KEY])
    full.update(
        changes={"create": 3},
        pulumiVersion="3.259.0",
        languageHost="inline-python",
        failedStep="outputRetrieval",
    )
    configmap["data"] = {RESULT_KEY: json.dumps(full), "other": "x" * 1000}
    cached = cache_result(noisy(configmap))
    assert list(cached["data"]) == [RESULT_KEY]
    kept = json.loads(cached["data"][RESULT_KEY])
    # The failed step names the failure's Event (fold.failure_event_reason).
    assert kept["failedStep"] == "outputRetrieval"
    assert set(kept) <= FOLDED_RESULT_FIELDS
    assert {"changes", "pulumiVersion", "languageHost", "startTime"}.isdisjoint(kept)
    assert kept == {key: value for key, value in full.items() if key in FOLDED_RESULT_FIELDS}
    RunResult.model_validate_json(cached["data"][RESULT_KEY])
    assert cached["metadata"]["ownerReferences"] == configmap["metadata"]["ownerReferences"]


def test_an_unreadable_result_is_cached_as_it_is_so_folding_can_say_so() -> None:
    assert folded_result("{not json") == "{not json"
    assert folded_result("[1, 2]") == "[1, 2]"
    assert "data" not in cache_result({"metadata": {"name": "x"}})


def test_finished_runs_are_kept_packed_small_and_running_jobs_as_dicts() -> None:
    world = World()
    world.step()
    stores = Stores.empty()
    (running,) = (cache_job(noisy(job)) for job in world.jobs.values())
    stores.jobs.upsert(running)
    assert stores.jobs.list_unpacked() == [running]
    name = world.finish(outputs={"url": "http://x"})
    job, result = cache_job(noisy(world.jobs[name])), cache_result(noisy(world.results[name]))
    stores.jobs.upsert(job)
    stores.configmaps.upsert(result)
    assert stores.jobs.list_unpacked() == []  # finished: packed
    assert stores.jobs.get("team", name) == job
    assert stores.configmaps.get("team", name) == result
    for obj in (job, result):
        text = json.dumps(obj, separators=(",", ":")).encode()
        # Against the dictionary of a finished run's usual text, what is left is mostly
        # this run's own names, uids and times.
        assert len(SETTLED_RUNS.pack(obj)) < len(text) / 3
