"""Deletion: destroy on finalize, then release the finalizer.

``pkobatch.io/abandon: "true"`` drops the finalizer (any other value is refused, so the
destroy runs). Otherwise wait for a running Job, then remove the finalizer at once — unless
``destroyOnFinalize`` (and not ``preview``) asks for a destroy first, retried with PKO's
backoff; the finalizer goes only after a destroy that succeeded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from pkobatch.api.annotations import accepted
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    EVENT_CONFIG_INVALID,
    RECONCILE_REQUEST_ANNOTATION,
    RECONCILING_PROCESSING_REASON,
    RECONCILING_RETRY_REASON,
    STALLED_NAMESPACE_TERMINATING_REASON,
    STALLED_SPEC_INVALID_REASON,
    STALLED_UPDATE_FAILED_REASON,
)
from pkobatch.api.run import Run
from pkobatch.api.status import last_update
from pkobatch.controller.retry import cooldown_remaining, failure_count
from pkobatch.controller.steps.draft import DONE, Draft, Refold, StepResult
from pkobatch.controller.steps.operation_requests import reject_request_while_deleting
from pkobatch.controller.steps.runs import start_run

# How often to look again while the Stack's namespace is terminating (no event of its own).
NAMESPACE_RECHECK: Final = 30.0
EVENT_DESTROYED: Final = "StackDestroyed"
EVENT_ABANDONED: Final = "FinalizerAbandoned"


def deletion(draft: Draft) -> StepResult:
    """The whole decision for a Stack being deleted (its finalizer still on): DONE, or
    Refold when the destroy's Job has finished already. Releases the finalizer on
    ``pkobatch.io/abandon: "true"``, once no run is active and no destroy is asked, or after
    a destroy that succeeded; else starts the destroy, or says why it cannot."""
    # Only `true` abandons: any other value (a typo) is refused and the destroy runs.
    if accepted(draft.obs.stack, ABANDON_ANNOTATION) == "true":
        draft.decision.finalizer = "remove"
        draft.decision.status = None
        draft.event(
            "Warning",
            EVENT_ABANDONED,
            f"finalizer removed on request ({ABANDON_ANNOTATION}); no destroy was run and "
            "the stack's resources were left in place",
        )
        return DONE
    reject_request_while_deleting(draft)
    blocking = draft.blocking_job()
    if blocking is not None:
        draft.reconciling(
            RECONCILING_PROCESSING_REASON,
            f"waiting for run {blocking['metadata']['name']} to finish before deletion",
        )
        return DONE
    raw_spec = draft.obs.stack.get("spec") or {}
    destroy = bool(raw_spec.get("destroyOnFinalize") or raw_spec.get("destroyOnDelete"))
    last = last_update(draft.status)
    if not destroy or raw_spec.get("preview"):
        _release(draft)
        return DONE
    if last.get("type") == "destroy" and last.get("state") == "succeeded":
        draft.event("Normal", EVENT_DESTROYED, f"the stack was destroyed by {last.get('name')}")
        _release(draft)
        return DONE
    if draft.spec is None:
        draft.stalled(
            STALLED_SPEC_INVALID_REASON,
            "cannot run the destroy on deletion: "
            + "; ".join(draft.check.problems)
            + f"; fix the spec, or set the annotation {ABANDON_ANNOTATION}=true to delete "
            "the Stack without destroying its resources",
            EVENT_CONFIG_INVALID,
        )
        return DONE
    if draft.obs.namespace_terminating:
        draft.stalled(
            STALLED_NAMESPACE_TERMINATING_REASON,
            f"namespace {draft.namespace} is being deleted, so the destroy Job cannot start. "
            f"Recovery: destroy the resources yourself (pulumi destroy --stack "
            f"{draft.spec.stack}), then run `kubectl annotate stack {draft.name} -n "
            f"{draft.namespace} {ABANDON_ANNOTATION}=true` to release the finalizer",
        )
        draft.requeue_in(NAMESPACE_RECHECK)
        return DONE
    if (
        last.get("type") == "destroy"
        and last.get("state") == "failed"
        and last.get("generation") == draft.generation
        and (last.get("reconcileRequest") or "") == draft.request
    ):
        failures = failure_count(last)
        if failures >= draft.settings.retry.max_failures:
            draft.stalled(
                STALLED_UPDATE_FAILED_REASON,
                f"destroy failed {failures + 1} times; the finalizer stays so the "
                f"resources are not orphaned. Last error: {last.get('message')}. Fix the "
                f"cause and set {RECONCILE_REQUEST_ANNOTATION} to retry, or set "
                f"{ABANDON_ANNOTATION}=true to delete the Stack without destroying",
            )
            return DONE
        wait = cooldown_remaining(last, draft.spec, draft.settings, draft.now)
        if wait > timedelta(0):
            draft.reconciling(RECONCILING_RETRY_REASON, f"destroy failed: {last.get('message')}")
            draft.requeue_in(wait)
            return DONE
    run = Run(
        operation="destroy",
        kind="sync",
        generation=draft.generation,
        reconcile_request=draft.request,
        commit=str(last.get("lastSuccessfulCommit") or ""),
        trigger=f"finalize:{last.get('name') or ''}",
    )
    started = start_run(draft, run, "the Stack is being deleted (destroyOnFinalize)")
    return started if isinstance(started, Refold) else DONE


def _release(draft: Draft) -> None:
    """Remove the finalizer; the Stack goes, so its status is left alone."""
    draft.decision.finalizer = "remove"
    draft.decision.status = None
