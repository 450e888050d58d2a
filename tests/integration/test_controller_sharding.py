"""Sharding on the real control plane (docs/sharding.md): two shard controllers
(``PKOBATCH_SHARD=blue`` and ``green``) and the controller of the unlabelled Stacks
(``PKOBATCH_SHARDED=true``), three processes under the controller's own RBAC, each with leader
election on its own Lease.

Runs use ``tests/helpers/gated_run.py``: each reads its Job at start (as the runner does, so its
result carries the shard label the Job had then) and writes a succeeded result once the test
opens the Stack's gate — so a Stack can be relabelled while its run is in progress.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.controller_harness import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SA,
    REPO,
    ControllerProcess,
    apply_stack,
    bind_runner,
    last_update,
    ready,
    stack_jobs,
    wait_events,
    wait_stack,
)

from pkobatch.api.constants import EVENT_CREATED, FINALIZER, SHARD_LABEL
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    LEASES,
    ROLEBINDINGS,
    ROLES,
    STACKS,
    Kube,
    Resource,
)

pytestmark = pytest.mark.timeout(900)
JSON = dict[str, Any]
GATED_RUN = REPO / "tests" / "helpers" / "gated_run.py"
BASE = REPO / "deploy" / "kustomize" / "base"
# Controller name -> its settings; "" is the controller of the unlabelled Stacks.
SHARDS = {
    "blue": {"PKOBATCH_SHARD": "blue"},
    "green": {"PKOBATCH_SHARD": "green"},
    "": {"PKOBATCH_SHARDED": "true"},
}


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    path = tmp_path / "gates"
    path.mkdir()
    return path


@pytest.fixture
def controllers(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path, gates: Path, controller_rbac: None
) -> Iterator[dict[str, ControllerProcess]]:
    bind_runner(kube, namespace)
    # The Leases live in the test's namespace: the leader-election Role of the base, there.
    role = yaml.safe_load((BASE / "leader-election-role.yaml").read_text())
    binding = yaml.safe_load((BASE / "leader-election-rolebinding.yaml").read_text())
    binding["subjects"][0]["namespace"] = CONTROLLER_NAMESPACE
    assert binding["subjects"][0]["name"] == CONTROLLER_SA
    kube.apply(ROLES, role, field_manager="pkobatch-tests", namespace=namespace)
    kube.apply(ROLEBINDINGS, binding, field_manager="pkobatch-tests", namespace=namespace)
    common = {
        "PKOBATCH_JOB__COMMAND": f"{sys.executable},{GATED_RUN},{gates}",
        "PKOBATCH_LEADER_ELECTION__ENABLED": "true",
        "PKOBATCH_LEADER_ELECTION__LEASE_NAMESPACE": namespace,
    }
    processes = {
        shard: ControllerProcess(
            cluster, namespace, tmp_path / f"controller-{shard or 'unlabelled'}", {**common, **env}
        )
        for shard, env in SHARDS.items()
    }
    try:
        for process in processes.values():
            process.start()
        yield processes
    finally:
        for process in processes.values():
            process.stop()


def shard_labels(shard: str) -> JSON:
    return {"labels": {SHARD_LABEL: shard}} if shard else {}


def spec(repo: Any, **extra: Any) -> JSON:
    return {"stack": "dev", "projectRepo": repo.file_url, "branch": "main", **extra}


def open_gate(gates: Path, name: str) -> None:
    (gates / name).touch()


def cached_stacks(process: ControllerProcess) -> set[str]:
    """The Stacks in the controller's store (its per-Stack info gauge)."""
    names = set()
    for line in process.scrape().splitlines():
        if line.startswith("pkobatch_stack_info{"):
            names.add(line.split('name="', 1)[1].split('"', 1)[0])
    return names


def operations(process: ControllerProcess) -> float:
    return process.metric("pkobatch_stack_operations_total", operation="up")


def shard_of(obj: JSON) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(SHARD_LABEL, ""))


def created_events(kube: Kube, namespace: str, name: str) -> int:
    """The Stack's EVENT_CREATED Events, once there is one (Events are posted from a queue)."""
    return len(
        wait_events(
            kube,
            namespace,
            lambda e: e["regarding"]["name"] == name and e["reason"] == EVENT_CREATED,
        )
    )


def running(stack: JSON) -> bool:
    return bool(((stack.get("status") or {}).get("currentUpdate") or {}).get("name"))


