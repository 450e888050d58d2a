"""Typed views of a Stack's status in its wire form (camelCase keys, JSON values).

The controller builds status and the CLI reads it as plain dicts, since status is patched
and read as JSON; these ``TypedDict``s give the sections with a protocol of their own
(``lastUpdate``, ``currentUpdate``, ``operationRequest``, ``lastDriftCheck``) a type, so a
misspelt key is a type error. The pydantic models in ``stack/status.py`` describe the same fields
for the CRD schema (a unit test keeps both in step). A view of an object read from the API
is only as good as what is stored: readers still treat every field as possibly missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from pkobatch.api.objects import JSON
from pkobatch.api.operation_request import RequestState


class LastUpdate(TypedDict, total=False):
    """``status.lastUpdate``: the last run that changes the stack (PKO's fields + reason)."""

    generation: int
    reconcileRequest: str
    name: str
    type: str
    state: str
    message: str
    lastAttemptedCommit: str
    lastSuccessfulCommit: str
    permalink: str
    lastResyncTime: str
    failures: int
    reason: str


class CurrentUpdate(TypedDict, total=False):
    """``status.currentUpdate``: the run in progress (its Job's name)."""

    generation: int
    reconcileRequest: str
    name: str
    commit: str


class OperationRequest(TypedDict, total=False):
    """``status.operationRequest``: the answer to ``pkobatch.io/operation-request``."""

    request: str
    operation: str
    state: RequestState
    jobName: str
    message: str


class DriftCheck(TypedDict, total=False):
    """``status.lastDriftCheck``: the last drift check (``spec.driftDetection``)."""

    name: str
    scheduledTime: str
    time: str
    state: str
    driftedResources: int
    message: str


class StatusObject(TypedDict, total=False):
    """``status`` of a Stack."""

    observedGeneration: int
    observedReconcileRequest: str
    lastUpdate: LastUpdate
    currentUpdate: CurrentUpdate
    outputs: JSON
    conditions: list[JSON]
    projectInfo: JSON
    operationRequest: OperationRequest
    lastScheduleTime: str
    lastDriftCheck: DriftCheck
    # Notifications not yet delivered (controller/notify.py reads and writes them).
    notifications: JSON
    # The saved plan awaiting or past approval (decided in controller/approval.py, a finished
    # run of it folded in controller/fold.py).
    approval: JSON


def _section(status: Any, key: str) -> JSON:
    value = status.get(key) if isinstance(status, Mapping) else None
    return value if isinstance(value, dict) else {}


def last_update(status: Any) -> LastUpdate:
    """``status.lastUpdate`` (empty when nothing has run)."""
    return cast(LastUpdate, _section(status, "lastUpdate"))


def current_update(status: Any) -> CurrentUpdate:
    """``status.currentUpdate`` (empty when no run is in progress)."""
    return cast(CurrentUpdate, _section(status, "currentUpdate"))


def operation_request_status(status: Any) -> OperationRequest:
    """``status.operationRequest`` (empty when no request was handled)."""
    return cast(OperationRequest, _section(status, "operationRequest"))


def last_drift_check(status: Any) -> DriftCheck:
    """``status.lastDriftCheck`` (empty when no check has run)."""
    return cast(DriftCheck, _section(status, "lastDriftCheck"))
