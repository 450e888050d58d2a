"""The reconcile's decision: observed objects in, a ``Decision`` out (pure).

``decide(observed, settings, template)`` reads one Stack with its Jobs and result ConfigMaps
(and the polled branch head, its prerequisites, whether a run slot is free) and returns a
``Decision`` (``controller.decision``): the complete desired status, at most one Job to
create, Jobs to delete, the finalizer change, Events, prerequisite pokes, and when to look
again. It never blocks and never does I/O, so every rule has unit tests.

This module is the skeleton, in the manner of Flux's reconcilers: the finalizer, the
steps every pass takes, then either deletion or the ordered ``RECONCILE_STEPS``, then
history. The order is the order of priority. Each step is a function of
``controller.steps`` with its contract in its docstring; the ordered ones return NEXT,
DONE (the later ones do not run) or ``Refold`` (``steps.draft``):

1. ``steps.notes``: the generation observed, the spec's notes, refused annotations.
2. ``steps.settle.settle_current``: fold a finished or vanished current run, adopt an
   orphaned Job.
3. ``steps.deletion.deletion`` (a Stack being deleted, instead of 4 to 12).
4. ``steps.operation_requests.operation_request``: operation requests and cancel.
5. ``steps.runs.one_run_at_a_time``.
6. ``steps.sync.valid_spec``.
7. ``steps.runs.run_allowed``: may a Job of this Stack be created at all.
8. ``steps.sync.suspend``.
9. ``steps.source.source``: the revision to deploy.
10. ``steps.sync.destroy_hold``: the hold after a requested destroy.
11. ``steps.sync.sync``: PKO's ``isSynced``, prerequisites, ``spec.schedule`` runs, and
    approval of saved update plans (``steps.saved_plans``).
12. ``steps.schedules.schedules``: drift remediation and drift checks.
13. ``steps.history.prune_history``: old Jobs and orphaned results.

Job names are deterministic per decision, so when a Job with the name a step would create
already exists and has finished (its result was never folded), the step returns
``Refold(job)``: the skeleton folds that Job instead of starting another run — or, when its
pods were not observed (the observer reads them for the current run only), makes it the
current run, to be folded by the next reconcile — and decides again (at most three times).

The rules the steps apply live with what they are about: how a run ended in ``outcome.py``;
how a finished run becomes status in ``fold.py``; the rules of saved update plans in
``approval.py``; when a Stack runs again in ``retry.py``; cron schedules in ``schedule.py``;
the Job for a run in ``job_builder.py``; the operation-request protocol in
``pkobatch.api.operation_request``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from pkobatch.api.conditions import find_condition, mark_stalled
from pkobatch.api.constants import (
    CONDITION_STALLED,
    FINALIZER,
    RECONCILE_REQUEST_ANNOTATION,
    STALLED_RECONCILE_ERROR_REASON,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.status import StatusObject
from pkobatch.config import Settings
from pkobatch.controller.decision import Decision, Observed, PodCheck
from pkobatch.controller.outcome import Event
from pkobatch.controller.steps import (
    deletion,
    history,
    notes,
    operation_requests,
    runs,
    schedules,
    settle,
    source,
    sync,
)
from pkobatch.controller.steps.draft import (
    DONE,
    NEXT,
    Draft,
    Refold,
    StepResult,
    parse_conditions,
    truncated,
)

Step = Callable[[Draft], StepResult]

# The steps for a Stack that is not being deleted, in order (see the module docstring).
RECONCILE_STEPS: Final[tuple[Step, ...]] = (
    operation_requests.operation_request,
    runs.one_run_at_a_time,
    sync.valid_spec,
    runs.run_allowed,
    sync.suspend,
    source.source,
    sync.destroy_hold,
    sync.sync,
    schedules.schedules,
)
DELETION_STEPS: Final[tuple[Step, ...]] = (deletion.deletion,)
# How often a pass may meet a finished Job of the name it would create (and fold it).
MAX_REFOLDS: Final = 3


def decide(observed: Observed, settings: Settings, template: Mapping[str, Any]) -> Decision:
    """The decision for one Stack. Never raises: a bug met while deciding for one Stack
    becomes ``Stalled/ReconcileError`` with the error on that Stack (and ``Decision.error``),
    instead of a reconcile that fails and is retried forever."""
    try:
        return _decide(observed, settings, template)
    except Exception as exc:
        return _error_decision(observed, exc)


def _decide(observed: Observed, settings: Settings, template: Mapping[str, Any]) -> Decision:
    draft = Draft(observed, settings, template)
    deleting = bool(draft.meta.get("deletionTimestamp"))
    finalizers = draft.meta.get("finalizers") or []
    if deleting and FINALIZER not in finalizers:
        return Decision(status=None)
    if not deleting and FINALIZER not in finalizers:
        draft.decision.finalizer = "add"
    notes.observe_generation(draft)
    notes.ignored_fields(draft)
    notes.refused_annotations(draft)
    settle.settle_current(draft)
    steps = DELETION_STEPS if deleting else RECONCILE_STEPS
    for _ in range(MAX_REFOLDS):
        outcome = _run_steps(draft, steps)
        if not isinstance(outcome, Refold) or not settle.fold_job(draft, outcome.job):
            break
    history.prune_history(draft)
    draft.status["conditions"] = [c.to_manifest() for c in draft.conditions]
    if not draft.status["conditions"]:
        del draft.status["conditions"]
    decision = draft.decision
    if decision.status is not None:
        decision.status = draft.status
    decision.decided_status = draft.status
    decision.requeue_after, decision.pod_check = _requeue(draft)
    return decision


def _requeue(draft: Draft) -> tuple[float | None, PodCheck | None]:
    """When to come back, and whether that is only to look at one Job's pod."""
    checks = sorted(draft.pod_checks, key=lambda check: check[1])
    asked = [*draft.requeue, *(seconds for _, seconds in checks)]
    requeue = max(1.0, min(asked)) if asked else None
    if not checks:
        return requeue, None
    job = checks[0][0]
    rest = [*draft.requeue, *(seconds for name, seconds in checks if name != job)]
    otherwise = max(1.0, min(rest)) if rest else None
    if otherwise is not None and otherwise <= checks[0][1]:
        return requeue, None
    return requeue, PodCheck(job, otherwise)


