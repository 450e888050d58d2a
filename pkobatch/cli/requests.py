"""Asking the controller for a run, and reading its answers from the Stack (docs/operations.md).

Two annotation protocols, both answered in the Stack's status:

- ``pkobatch.io/operation-request: "<op>:<token>"`` (up, preview, refresh, destroy,
  cancel). The controller acknowledges it in ``status.operationRequest`` (``request``
  echoes the annotation; ``state`` goes Pending → Running → Succeeded | Failed, or
  Rejected with a message); the protocol is ``pkobatch.api.operation_request``.
- PKO's ``pulumi.com/reconciliation-request: <token>`` (re-run the normal operation, like
  ``flux reconcile``): ``status.observedReconcileRequest`` says the controller saw it,
  ``status.lastUpdate.reconcileRequest`` that the run for it finished.

Tokens are RFC 3339 timestamps with nanoseconds in UTC, as Flux writes them: unique per
request and telling when it was made. The functions that read a Stack, and those that build
what a request writes (``annotation_patch``, ``suspend_patch``, ``resume_patch``), are pure:
the waiting loop in ``follow.py`` stays a thin poller, and the Argo CD resource actions
(deploy/argocd) are tested against exactly these patches.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pkobatch.api.annotations import RULE_OF, recorded_request
from pkobatch.api.constants import (
    CONDITION_READY,
    FIELD_MANAGER_CLI,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
)
from pkobatch.api.objects import JSON, condition_of
from pkobatch.api.operation_request import FINAL_REQUEST_STATES
from pkobatch.api.status import current_update, last_update
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.session import CommandFailed
from pkobatch.cli.stack_views import operation_request, stack_view
from pkobatch.kube.client import STACKS, Conflict, Kube

_PATCH_ATTEMPTS: Final = 5


def new_token(now_ns: int | None = None) -> str:
    """Go's RFC3339Nano in UTC: trailing zeros of the fraction dropped."""
    ns = time.time_ns() if now_ns is None else now_ns
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


def stack_annotations(stack: Mapping[str, Any]) -> dict[str, str]:
    return dict((stack.get("metadata") or {}).get("annotations") or {})


def annotation_patch(key: str, value: str) -> JSON:
    """The merge patch of a request made by an annotation (operation, reconcile, approve,
    reject)."""
    return {"metadata": {"annotations": {key: value}}}


def suspend_patch(suspend: bool) -> JSON:
    """The merge patch of ``pkobatch suspend`` (True) and of leaving suspension."""
    return {"spec": {"suspend": suspend}}


def resume_patch(token: str) -> JSON:
    """The merge patch of ``pkobatch resume``: as ``flux resume``, leave suspension and ask
    for a run of the normal operation at once (PKO's reconcile request)."""
    return {**annotation_patch(RECONCILE_REQUEST_ANNOTATION, token), **suspend_patch(False)}


def set_annotation(
    kube: Kube, stack: JSON, key: str, value: str, *, field_manager: str = FIELD_MANAGER_CLI
) -> tuple[JSON, str | None]:
    """Set one annotation, guarded by resourceVersion; returns the patched Stack and the
    value it replaced when that value was an operation request nobody had picked up yet."""
    return patch_stack(kube, stack, annotation_patch(key, value), field_manager=field_manager)