def wait_shard(kube: Kube, resource: Resource, name: str, namespace: str, shard: str) -> None:
    wait_until(
        lambda: shard_of(kube.get(resource, name, namespace)) == shard,
        timeout=120,
        what=f"{resource.kind} {name} to carry shard {shard!r}",
    )


def wait_moved(
    controllers: dict[str, ControllerProcess], name: str, before: str, after: str
) -> None:
    wait_until(
        lambda: (
            name in cached_stacks(controllers[after])
            and name not in cached_stacks(controllers[before])
        ),
        timeout=60,
        what=f"{name} to leave the store of shard {before!r} for that of {after!r}",
    )


def test_every_stack_is_reconciled_by_exactly_its_shards_controller(
    controllers: dict[str, ControllerProcess],
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    gates: Path,
) -> None:
    repo = git_repo()
    owners = {f"{shard or 'none'}-{i}": shard for shard in SHARDS for i in range(2)}
    for name, shard in owners.items():
        open_gate(gates, name)
        apply_stack(kube, namespace, name, spec(repo), **shard_labels(shard))
    for name in owners:
        wait_stack(kube, namespace, name, ready, timeout=300)

    for name, shard in owners.items():
        jobs = stack_jobs(kube, namespace, name)
        assert [shard_of(job) for job in jobs] == [shard], name
        result = kube.get(CONFIGMAPS, jobs[0]["metadata"]["name"], namespace)
        assert shard_of(result) == shard
        assert created_events(kube, namespace, name) == 1
    for shard, process in controllers.items():
        mine = {name for name, owner in owners.items() if owner == shard}
        assert cached_stacks(process) == mine, shard or "unlabelled"
        assert operations(process) == len(mine)
    leases, _ = kube.list_objects(LEASES, namespace)
    holders = {lease["metadata"]["name"]: lease["spec"].get("holderIdentity") for lease in leases}
    assert set(holders) == {
        "pkobatch-controller",
        "pkobatch-controller-blue",
        "pkobatch-controller-green",
    }
    assert all(holders.values()), holders


def test_a_stack_relabelled_mid_run_moves_with_its_run_folded_once(
    controllers: dict[str, ControllerProcess],
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    gates: Path,
) -> None:
    repo = git_repo()
    # Each mover's shard before and after its relabel: into a shard, between shards, and
    # out of the shards into the unlabelled share.
    moves = {"to-blue": ("", "blue"), "to-green": ("blue", "green"), "to-none": ("green", "")}
    runs: dict[str, JSON] = {}
    for name, (before, _) in moves.items():
        # destroyOnFinalize: a move mistaken for a deletion would start a destroy.
        apply_stack(
            kube, namespace, name, spec(repo, destroyOnFinalize=True), **shard_labels(before)
        )
    for name, (before, _) in moves.items():
        wait_stack(kube, namespace, name, running, timeout=300)
        jobs = stack_jobs(kube, namespace, name)
        assert [shard_of(job) for job in jobs] == [before]
        runs[name] = jobs[0]

    for name, (_, after) in moves.items():
        kube.merge_patch(
            STACKS,
            name,
            {"metadata": {"labels": {SHARD_LABEL: after or None}}},
            namespace,
        )
    for name, (before, after) in moves.items():
        job_name = runs[name]["metadata"]["name"]
        # The new owner adopted the running Job: relabelled, so its watch sees the Job end.
        wait_shard(kube, JOBS, job_name, namespace, after)
        wait_moved(controllers, name, before, after)
        # The run goes on: nobody cancelled it or started another.
        assert kube.get(JOBS, job_name, namespace)["status"].get("active") == 1

    for name in moves:
        open_gate(gates, name)
    for name, (_, after) in moves.items():
        stack = wait_stack(kube, namespace, name, ready, timeout=300)
        job = runs[name]
        update = last_update(stack)
        assert update["name"] == job["metadata"]["name"]
        assert update["state"] == "succeeded" and update["failures"] == 0
        assert stack["status"]["outputs"] == {"run": job["metadata"]["name"]}
        assert FINALIZER in stack["metadata"]["finalizers"]
        jobs = stack_jobs(kube, namespace, name)
        assert [j["metadata"]["uid"] for j in jobs] == [job["metadata"]["uid"]], name
        # The runner labelled the result with the Job's shard at start; the new owner moved it.
        wait_shard(kube, CONFIGMAPS, job["metadata"]["name"], namespace, after)
        assert created_events(kube, namespace, name) == 1
    # Folded once, each by the Stack's new owner.
    assert {shard: operations(process) for shard, process in controllers.items()} == {
        "blue": 1,
        "green": 1,
        "": 1,
    }
