"""Dropping the watch events that echo the controller's own writes, and those that record a
run's start (``controller.echoes``), is safe: deciding again right after a decision's own
writes, or after its Job's pod started, never brings new work, nor needs to come back
sooner than the decision before asked.

The fixed point is checked over the planner's cases: every test of ``decide`` and its steps
that drives the unit tier's ``World`` runs again here with each ``World.step`` followed by a
second decision from what the first one's writes left. Two exceptions, both outside what a
dropped echo could hold up: a Stack being deleted (neither its events nor its destroy Job's
creation are ever dropped as echoes) and a decision that asks to be reconciled again at once
(its own requeue brings it back).
The Stack's writes to its prerequisites (a poke) are not its own Stack's writes: left out.

After every step, each start the Job controller can record for an unfinished Job (its pod
created, ready: ``echoes.JOB_START_FIELDS`` set) is checked the same way: deciding with it
brings nothing that deciding without it does not, and no earlier recheck. And when the
start shows the pod ready, a look at that pod the decision asked for is moot: deciding with
the start asks for none, nor for a recheck before what the decision asked otherwise
(``Decision.pod_check``), so the shell may drop that wake-up (``reconcile.PodChecks``).
A decision reads those fields only for whether they are set, so setting them to 1 covers
every value.
"""

from __future__ import annotations

import copy
import inspect
import itertools
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
from pkobatch.api.objects import job_finished
from pkobatch.controller.cache_transforms import cache_job
from pkobatch.controller.decision import Decision
from pkobatch.controller.echoes import (
    JOB_START_FIELDS,
    job_event_is_echo,
    job_started,
    stack_update_is_echo,
)
from pkobatch.controller.outcome import job_pod_ready

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


def sooner(after: Decision, before: Decision) -> str | None:
    """Why ``after`` would need a reconcile before the one ``before`` asked for, if it does:
    dropping the event ``after`` is decided on would lose it. A Job ``before`` deletes
    brings the Stack back anyway: its deletion is never dropped."""
    if after.requeue_after is None or before.delete_jobs:
        return None
    if before.requeue_after is None or before.requeue_after > after.requeue_after:
        return f"a recheck in {after.requeue_after}s, where {before.requeue_after} was asked"
    return None


def the_work(decision: Decision) -> tuple[Any, ...]:
    """Everything a decision would do, for comparing two of them."""
    return (
        (decision.create_job or {}).get("metadata", {}).get("name"),
        decision.finalizer,
        decision.delete_jobs,
        decision.delete_results,
        [c["metadata"]["name"] for c in decision.create_results],
        decision.decided_status,
        [(e.type, e.reason, e.message) for e in decision.events],
    )


def starts(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every status the Job controller can record next as ``job``'s pod starts: any of
    ``JOB_START_FIELDS`` that are not set yet, set (a running Job only; ready pods are
    active ones)."""
    if job_finished(job) or "deletionTimestamp" in job["metadata"]:
        return []
    status = job.get("status") or {}
    unset = [f for f in JOB_START_FIELDS if not status.get(f)]
    value = {"startTime": "2026-01-01T12:00:00Z", "active": 1, "ready": 1}
    candidates = (
        {**status, **{f: value[f] for f in fields}}
        for size in range(1, len(unset) + 1)
        for fields in itertools.combinations(unset, size)
    )
    return [c for c in candidates if c.get("active") or not c.get("ready")]


def moot_look_is_not_needed(
    without: Decision, with_start: Decision, name: str, job: dict[str, Any]
) -> str | None:
    """Why ``without``'s look at Job ``name``'s pod would be needed although the Job shows
    its pod ready (``with_start``), if it would: the shell then drops that wake-up and keeps
    only ``pod_check.otherwise`` (``reconcile.PodChecks``)."""
    check = without.pod_check
    if check is None or check.job != name or not job_pod_ready(job):
        return None
    if with_start.pod_check is not None and with_start.pod_check.job == name:
        return f"the ready Job {name} still asks a look at its pod"
    if with_start.requeue_after is not None and (
        check.otherwise is None or with_start.requeue_after < check.otherwise
    ):
        return f"a recheck in {with_start.requeue_after}s, where {check.otherwise} is kept"
    return None


def check_starts(world: World) -> int:
    """Each start of each of the world's Jobs brings no new work nor an earlier recheck;
    the number of starts checked."""
    without = world.decide()
    checked = 0
    for name in list(world.jobs):
        job = world.jobs[name]
        for started in starts(job):
            world.jobs[name] = {**job, "status": started}
            assert job_started(cache_job(copy.deepcopy(job)), cache_job(world.jobs[name]))
            with_start = world.decide()
            world.jobs[name] = job
            assert the_work(with_start) == the_work(without), (
                f"the start {started} of {name} would have brought new work"
            )
            assert sooner(with_start, without) is None, (
                f"the start {started} of {name} needs {sooner(with_start, without)}"
            )
            started_job = {**job, "status": started}
            assert moot_look_is_not_needed(without, with_start, name, started_job) is None
            checked += 1
    return checked


@pytest.mark.parametrize("case", planner_cases())
def test_deciding_again_after_a_decisions_own_writes_brings_no_new_work(
    case: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[Decision] = []
    starts_checked: list[int] = []
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
            assert sooner(after, first) is None, (
                f"at {world.now}, the echo of a decision needs {sooner(after, first)}"
            )
            checked.append(first)
        if not at_once:
            starts_checked.append(check_starts(world))
        if first.create_job is not None and not at_once:
            assert starts_checked[-1], "the start of the Job just created was not checked"
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


def running_job(version: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "app-up-1", "resourceVersion": version}, "status": status}


def test_the_record_of_a_runs_start_wakes_nothing() -> None:
    created = running_job("1")
    pod_created = running_job("2", startTime="2026-01-01T12:00:00Z", active=1, terminating=0)
    ready = running_job("3", startTime="2026-01-01T12:00:00Z", active=1, ready=1)
    assert job_started(created, pod_created)
    assert job_started(pod_created, ready)
    assert job_started(created, ready)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"active": 1, "ready": 1}, {"active": 1}),  # a ready pod no more
        ({"active": 1}, {"active": 2}),  # another pod
        ({"active": 1}, {"active": 1, "failed": 1}),
        ({"active": 1}, {"active": 0, "succeeded": 1}),
        ({}, {"ready": 1}),  # ready but not active: never recorded
        ({"startTime": "2026-01-01T12:00:00Z"}, {"startTime": "2026-01-01T12:05:00Z"}),
        ({"active": 1}, {"active": 1, "conditions": [{"type": "Failed", "status": "True"}]}),
    ],
)
def test_anything_but_a_runs_start_is_news(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert not job_started(running_job("1", **before), running_job("2", **after))


def test_a_start_of_a_job_being_deleted_or_with_other_changes_is_news() -> None:
    created = running_job("1")
    deleting = running_job("2", active=1)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    relabelled = running_job("2", active=1)
    relabelled["metadata"]["labels"] = {"pkobatch.io/shard": "b"}
    assert not job_started(created, deleting)
    assert not job_started(created, relabelled)
    assert not job_started(None, created) and not job_started(created, None)
