"""When a Stack runs again by itself, and what it shows meanwhile: retry timing (pure).

Everything about re-running lives here, kept as PKO v2.9 does it:

- ``sync_decision`` — PKO's ``isSynced``: the normal operation runs for the first time, for
  a new generation, a new reconcile request, a new commit (``same_commit``), when the
  resync period (``resync_frequency``, at least 60 s, ``continueResyncOnCommitMatch``)
  elapsed, or once the backoff after a failure elapsed; else it says when to look again;
- ``cooldown`` — after a failure wait ``base · 3^failures`` (base 10 s,
  ``Settings.retry.base``), capped (``backoff_cap``) at ``spec.retryMaxBackoffDurationSeconds``
  when it is positive, else ``Settings.retry.cap`` (PKO's 24 h). As PKO's ``wait.Backoff``
  does, the cap applies from the second wait on: the first wait is always ``base``, even
  under a lower cap. ``cooldown_remaining`` counts it from the last run's end;
- ``same_attempt_key`` — failures count for the same generation and reconcile request (a
  new commit does not reset the count); ``fold.folded_last_update`` counts them;
- ``resting_state`` — with no run due: Ready after a success, Reconciling while retrying,
  Stalled after ``Settings.retry.max_failures`` (3) counted failures or a failure a retry
  cannot fix (``permanent_failure``).

The knobs are ``config.RetrySettings`` (``PKOBATCH_RETRY__*``). Elsewhere: cron schedules
(``spec.schedule``, drift checks) in ``schedule.py``; how a finished run becomes status in
``fold.py``; the order of the whole decision in ``decide.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from pkobatch.api.constants import (
    PERMANENT_RESULT_REASONS,
    PKO_MIN_RESYNC_SECONDS,
    RECONCILE_REQUEST_ANNOTATION,
    RECONCILING_PREVIEW_FAILED_REASON,
    RECONCILING_RETRY_REASON,
    STALLED_UPDATE_FAILED_REASON,
)
from pkobatch.api.run import Run
from pkobatch.api.stack.base import MAX_SPEC_SECONDS
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.status import LastUpdate
from pkobatch.api.timestamps import parse_time
from pkobatch.config import Settings

MIN_RESYNC: Final = timedelta(seconds=PKO_MIN_RESYNC_SECONDS)
# 3^40 seconds is far beyond any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT: Final = 40
_ABBREVIATED_SHA: Final = re.compile(r"[0-9a-f]{7,40}")


def _spec_seconds(value: int | None) -> int:
    """A seconds field of the spec, clamped to the CRD's bounds (objects stored before the
    bounds existed may hold anything)."""
    return max(-MAX_SPEC_SECONDS, min(value or 0, MAX_SPEC_SECONDS))


def resync_frequency(spec: StackSpec) -> timedelta:
    return max(MIN_RESYNC, timedelta(seconds=_spec_seconds(spec.resync_frequency_seconds)))


def backoff_cap(spec: StackSpec, settings: Settings) -> timedelta:
    """PKO: a positive ``retryMaxBackoffDurationSeconds`` replaces the default cap; zero and
    negative values are ignored."""
    seconds = _spec_seconds(spec.retry_max_backoff_duration_seconds)
    return timedelta(seconds=seconds) if seconds > 0 else settings.retry.cap


def cooldown(failures: int, spec: StackSpec, settings: Settings) -> timedelta:
    """How long to wait after a failed run before retrying it (PKO's ``cooldown``)."""
    base = settings.retry.base.total_seconds()
    if failures <= 0:
        return timedelta(seconds=base)
    exponent = min(failures, _MAX_EXPONENT)
    return timedelta(seconds=min(base * 3.0**exponent, backoff_cap(spec, settings).total_seconds()))


def failure_count(last: LastUpdate) -> int:
    """Counted consecutive failures of the last run (0 after a success)."""
    return int(last.get("failures") or 0)


def cooldown_remaining(
    last: LastUpdate, spec: StackSpec, settings: Settings, now: datetime
) -> timedelta:
    """What is left of the wait after the failed ``last`` run (zero or less: retry now)."""
    resynced = parse_time(last.get("lastResyncTime")) or now
    return resynced + cooldown(failure_count(last), spec, settings) - now


def same_attempt_key(previous: Mapping[str, Any], run: Run) -> bool:
    """PKO counts failures for the same generation and reconcile request."""
    return (
        previous.get("generation") == run.generation
        and (previous.get("reconcileRequest") or "") == run.reconcile_request
    )


def permanent_failure(last: LastUpdate) -> bool:
    """The last run failed for a reason a retry cannot fix (e.g. a missing language host)."""
    return last.get("state") == "failed" and last.get("reason") in PERMANENT_RESULT_REASONS


def same_commit(first: str, second: str) -> bool:
    """Equal revisions; an abbreviated SHA (spec.commit) matches its full form. Other
    revisions (a Program's generation, a Flux artifact revision) match only exactly:
    generation 1 is not generation 12."""
    if first == second:
        return True
    shorter, longer = sorted((first, second), key=len)
    return (
        bool(_ABBREVIATED_SHA.fullmatch(shorter))
        and bool(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", longer))
        and longer.startswith(shorter)
    )


@dataclass(frozen=True)
class SyncDecision:
    """Why the normal operation must run now (``reason``), or None: it is in sync, and
    ``recheck`` says when the resync period or a failure's backoff ends, if one runs."""

    reason: str | None
    recheck: timedelta | None = None


def sync_decision(
    last: LastUpdate,
    spec: StackSpec,
    *,
    generation: int,
    reconcile_request: str,
    commit: str | None,
    now: datetime,
    settings: Settings,
) -> SyncDecision:
    """PKO's ``isSynced`` for a Stack whose last run is ``last``."""
    if not last:
        return SyncDecision("initial stack update")
    if last.get("generation") != generation:
        return SyncDecision("new generation")
    if (last.get("reconcileRequest") or "") != reconcile_request:
        return SyncDecision(f"new {RECONCILE_REQUEST_ANNOTATION} value")
    if last.get("state") == "succeeded":
        if commit is not None and not same_commit(
            str(last.get("lastSuccessfulCommit") or ""), commit
        ):
            return SyncDecision(f"new commit {commit}")
        if spec.continue_resync_on_commit_match:
            due = (parse_time(last.get("lastResyncTime")) or now) + resync_frequency(spec)
            if now >= due:
                return SyncDecision("resync period elapsed")
            return SyncDecision(None, recheck=due - now)
        return SyncDecision(None)
    if commit is not None and not same_commit(str(last.get("lastAttemptedCommit") or ""), commit):
        return SyncDecision(f"new commit {commit}")
    if failure_count(last) >= settings.retry.max_failures or permanent_failure(last):
        return SyncDecision(None)
    wait = cooldown_remaining(last, spec, settings, now)
    if wait <= timedelta(0):
        return SyncDecision("retrying after failure")
    return SyncDecision(None, recheck=wait)


@dataclass(frozen=True)
class Resting:
    """The conditions of a Stack with no run due: Ready, retrying (a Reconciling reason),
    or Stalled (a Stalled reason), with the message to show."""

    kind: Literal["ready", "retrying", "stalled"]
    reason: str = ""
    message: str = ""


def resting_state(last: LastUpdate, settings: Settings) -> Resting:
    """What a Stack shows while no run is needed right now (PKO's ready protocol)."""
    if last.get("state") == "succeeded":
        return Resting("ready")
    failures = failure_count(last)
    kind = str(last.get("type") or "update")
    if permanent_failure(last):
        return Resting(
            "stalled",
            PERMANENT_RESULT_REASONS[str(last.get("reason"))],
            f"{kind} failed and retrying cannot help; not retrying until the spec, the "
            f"source or {RECONCILE_REQUEST_ANNOTATION} changes. Error: {last.get('message')}",
        )
    if failures >= settings.retry.max_failures:
        return Resting(
            "stalled",
            STALLED_UPDATE_FAILED_REASON,
            f"{kind} failed {failures + 1} times in a row; not retrying until the spec, the "
            f"source or {RECONCILE_REQUEST_ANNOTATION} changes. Last error: "
            f"{last.get('message')}",
        )
    reason = RECONCILING_PREVIEW_FAILED_REASON if kind == "preview" else RECONCILING_RETRY_REASON
    return Resting(
        "retrying",
        reason,
        f"{failures + 1} {kind} failure(s); retrying with backoff. "
        f"Last error: {last.get('message')}",
    )
