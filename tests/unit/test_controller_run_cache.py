"""controller.run_cache: the namespace's cache claim, when a run may mount it, and the Jobs
the decision builds with it (and without it: disabled, degraded, opted out)."""

from __future__ import annotations

from typing import Any

import pytest
from decision_world import World
from pydantic import ValidationError

from pkobatch.api.objects import JSON
from pkobatch.config import RunCacheSettings, Settings
from pkobatch.controller.run_cache import (
    CACHE_VOLUME,
    EVENT_RUN_CACHE_UNAVAILABLE,
    RUN_CACHE_ANNOTATION,
    cache_claim,
    choose_cache,
    claim_in_use,
)
from pkobatch.controller.run_pod import run_container

ENABLED = RunCacheSettings(enabled=True)


def claim(phase: str = "Bound", modes: tuple[str, ...] = ("ReadWriteMany",)) -> JSON:
    manifest = cache_claim("team", ENABLED)
    manifest["status"] = {"phase": phase, "accessModes": list(modes)}
    return manifest


def pod_spec(job: JSON) -> JSON:
    spec: JSON = job["spec"]["template"]["spec"]
    return spec


def cache_volume(job: JSON) -> JSON | None:
    return next((v for v in pod_spec(job).get("volumes") or [] if v["name"] == CACHE_VOLUME), None)


def cache_env(job: JSON) -> list[Any]:
    runner = run_container(pod_spec(job))
    return [e.get("value") for e in runner.get("env") or [] if e["name"] == "PKOBATCH_CACHE_DIR"]


def cache_mounts(job: JSON) -> list[str]:
    runner = run_container(pod_spec(job))
    return [m["mountPath"] for m in runner.get("volumeMounts") or [] if m["name"] == CACHE_VOLUME]


def cache_world(spec: dict[str, Any] | None = None, **settings: Any) -> World:
    return World(spec, settings=Settings(run_cache=RunCacheSettings(enabled=True, **settings)))


def warnings(decision: Any) -> list[str]:
    return [e.message for e in decision.events if e.reason == EVENT_RUN_CACHE_UNAVAILABLE]


def test_the_claim_carries_the_settings() -> None:
    settings = RunCacheSettings(
        enabled=True,
        claim_name="runs-cache",
        storage_class="nfs",
        size="50Gi",
        access_mode="ReadWriteOnce",
    )
    manifest = cache_claim("team-a", settings)
    assert manifest["metadata"]["name"] == "runs-cache"
    assert manifest["metadata"]["namespace"] == "team-a"
    assert manifest["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "pkobatch",
        "pkobatch.io/run-cache": "true",
    }
    assert manifest["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "nfs",
    }


def test_the_claim_names_a_class_only_when_one_is_set() -> None:
    assert "storageClassName" not in cache_claim("team", ENABLED)["spec"]
    empty = RunCacheSettings(enabled=True, storage_class="")
    assert cache_claim("team", empty)["spec"]["storageClassName"] == ""


@pytest.mark.parametrize(
    ("observed", "in_use", "mounted", "warned", "create"),
    [
        (claim(), False, True, False, False),
        (claim(), True, True, False, False),
        (None, False, False, True, True),
        (claim("Pending"), False, False, True, False),
        (claim("Lost"), False, False, True, False),
        (claim(modes=("ReadWriteOnce",)), False, True, False, False),
        # ReadWriteOnce: one run at a time; the others use an emptyDir, without a warning.
        (claim(modes=("ReadWriteOnce",)), True, False, False, False),
    ],
)
def test_which_claim_a_run_mounts(
    observed: JSON | None, in_use: bool, mounted: bool, warned: bool, create: bool
) -> None:
    choice = choose_cache(observed, ENABLED, in_use)
    assert choice.path == "/var/cache/pkobatch"
    assert (choice.claim == "pkobatch-run-cache") is mounted
    assert bool(choice.warning) is warned
    assert choice.create_claim is create


def test_a_claim_being_deleted_is_not_mounted() -> None:
    deleting = claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    choice = choose_cache(deleting, ENABLED, in_use=False)
    assert choice.claim is None
    assert "being deleted" in choice.warning
    assert not choice.create_claim


def test_a_pending_claim_warning_says_what_to_do() -> None:
    warning = choose_cache(claim("Pending"), ENABLED, in_use=False).warning
    assert "WaitForFirstConsumer" in warning
    assert "PKOBATCH_RUN_CACHE__STORAGE_CLASS" in warning


def test_disabled_leaves_the_job_without_a_cache() -> None:
    world = World()
    world.run_cache_claim = claim()
    decision = world.step()
    job = decision.create_job
    assert job is not None
    assert cache_volume(job) is None
    assert cache_env(job) == []
    assert RUN_CACHE_ANNOTATION not in job["metadata"]["annotations"]
    assert decision.create_run_cache is None
    assert warnings(decision) == []


def test_a_bound_claim_is_mounted_at_the_cache_dir() -> None:
    world = cache_world()
    world.run_cache_claim = claim()
    decision = world.step()
    job = decision.create_job
    assert job is not None
    assert cache_volume(job) == {
        "name": CACHE_VOLUME,
        "persistentVolumeClaim": {"claimName": "pkobatch-run-cache"},
    }
    assert cache_mounts(job) == ["/var/cache/pkobatch"]
    assert cache_env(job) == ["/var/cache/pkobatch"]
    assert job["metadata"]["annotations"][RUN_CACHE_ANNOTATION] == "pkobatch-run-cache"
    assert decision.create_run_cache is None
    assert warnings(decision) == []


