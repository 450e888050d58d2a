"""Dropping the watch events that echo the controller's own writes (``controller.echoes``) is
safe: deciding again right after a decision's own writes never brings new work.

The fixed point is checked over the planner's cases: every test of ``decide`` and its steps
that drives the unit tier's ``World`` runs again here with each ``World.step`` followed by a
second decision from what the first one's writes left. Two exceptions, both outside what a
dropped echo could hold up: a Stack being deleted (neither its events nor its destroy Job's
creation are ever dropped as echoes) and a decision that asks to be reconciled again at once
(its own requeue brings it back).
The Stack's writes to its prerequisites (a poke) are not its own Stack's writes: left out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import decision_world
import pytest
import test_controller_approval
import test_controller_decide
import test_controller_decide_bounds
import test_controller_decide_flux
import test_controller_decide_program
import test_controller_steps_deletion
import test_controller_steps_history
import test_controller_steps_operation_requests
import test_controller_steps_runs
import test_controller_steps_schedules
import test_controller_steps_settle
import test_controller_steps_source
import test_controller_steps_sync
from decision_world import World

from pkobatch.api.constants import FINALIZER
from pkobatch.controller.decision import Decision
from pkobatch.controller.echoes import job_event_is_echo, stack_update_is_echo

PLANNER_CASES: tuple[ModuleType, ...] = (
    test_controller_decide,
    test_controller_decide_bounds,
    test_controller_decide_flux,
    test_controller_decide_program,
    test_controller_approval,
    test_controller_steps_deletion,
    test_controller_steps_history,
    test_controller_steps_operation_requests,
    test_controller_steps_runs,
    test_controller_steps_schedules,
    test_controller_steps_settle,
    test_controller_steps_source,
    test_controller_steps_sync,
)
# A decision that asks to come back within this many seconds does not rely on an echo.
AT_ONCE = 1.0


def planner_cases() -> list[Any]:
    cases = []
    for module in PLANNER_CASES:
        for name, function in vars(module).items():
            if (
                name.startswith("test_")
                and inspect.isfunction(function)
                and function.__module__ == module.__name__
                and not inspect.signature(function).parameters
            ):
                cases.append(pytest.param(function, id=f"{module.__name__}::{name}"))
    return cases


def new_work(after: Decision, world: World, first: Decision) -> list[str]:
    """What ``after`` would do that ``first``'s writes did not already do."""
    work = []
    if after.create_job is not None:
        work.append(f"create Job {after.create_job['metadata']['name']}")
    if after.finalizer is not None:
        work.append(f"{after.finalizer} the finalizer")
    if after.delete_jobs or after.delete_results or after.create_results:
        work.append("delete or create run objects")
    if after.status is not None and after.status != world.stack.get("status"):
        work.append("write the status")
    repeated = {(e.type, e.reason) for e in first.events}
    work += [f"Event {e.reason}" for e in after.events if (e.type, e.reason) not in repeated]
    return work


@pytest.mark.parametrize("case", planner_cases())
def test_deciding_again_after_a_decisions_own_writes_brings_no_new_work(
    case: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[Decision] = []
    step = World.step

    def step_then_decide_again(world: World) -> Decision:
        first = step(world)
        deleting = "deletionTimestamp" in world.stack["metadata"]
        at_once = first.requeue_after is not None and first.requeue_after <= AT_ONCE
        if not deleting and not at_once:
            after = world.decide()
            assert new_work(after, world, first) == [], (
                f"the echo of {first} would have brought new work"
            )
            checked.append(first)
        return first

    monkeypatch.setattr(decision_world.World, "step", step_then_decide_again)
    case()
    # Only cases with no World, or whose every step is after the Stack's deletion, check none.
    source = inspect.getsource(case)
    assert checked or "World" not in source or "delete(world)" in source


def stack(version: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "app",
            "namespace": "team",
            "resourceVersion": version,
            "generation": 1,
            "finalizers": [FINALIZER],
            "annotations": {},
            **meta,
        },
        "spec": {"stack": "dev"},
    }


def test_the_update_of_a_version_the_controller_replaced_is_an_echo() -> None:
    # The finalizer and status writes change neither generation nor what asks for work.
    assert stack_update_is_echo(stack("5", finalizers=[]), stack("6"), replaced=["5", "6"])
    assert stack_update_is_echo(stack("6"), stack("7"), replaced=["5", "6"])


@pytest.mark.parametrize(
    "change",
    [
        {"generation": 2},
        {"deletionTimestamp": "2026-01-01T00:00:00Z"},
        {"labels": {"shard": "b"}},
        {"annotations": {"pulumi.com/reconciliation-request": "now"}},
        {"annotations": {"pkobatch.io/approve": "plan-1"}},
        {"finalizers": [FINALIZER, "someone.else/finalizer"]},
    ],
)
def test_a_written_version_that_also_asks_for_work_is_news(change: dict[str, Any]) -> None:
    assert not stack_update_is_echo(stack("6"), stack("7", **change), replaced=["6"])


def test_no_event_of_a_stack_being_deleted_is_an_echo() -> None:
    deleting = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    assert not stack_update_is_echo(stack("6", **deleting), stack("7", **deleting), ["6"])


def test_a_version_the_controller_did_not_replace_and_a_new_or_gone_stack_are_news() -> None:
    assert not stack_update_is_echo(stack("6"), stack("7"), replaced=["5"])
    assert not stack_update_is_echo(None, stack("7"), replaced=["6"])
    assert not stack_update_is_echo(stack("7"), None, replaced=["7"])
    # Annotations that ask for nothing may change in an echo (the cache keeps none anyway).
    assert stack_update_is_echo(stack("6"), stack("7", annotations={"note": "x"}), ["6"])


def test_a_job_event_is_an_echo_only_for_its_own_creation_or_no_change() -> None:
    job = {"metadata": {"name": "app-up-1", "resourceVersion": "1"}, "status": {}}
    moved = {"metadata": {"name": "app-up-1", "resourceVersion": "2"}, "status": {}}
    started = {"metadata": {"name": "app-up-1", "resourceVersion": "3"}, "status": {"active": 1}}
    assert job_event_is_echo(None, job, created=True)
    assert not job_event_is_echo(None, job, created=False)
    assert job_event_is_echo(job, moved, created=False)
    assert not job_event_is_echo(moved, started, created=True)
    assert not job_event_is_echo(job, None, created=True)
