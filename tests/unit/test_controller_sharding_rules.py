"""Sharding's parts (docs/sharding.md): the settings' selectors and Lease, the shard label on
every run object, the runner's copy of it, the handover decision, and the reconciler standing
down on a Stack its cache has not caught up with (API calls answered by a stand-in). The three
controllers on a real control plane: tests/integration/test_controller_sharding.py."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from pkobatch.api.constants import FINALIZER, JOB_STACK_UID_ANNOTATION, SHARD_LABEL, STACK_LABEL
from pkobatch.api.run import Run, result_labels
from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import JobSettings, Settings, SettingsInvalid, load_settings
from pkobatch.controller.act import Actor
from pkobatch.controller.job_builder import build_run, builtin_template
from pkobatch.controller.reconcile import CONFLICT_RETRY, StackReconciler
from pkobatch.controller.sharding import Relabel, handover, shard_of
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import StackKey, Stores
from pkobatch.kube.client import CONFIGMAPS, JOBS, NotFound, Resource

RUN = Run("up", "sync", 1, "", "abc", "after::abc")


def test_a_shard_controller_selects_its_label_and_takes_its_own_lease() -> None:
    settings = Settings(shard="blue", label_selector="team=a")
    assert settings.shard_selector == f"{SHARD_LABEL}=blue"
    assert settings.stack_selector == f"team=a,{SHARD_LABEL}=blue"
    assert settings.lease_name == "pkobatch-controller-blue"
    assert settings.in_shard({SHARD_LABEL: "blue"})
    assert not settings.in_shard({SHARD_LABEL: "green"})
    assert not settings.in_shard({})


def test_the_unlabelled_share_of_a_sharded_install_keeps_the_default_lease() -> None:
    settings = Settings(sharded=True)
    assert settings.shard_selector == f"!{SHARD_LABEL}"
    assert settings.stack_selector == f"!{SHARD_LABEL}"
    assert settings.lease_name == "pkobatch-controller"
    assert settings.in_shard({})
    assert not settings.in_shard({SHARD_LABEL: "blue"})


def test_an_unsharded_controller_takes_every_stack() -> None:
    settings = Settings()
    assert settings.shard_selector == settings.stack_selector == ""
    assert settings.in_shard({}) and settings.in_shard({SHARD_LABEL: "blue"})


@pytest.mark.parametrize("name", ["Blue", "blue_1", "-blue", "b" * 41, "blue.eu"])
def test_a_shard_name_that_cannot_name_a_lease_is_refused_with_the_rule(name: str) -> None:
    with pytest.raises(SettingsInvalid) as error:
        load_settings(shard=name)
    assert "PKOBATCH_SHARD:" in str(error.value)
    assert "lowercase letters, digits and '-'" in str(error.value)


def test_the_shard_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKOBATCH_SHARD", "eu-1")
    assert load_settings().stack_selector == f"{SHARD_LABEL}=eu-1"


def stack(labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "app", "namespace": "team", "uid": "u1", "generation": 1}
    if labels is not None:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {}}


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def test_a_run_of_a_sharded_stack_carries_its_shard_label() -> None:
    built = build_run(
        stack({SHARD_LABEL: "blue", "other": "x"}),
        StackSpec.model_validate({"stack": "dev"}),
        RUN,
        JobSettings(),
        builtin_template(),
    )
    assert labels_of(built.job)[SHARD_LABEL] == "blue"
    assert "other" not in labels_of(built.job)  # only the shard label follows the Stack
    assert built.job["spec"]["template"]["metadata"]["labels"][SHARD_LABEL] == "blue"


def test_a_job_template_cannot_move_a_run_into_another_shard() -> None:
    spec = {"stack": "dev", "jobTemplate": {"metadata": {"labels": {SHARD_LABEL: "green"}}}}
    for owner, expected in ((stack(), None), (stack({SHARD_LABEL: "blue"}), "blue")):
        job = build_run(
            owner, StackSpec.model_validate(spec), RUN, JobSettings(), builtin_template()
        ).job
        assert labels_of(job).get(SHARD_LABEL) == expected
        assert job["spec"]["template"]["metadata"]["labels"].get(SHARD_LABEL) == expected


def test_the_result_copies_the_jobs_shard_label() -> None:
    assert result_labels({SHARD_LABEL: "blue"}, "app", "up")[SHARD_LABEL] == "blue"
    assert SHARD_LABEL not in result_labels({}, "app", "up")


def obj(name: str, shard: str | None) -> dict[str, Any]:
    labels = {SHARD_LABEL: shard} if shard is not None else {}
    return {"metadata": {"name": name, "labels": labels}}


def test_handover_relabels_the_jobs_and_results_labelled_for_another_shard() -> None:
    jobs = [obj("old-run", "blue"), obj("mine", "green")]
    results = {"old-run": obj("old-run", "blue"), "mine": obj("mine", "green")}
    assert handover(stack({SHARD_LABEL: "green"}), jobs, results) == [
        Relabel("Job", "old-run", "green"),
        Relabel("ConfigMap", "old-run", "green"),
    ]
    # Into the unlabelled share: the label goes.
    assert handover(stack(), [obj("mine", None)], {"mine": obj("mine", "blue")}) == [
        Relabel("ConfigMap", "mine", None)
    ]
    assert handover(stack({SHARD_LABEL: "green"}), jobs[1:], results) == []
    assert shard_of(stack()) is None


class PatchRecorder:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, Any]] = []

    def merge_patch(
        self, resource: Resource, name: str, body: Any, namespace: str, **_: Any
    ) -> dict[str, Any]:
        self.patches.append((resource.plural, name, body))
        if name == "gone":
            raise NotFound(404, "NotFound", "gone")
        return {}


def test_the_actor_patches_only_the_shard_label_and_skips_vanished_objects() -> None:
    kube = PatchRecorder()
    Actor(kube, events=None).relabel(  # type: ignore[arg-type]
        "team",
        [Relabel("Job", "gone", "green"), Relabel("ConfigMap", "run", None)],
    )
    assert kube.patches == [
        (JOBS.plural, "gone", {"metadata": {"labels": {SHARD_LABEL: "green"}}}),
        (CONFIGMAPS.plural, "run", {"metadata": {"labels": {SHARD_LABEL: None}}}),
    ]


class Cluster:
    """The API calls a reconcile makes, answered from ``live`` (the Stack as the API server
    has it): Jobs are created, patches recorded."""

    def __init__(self, live: dict[str, Any]) -> None:
        self.live = live
        self.stack_reads = 0
        self.created: list[str] = []
        self.patched: list[tuple[str, str]] = []

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> Any:
        if resource.plural == "stacks":
            self.stack_reads += 1
            return self.live
        raise NotFound(404, "NotFound", name)

    def create(self, resource: Resource, body: Any, namespace: str | None = None, **_: Any) -> Any:
        self.created.append(f"{resource.kind}/{body['metadata']['name']}")
        return {**body, "metadata": {**body["metadata"], "uid": "created-uid"}}

    def merge_patch(self, resource: Resource, name: str, body: Any, *_: Any, **__: Any) -> Any:
        self.patched.append((resource.kind, name))
        return {"metadata": {"resourceVersion": "99"}}

    def list_objects(self, *_: Any, **__: Any) -> tuple[list[Any], str]:
        return [], "1"

    def with_own_rate_limit(self) -> Cluster:
        return self

    def jobs(self) -> list[str]:
        return [name for name in self.created if name.startswith("Job/")]


def cached_stack(shard: str | None, resource_version: str = "5") -> dict[str, Any]:
    cached = stack({SHARD_LABEL: shard} if shard else {})
    cached.update(apiVersion="pulumi.com/v1", kind="Stack")
    cached["metadata"].update(resourceVersion=resource_version, finalizers=[FINALIZER])
    # A pinned commit: the run needs no branch polling.
    cached["spec"] = {"stack": "dev", "projectRepo": "https://example.com/app.git", "commit": "a1"}
    return cached


def reconcile_once(settings: Settings, cached: dict[str, Any], cluster: Cluster, *jobs: Any) -> Any:
    stores = Stores.empty()
    stores.stacks.upsert(cached)
    for job in jobs:
        stores.jobs.upsert(job)
    reconciler = StackReconciler(
        cluster,  # type: ignore[arg-type]
        stores,
        settings,
        StackMetrics(CollectorRegistry()),
        Enqueuer(),
    )
    return reconciler.reconcile(StackKey("team", "app"))


class Enqueuer:
    def enqueue(self, key: StackKey, after: float | None = None) -> None:
        pass


def test_a_shard_creates_a_job_only_from_the_latest_version_of_a_stack_still_in_its_shard() -> None:
    blue = Settings(shard="blue")
    fresh = Cluster(cached_stack("blue"))
    reconcile_once(blue, cached_stack("blue"), fresh)
    assert len(fresh.jobs()) == 1

    # The store lags: the Stack changed (e.g. it was relabelled) since this version.
    newer = Cluster(cached_stack("green", resource_version="6"))
    assert reconcile_once(blue, cached_stack("blue"), newer).requeue_after == CONFLICT_RETRY
    assert newer.created == [] and newer.patched == []

    # Unsharded: the status precondition and Job names suffice, no extra read.
    unsharded = Cluster(cached_stack("blue"))
    reconcile_once(Settings(), cached_stack("blue"), unsharded)
    assert unsharded.stack_reads == 0 and len(unsharded.jobs()) == 1


def running_job(shard: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "app-up-1",
            "namespace": "team",
            "labels": {SHARD_LABEL: shard, STACK_LABEL: "app"},
            "annotations": {JOB_STACK_UID_ANNOTATION: "u1"},
            "ownerReferences": [
                {"apiVersion": "pulumi.com/v1", "kind": "Stack", "name": "app", "uid": "u1"}
            ],
        },
        "status": {"active": 1},
    }


def test_the_new_owner_relabels_the_running_job_unless_its_cache_is_stale() -> None:
    green = Settings(shard="green")
    moved = cached_stack("green")
    moved["status"] = {"currentUpdate": {"name": "app-up-1"}}
    cluster = Cluster(moved)
    reconcile_once(green, moved, cluster, running_job("blue"))
    assert ("Job", "app-up-1") in cluster.patched
    assert cluster.jobs() == []  # the run in progress is the Stack's run

    stale = Cluster(cached_stack("blue", resource_version="6"))
    assert reconcile_once(green, moved, stale, running_job("blue")).requeue_after == (
        CONFLICT_RETRY
    )
    assert stale.patched == [] and stale.created == []


def test_a_running_job_of_a_stack_outside_the_controllers_share_holds_no_run_slot() -> None:
    """E.g. a Job created before sharding was enabled, whose Stack now belongs to a shard:
    the main controller still caches it, but never reconciles its Stack to free the slot."""
    elsewhere = running_job("")
    elsewhere["metadata"].update(name="moved-up-1", labels={STACK_LABEL: "moved"})
    elsewhere["metadata"]["ownerReferences"][0].update(name="moved", uid="u2")
    cluster = Cluster(cached_stack("blue"))
    reconcile_once(
        Settings(shard="blue", max_active_jobs=1), cached_stack("blue"), cluster, elsewhere
    )
    assert len(cluster.jobs()) == 1