def test_a_missing_claim_is_created_and_the_run_uses_an_empty_dir() -> None:
    world = cache_world(size="5Gi")
    decision = world.step()
    job = decision.create_job
    assert job is not None
    assert cache_volume(job) == {"name": CACHE_VOLUME, "emptyDir": {}}
    assert cache_env(job) == ["/var/cache/pkobatch"]
    assert RUN_CACHE_ANNOTATION not in job["metadata"]["annotations"]
    assert decision.create_run_cache == cache_claim("team", RunCacheSettings(size="5Gi"))
    [warning] = warnings(decision)
    assert job["metadata"]["name"] in warning
    assert "did not exist" in warning


def test_an_unbound_claim_gives_an_empty_dir_and_a_warning() -> None:
    world = cache_world()
    world.run_cache_claim = claim("Pending")
    decision = world.step()
    assert decision.create_job is not None
    assert cache_volume(decision.create_job) == {"name": CACHE_VOLUME, "emptyDir": {}}
    assert decision.create_run_cache is None
    assert ["is Pending" in w for w in warnings(decision)] == [True]


def test_a_stack_with_its_own_cache_dir_keeps_it() -> None:
    """The opt-out: PKOBATCH_CACHE_DIR in the Stack's run environment."""
    world = cache_world()
    world.stack["spec"]["workspaceTemplate"] = {
        "spec": {"env": [{"name": "PKOBATCH_CACHE_DIR", "value": "/cache/own"}]}
    }
    decision = world.step()
    job = decision.create_job
    assert job is not None
    assert cache_volume(job) is None
    assert cache_env(job) == ["/cache/own"]
    assert decision.create_run_cache is None
    assert warnings(decision) == []


def test_a_stack_mounting_a_volume_at_the_cache_path_keeps_it() -> None:
    world = cache_world()
    world.run_cache_claim = claim()
    world.stack["spec"]["jobTemplate"] = {
        "spec": {
            "volumes": [{"name": "mine", "emptyDir": {}}],
            "containers": [
                {
                    "name": "pulumi",
                    "volumeMounts": [{"name": "mine", "mountPath": "/var/cache/pkobatch/"}],
                }
            ],
        }
    }
    job = world.step().create_job
    assert job is not None
    assert cache_volume(job) is None
    assert cache_env(job) == []


def test_the_claim_meets_the_restricted_pod_security_level() -> None:
    settings = Settings(
        run_cache=RunCacheSettings(enabled=True), job={"pod_security_level": "restricted"}
    )
    world = World(settings=settings)
    world.run_cache_claim = claim()
    job = world.step().create_job
    assert job is not None
    assert cache_volume(job) is not None


def test_an_active_job_of_the_namespace_holds_the_claim() -> None:
    world = cache_world()
    world.run_cache_claim = claim()
    job = world.step().create_job
    assert job is not None
    assert claim_in_use([job], "team", "pkobatch-run-cache")
    assert not claim_in_use([job], "other", "pkobatch-run-cache")
    assert not claim_in_use([job], "team", "another-claim")
    finished = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert not claim_in_use([finished], "team", "pkobatch-run-cache")


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKOBATCH_RUN_CACHE__ENABLED", "true")
    monkeypatch.setenv("PKOBATCH_RUN_CACHE__STORAGE_CLASS", "efs")
    monkeypatch.setenv("PKOBATCH_RUN_CACHE__SIZE", "20Gi")
    monkeypatch.setenv("PKOBATCH_RUN_CACHE__ACCESS_MODE", "ReadWriteOnce")
    settings = Settings().run_cache
    assert (settings.enabled, settings.storage_class, settings.size, settings.access_mode) == (
        True,
        "efs",
        "20Gi",
        "ReadWriteOnce",
    )


@pytest.mark.parametrize(
    "invalid",
    [
        {"access_mode": "ReadOnlyMany"},
        {"path": "relative"},
        {"claim_name": "Not_A_Name"},
        {"size": "10GB"},
    ],
)
def test_invalid_settings_are_refused(invalid: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        RunCacheSettings.model_validate(invalid)


def prune_env(job: JSON) -> list[Any]:
    runner = run_container(pod_spec(job))
    return [
        e.get("value") for e in runner.get("env") or [] if e["name"] == "PKOBATCH_CACHE_MAX_BYTES"
    ]


def test_the_runner_prunes_a_mounted_claim_to_80_percent_of_its_capacity() -> None:
    """The volume's capacity as its status reports it (it may exceed the size asked for),
    else the size asked for; a Stack's own bound wins; an emptyDir gets none."""
    world = cache_world(size="5Gi")
    world.run_cache_claim = claim()
    job = world.step().create_job
    assert job is not None
    assert prune_env(job) == [str(5 * 2**30 * 80 // 100)]

    world = cache_world(size="5Gi")
    world.run_cache_claim = claim()
    world.run_cache_claim["status"]["capacity"] = {"storage": "8Gi"}
    job = world.step().create_job
    assert job is not None
    assert prune_env(job) == [str(8 * 2**30 * 80 // 100)]

    world = cache_world()
    world.stack["spec"]["workspaceTemplate"] = {
        "spec": {"env": [{"name": "PKOBATCH_CACHE_MAX_BYTES", "value": "7"}]}
    }
    world.run_cache_claim = claim()
    job = world.step().create_job
    assert job is not None
    assert prune_env(job) == ["7"]

    world = cache_world()
    world.run_cache_claim = claim("Pending")
    job = world.step().create_job
    assert job is not None
    assert prune_env(job) == []