def patch_stack(
    kube: Kube, stack: JSON, request: JSON, *, field_manager: str = FIELD_MANAGER_CLI
) -> tuple[JSON, str | None]:
    """Merge ``request`` into the Stack, guarded by resourceVersion (a Stack that changed
    meanwhile is read again); returns the patched Stack and the operation request it
    replaced, when it sets one over a request nobody had picked up yet. An annotation value
    the controller would refuse (``api.annotations``) is not written."""
    annotations = (request.get("metadata") or {}).get("annotations") or {}
    for key, value in annotations.items():
        if key in RULE_OF and (problem := RULE_OF[key].problem(value)) is not None:
            raise CommandFailed(f"not written, as the controller would refuse it: {problem}")
    metadata = stack["metadata"]
    current = stack
    sets_request = OPERATION_REQUEST_ANNOTATION in annotations
    for _ in range(_PATCH_ATTEMPTS):
        replaced = unacknowledged_request(current) if sets_request else None
        patch = {
            **request,
            "metadata": {
                **(request.get("metadata") or {}),
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        try:
            patched = kube.merge_patch(
                STACKS,
                metadata["name"],
                patch,
                metadata["namespace"],
                field_manager=field_manager,
            )
        except Conflict:
            current = kube.get(STACKS, metadata["name"], metadata["namespace"])
            continue
        return patched, replaced
    raise Conflict(409, "Conflict", f"stack {metadata['name']} kept changing; try again")


def unacknowledged_request(stack: Mapping[str, Any]) -> str | None:
    value = stack_annotations(stack).get(OPERATION_REQUEST_ANNOTATION)
    if not value:
        return None
    recorded = recorded_request(value)
    request = operation_request(stack)
    return recorded if request is None or request.request != recorded else None


# -- reading the answers ----------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """Where a request stands, as far as the Stack tells."""

    phase: str
    job_name: str = ""
    done: bool = False
    failed_reason: str = ""
    message: str = ""


def operation_progress(stack: Mapping[str, Any], value: str) -> Progress:
    """Progress of operation request ``value`` ("<op>:<token>")."""
    request = operation_request(stack)
    if request is None or request.request != value:
        current = stack_annotations(stack).get(OPERATION_REQUEST_ANNOTATION)
        if current != value:
            return Progress(
                phase="Superseded",
                done=True,
                failed_reason="Superseded",
                message=f"the request was replaced by {current or 'nothing'} before the "
                "controller picked it up",
            )
        return Progress(phase="Waiting for the controller")
    done = request.state in FINAL_REQUEST_STATES
    return Progress(
        phase=request.state or "Pending",
        job_name=request.job_name,
        done=done,
        failed_reason=request.state if done and request.state != "Succeeded" else "",
        message=request.message,
    )


def reconcile_progress(stack: Mapping[str, Any], token: str) -> Progress:
    """Progress of reconcile request ``token`` (Flux's ``reconcile`` protocol)."""
    status = stack.get("status") or {}
    if stack_annotations(stack).get(RECONCILE_REQUEST_ANNOTATION) != token:
        return Progress(
            phase="Superseded",
            done=True,
            failed_reason="Superseded",
            message="the reconcile request was replaced by another one",
        )
    if status.get("observedReconcileRequest") != token:
        return Progress(phase="Waiting for the controller")
    last = last_update(status)
    current = current_update(status)
    if last.get("reconcileRequest") == token and current.get("reconcileRequest") != token:
        ready = condition_of(stack, CONDITION_READY)
        is_ready = ready is not None and ready.get("status") == "True"
        return Progress(
            phase="Ready" if is_ready else "NotReady",
            job_name=str(last.get("name") or ""),
            done=True,
            failed_reason="" if is_ready else str((ready or {}).get("reason") or "NotReady"),
            message=str((ready or {}).get("message") or ""),
        )
    if current.get("reconcileRequest") == token and current.get("name"):
        return Progress(phase="Running", job_name=str(current["name"]))
    return Progress(phase="Pending")


# -- outcomes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestOutcome:
    """The end of one requested operation on one Stack, as reported to the user."""

    namespace: str
    name: str
    operation: str
    request: str
    result: str
    run: str = ""
    reason: str = ""
    message: str = ""
    duration: timedelta | None = None
    changes: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result in ("succeeded", "requested")

    def to_json(self) -> JSON:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "operation": self.operation,
            "request": self.request,
            "result": self.result,
            "run": self.run,
            "reason": self.reason,
            "message": self.message,
            "durationSeconds": None if self.duration is None else self.duration.total_seconds(),
            "changes": dict(self.changes),
        }


def outcome(
    stack: Mapping[str, Any],
    operation: str,
    request: str,
    progress: Progress,
    record: RunRecord | None,
) -> RequestOutcome:
    """Combine the final progress with the run's result (reason, changes, duration)."""
    view = stack_view(stack)
    if progress.phase in ("Succeeded", "Ready"):
        result = "succeeded"
    elif progress.phase == "Rejected":
        result = "rejected"
    elif progress.phase == "Superseded":
        result = "superseded"
    else:
        result = "failed"
    reason = record.reason if record is not None else ""
    message = record.message if record is not None and record.message else progress.message
    if result == "failed" and not reason:
        reason = progress.failed_reason
    if result == "succeeded" and reason == "Succeeded":
        reason = ""
    return RequestOutcome(
        namespace=view.namespace,
        name=view.name,
        operation=operation,
        request=request,
        result=result,
        run=progress.job_name,
        reason=reason,
        message=" ".join(message.split()),
        duration=record.duration if record is not None else None,
        changes=dict(record.changes) if record is not None else {},
    )
