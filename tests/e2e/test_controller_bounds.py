"""Issue 26, items 3 and 5, end to end: a typo in ``pkobatch.io/abandon`` never skips the
destroy on deletion, and prerequisite cycles are named in status and recovered from, with
real Pulumi runs of the test program (tests/helpers/controller_harness.py: the controller as a
process under the RBAC of deploy/kustomize/base).

Each Stack has a Pulumi stack and a directory of its own, so their runs never meet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    ready,
    stack_jobs,
    stack_spec,
    wait_events,
    wait_stack,
)

from pkobatch.api.constants import ABANDON_ANNOTATION
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import EVENTS, STACKS, Kube

JSON = dict[str, Any]


def own_spec(repo: Any, pulumi_env: Any, name: str, **extra: Any) -> JSON:
    """The test program as Pulumi stack ``name``, writing its files under ``<files_dir>/name``."""
    spec = stack_spec(repo, pulumi_env, **extra)
    spec["stack"] = name
    spec["config"]["directory"] = str(pulumi_env.files_dir / name)
    return spec


def wait_gone(kube: Kube, namespace: str, name: str) -> None:
    wait_until(
        lambda: kube.get_or_none(STACKS, name, namespace) is None,
        timeout=300,
        what=f"Stack {name} to be destroyed and deleted",
    )


def test_an_abandon_typo_still_destroys_on_deletion(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    typos = {"said-no": "no", "said-zero": "0"}
    for name, typo in typos.items():
        spec = own_spec(repo, pulumi_env, name, destroyOnFinalize=True)
        apply_stack(kube, namespace, name, spec, annotations={ABANDON_ANNOTATION: typo})
    for name in typos:
        wait_stack(kube, namespace, name, ready)
        assert len(list((pulumi_env.files_dir / name).iterdir())) == 2

    for name in typos:
        kube.delete(STACKS, name, namespace)
    for name in typos:
        wait_gone(kube, namespace, name)
        assert list((pulumi_env.files_dir / name).iterdir()) == []
    destroyed = wait_events(
        kube, namespace, lambda e: e["reason"] == "StackDestroyed", count=len(typos)
    )
    assert {e["regarding"]["name"] for e in destroyed} == set(typos)
    refused = wait_events(
        kube,
        namespace,
        lambda e: e["reason"] == "AnnotationRefused" and e["type"] == "Warning",
        count=len(typos),
    )
    for event in refused:
        typo = typos[event["regarding"]["name"]]
        assert f"{ABANDON_ANNOTATION}: {typo!r} is not true or false" in event["note"]
    events = kube.list_objects(EVENTS, namespace)[0]
    assert [e for e in events if e["reason"] == "FinalizerAbandoned"] == []


def stalled_on_cycle(stack: JSON) -> bool:
    return condition(stack, "Stalled").get("reason") == "PrerequisiteCycle"


def test_prerequisite_cycles_are_named_and_breaking_them_recovers_every_stack(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    needs = {"web": ["db"], "db": ["web"], "solo": ["solo"]}
    for name, prerequisites in needs.items():
        spec = own_spec(repo, pulumi_env, name, prerequisites=[{"name": p} for p in prerequisites])
        apply_stack(kube, namespace, name, spec)
    cycles = {"web": "web -> db -> web", "db": "db -> web -> db", "solo": "solo -> solo"}
    for name, cycle in cycles.items():
        stack = wait_stack(kube, namespace, name, stalled_on_cycle, timeout=120)
        message = condition(stack, "Stalled")["message"]
        assert f"spec.prerequisites form a cycle: {cycle};" in message
        assert condition(stack, "Ready")["status"] == "False"
        assert not condition(stack, "Reconciling")
        assert stack_jobs(kube, namespace, name) == []

    # Break both: db no longer needs web, solo no longer needs itself. web still needs db.
    apply_stack(kube, namespace, "db", own_spec(repo, pulumi_env, "db"))
    apply_stack(kube, namespace, "solo", own_spec(repo, pulumi_env, "solo"))
    for name in needs:
        stack = wait_stack(kube, namespace, name, ready, timeout=600)
        assert not condition(stack, "Stalled")
        assert len(list((pulumi_env.files_dir / name).iterdir())) == 2
