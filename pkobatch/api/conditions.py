"""The ready protocol: Ready / Reconciling / Stalled with PKO's (kstatus) semantics.

- In progress: Ready=False (NotReadyInProgress), Reconciling=True (reason given); Stalled
  removed.
- Stalled: Ready=False (NotReadyStalled), Stalled=True (reason given); Reconciling removed.
- Done: Ready=True (ProcessingCompleted); Reconciling and Stalled removed.

Conditions of other types (e.g. pkobatch's Drifted) are kept as they are. Messages are
bounded (``pkobatch.api.messages``). Like
``meta.SetStatusCondition``, ``lastTransitionTime`` only moves when the status changes.
All functions are pure: they return a new list and take ``now`` from the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final, Literal

from pkobatch.api.constants import (
    CONDITION_READY,
    CONDITION_RECONCILING,
    CONDITION_STALLED,
    NOT_READY_IN_PROGRESS_REASON,
    NOT_READY_STALLED_REASON,
    READY_COMPLETED_REASON,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.stack.status import Condition

READY_MESSAGE: Final = "the stack has been processed and is up to date"
IN_PROGRESS_MESSAGE: Final = "reconciliation is in progress"
STALLED_MESSAGE: Final = "reconciliation is stalled"

ConditionStatus = Literal["True", "False", "Unknown"]


def find_condition(conditions: Sequence[Condition], condition_type: str) -> Condition | None:
    return next((c for c in conditions if c.type == condition_type), None)


def set_condition(
    conditions: Sequence[Condition],
    condition_type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Add or replace one condition; keep its transition time if the status is unchanged."""
    previous = find_condition(conditions, condition_type)
    transition = (
        previous.last_transition_time if previous is not None and previous.status == status else now
    )
    updated = Condition(
        type=condition_type,
        status=status,
        reason=reason,
        message=bound_message(message),
        last_transition_time=transition,
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == condition_type else c for c in conditions]


def remove_condition(conditions: Sequence[Condition], condition_type: str) -> list[Condition]:
    return [c for c in conditions if c.type != condition_type]


def mark_reconciling(
    conditions: Sequence[Condition],
    reason: str,
    message: str,
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Work is in progress (or a retry/prerequisite is pending)."""
    return _mark_not_ready(
        conditions,
        NOT_READY_IN_PROGRESS_REASON,
        IN_PROGRESS_MESSAGE,
        raised=CONDITION_RECONCILING,
        cleared=CONDITION_STALLED,
        reason=reason,
        message=message,
        now=now,
        observed_generation=observed_generation,
    )


def mark_stalled(
    conditions: Sequence[Condition],
    reason: str,
    message: str,
    *,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Nothing more happens until the user changes something."""
    return _mark_not_ready(
        conditions,
        NOT_READY_STALLED_REASON,
        STALLED_MESSAGE,
        raised=CONDITION_STALLED,
        cleared=CONDITION_RECONCILING,
        reason=reason,
        message=message,
        now=now,
        observed_generation=observed_generation,
    )


def _mark_not_ready(
    conditions: Sequence[Condition],
    ready_reason: str,
    ready_message: str,
    *,
    raised: str,
    cleared: str,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None,
) -> list[Condition]:
    """Ready=False, ``raised``=True with the caller's reason, ``cleared`` removed: the
    Reconciling and Stalled states differ only in which of the two is raised."""
    result = set_condition(
        conditions,
        CONDITION_READY,
        "False",
        ready_reason,
        ready_message,
        now=now,
        observed_generation=observed_generation,
    )
    result = set_condition(
        result, raised, "True", reason, message, now=now, observed_generation=observed_generation
    )
    return remove_condition(result, cleared)


def mark_ready(
    conditions: Sequence[Condition],
    *,
    now: datetime,
    observed_generation: int | None = None,
    message: str = READY_MESSAGE,
) -> list[Condition]:
    """The last run succeeded and the stack is up to date."""
    result = set_condition(
        conditions,
        CONDITION_READY,
        "True",
        READY_COMPLETED_REASON,
        message,
        now=now,
        observed_generation=observed_generation,
    )
    result = remove_condition(result, CONDITION_RECONCILING)
    return remove_condition(result, CONDITION_STALLED)