def _run_steps(draft: Draft, steps: tuple[Step, ...]) -> StepResult:
    """Run ``steps`` in order until one decides (DONE) or meets a finished Job (Refold)."""
    for step in steps:
        outcome = step(draft)
        if outcome != NEXT:
            return outcome
    return DONE


def _error_decision(observed: Observed, exc: Exception) -> Decision:
    meta: Mapping[str, Any] = observed.stack.get("metadata") or {}
    error = bound_message(f"{type(exc).__name__}: {exc}")
    if meta.get("deletionTimestamp") and FINALIZER not in (meta.get("finalizers") or ()):
        return Decision(status=None, error=error)
    message = bound_message(
        f"pkobatch could not plan this Stack ({error}). This is a pkobatch bug: please report "
        f"it with this message. Editing the spec or setting {RECONCILE_REQUEST_ANNOTATION} "
        "makes the controller try again."
    )
    status = cast(StatusObject, copy.deepcopy(dict(observed.stack.get("status") or {})))
    raw_generation = meta.get("generation")
    generation = raw_generation if isinstance(raw_generation, int) else 0
    status["observedGeneration"] = generation
    conditions = parse_conditions(status.get("conditions"))
    previous = find_condition(conditions, CONDITION_STALLED)
    conditions = mark_stalled(
        conditions,
        STALLED_RECONCILE_ERROR_REASON,
        message,
        now=truncated(observed.now),
        observed_generation=generation,
    )
    status["conditions"] = [c.to_manifest() for c in conditions]
    events = []
    if previous is None or previous.reason != STALLED_RECONCILE_ERROR_REASON:
        events.append(Event("Warning", STALLED_RECONCILE_ERROR_REASON, message))
    return Decision(status=status, events=events, error=error)
