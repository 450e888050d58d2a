"""Operation requests (``pkobatch.io/operation-request: <op>:<token>``, docs/operations.md):
each is handled once and answered in ``status.operationRequest``; ``cancel`` stops the
current run. The request protocol itself is ``pkobatch.api.operation_request``'s.

``unlock`` runs ``pulumi cancel``, which removes the stack's lock whoever holds it: it is
rejected, never queued, while any Job of the Stack is unfinished, since that run's lock is
the one it would remove. Outside this Stack's runs (a person's ``pulumi up``, another
cluster) nothing can tell a live lock from a stale one; the user asking for the unlock
vouches for that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pkobatch.api.annotations import recorded_request, refusal
from pkobatch.api.constants import OPERATION_REQUEST_ANNOTATION, Operation
from pkobatch.api.messages import bound_message
from pkobatch.api.operation_request import REQUEST_OPERATIONS, RequestState, split_request
from pkobatch.api.run import Run
from pkobatch.api.status import last_update, operation_request_status
from pkobatch.controller import approval
from pkobatch.controller.job_builder import job_name
from pkobatch.controller.outcome import cancelled_outcome
from pkobatch.controller.steps.draft import DONE, NEXT, Draft, Refold, StepResult
from pkobatch.controller.steps.runs import start_run
from pkobatch.controller.steps.settle import fold
from pkobatch.controller.steps.source import revision

EVENT_REQUEST_REJECTED: Final = "OperationRequestRejected"


def operation_request(draft: Draft) -> StepResult:
    """Act on a new (or still pending) request: DONE when its run started, waits for a
    free slot or could not start, or when it cancelled the current run; NEXT when the
    request was answered otherwise (rejected, pending behind a run) or there is none."""
    value = str(draft.annotations.get(OPERATION_REQUEST_ANNOTATION) or "")
    current = operation_request_status(draft.status)
    answered = current.get("request") == recorded_request(value)
    if not value or (answered and current.get("state") != "Pending"):
        return NEXT
    operation, _ = split_request(value)
    problem = refusal(OPERATION_REQUEST_ANNOTATION, value)
    if problem is not None:
        _request_status(draft, value, operation, "Rejected", "", problem)
        return NEXT
    blocking = draft.blocking_job()
    if operation == "cancel":
        return _cancel(draft, value, blocking)
    rejection = _rejection(draft, operation, blocking)
    if rejection is not None:
        _request_status(draft, value, operation, "Rejected", "", rejection)
        return NEXT
    if blocking is not None:
        name = str(blocking["metadata"]["name"])
        _request_status(draft, value, operation, "Pending", "", f"waiting for run {name} to finish")
        return NEXT
    commit = revision(draft, draft.valid_spec())
    op: Operation = operation  # type: ignore[assignment]
    run = Run(
        operation=op,
        kind="request",
        generation=draft.generation,
        reconcile_request=draft.request,
        commit=commit if isinstance(commit, str) else "",
        trigger=f"request:{value}",
        request=value,
    )
    name = job_name(draft.name, draft.uid, run)
    started = start_run(draft, run, f"requested {operation} ({value})")
    if isinstance(started, Refold):
        return started
    if started:
        _request_status(draft, value, operation, "Running", name, f"run {name} started")
        return DONE
    if draft.decision.create_job is None and draft.obs.slot_available is False:
        _request_status(draft, value, operation, "Pending", "", "waiting for a free run slot")
        return DONE
    _request_status(
        draft, value, operation, "Rejected", "", f"its run could not start: {draft.start_refused}"
    )
    return DONE


def _rejection(draft: Draft, operation: str, blocking: Mapping[str, Any] | None) -> str | None:
    """Why a request for ``operation`` (not ``cancel``) is rejected; None when it may run,
    or wait for the run in progress (``blocking``) to finish."""
    raw_spec = draft.obs.stack.get("spec") or {}
    if operation == "unlock" and blocking is not None:
        return (
            f"run {blocking['metadata']['name']} of this Stack is in progress and holds the "
            f"stack's lock: wait for it to finish, or stop it with `pkobatch cancel "
            f"{draft.name}`, then unlock again"
        )
    if operation == "up" and approval.required(raw_spec):
        return (
            "spec.approval.required: updates run only an approved plan; see `pkobatch "
            f"plan {draft.name}` and approve it with `pkobatch approve {draft.name}`"
        )
    if raw_spec.get("preview") and operation in ("up", "destroy"):
        return f"spec.preview is true: this Stack never runs {operation}"
    if draft.spec is None:
        return "the spec is invalid: " + "; ".join(draft.check.problems)
    return None


def _cancel(draft: Draft, value: str, blocking: Mapping[str, Any] | None) -> StepResult:
    """Cancel the current run: its Job is deleted in the foreground and its run folded as
    cancelled (DONE); with no current run, the request is rejected (NEXT)."""
    if blocking is None or blocking["metadata"]["name"] != draft.current_name():
        _request_status(
            draft, value, "cancel", "Rejected", "", "nothing to cancel: no run is in progress"
        )
        return NEXT
    name = str(blocking["metadata"]["name"])
    run = draft.run_of(name, blocking)
    draft.delete_job(blocking, foreground=True)
    fold(draft, run, name, cancelled_outcome(name, value, draft.now), None)
    _request_status(draft, value, "cancel", "Succeeded", name, f"run {name} was cancelled")
    # The cancelled Job blocks new runs until its pod is gone (foreground deletion).
    draft.resting(last_update(draft.status))
    return DONE


def reject_request_while_deleting(draft: Draft) -> None:
    """A Stack being deleted runs no requested operation: a new request is rejected."""
    value = str(draft.annotations.get(OPERATION_REQUEST_ANNOTATION) or "")
    current = operation_request_status(draft.status)
    if value and current.get("request") != recorded_request(value):
        _request_status(
            draft, value, split_request(value)[0], "Rejected", "", "the Stack is being deleted"
        )


def _request_status(
    draft: Draft, value: str, operation: str, state: RequestState, job: str, message: str
) -> None:
    """Answer the request ``value`` in ``status.operationRequest`` (a Warning Event when a
    new one is rejected)."""
    previous = operation_request_status(draft.status)
    # A refused value is never copied whole (api.annotations.recorded_request).
    recorded = recorded_request(value)
    draft.status["operationRequest"] = {
        "request": recorded,
        "operation": operation if operation in REQUEST_OPERATIONS else "",
        "state": state,
        "jobName": job,
        "message": bound_message(message),
    }
    if state == "Rejected" and previous.get("request") != recorded:
        draft.event("Warning", EVENT_REQUEST_REJECTED, f"{recorded}: {message}")
