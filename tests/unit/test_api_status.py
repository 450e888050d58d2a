"""pkobatch.api.status and operation_request: the typed status views match the CRD models."""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel

from pkobatch.api.operation_request import (
    FINAL_REQUEST_STATES,
    RequestState,
    request_value,
    split_request,
)
from pkobatch.api.stack.status import (
    CurrentStackUpdate,
    DriftCheckStatus,
    OperationRequestStatus,
    StackStatus,
    StackUpdateState,
)
from pkobatch.api.status import (
    CurrentUpdate,
    DriftCheck,
    LastUpdate,
    OperationRequest,
    StatusObject,
    last_update,
    operation_request_status,
)


def wire_keys(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_views_have_the_fields_of_the_crd_models() -> None:
    pairs: list[tuple[type, type[BaseModel]]] = [
        (LastUpdate, StackUpdateState),
        (CurrentUpdate, CurrentStackUpdate),
        (OperationRequest, OperationRequestStatus),
        (DriftCheck, DriftCheckStatus),
        (StatusObject, StackStatus),
    ]
    for view, model in pairs:
        assert set(view.__annotations__) == wire_keys(model), view.__name__


def test_sections_are_empty_when_absent_or_not_objects() -> None:
    assert last_update(None) == {}
    assert last_update({"lastUpdate": "garbage"}) == {}
    request = {"request": "up:1", "state": "Running"}
    assert operation_request_status({"operationRequest": request}) is request


def test_request_values_round_trip_and_malformed_ones_split_empty() -> None:
    assert split_request(request_value("refresh", "2026-01-01T00:00:00Z")) == (
        "refresh",
        "2026-01-01T00:00:00Z",
    )
    assert split_request("up") == ("up", "")
    assert split_request(" destroy : t ") == ("destroy", "t")
    assert set(FINAL_REQUEST_STATES) < set(get_args(RequestState))
    assert "Running" not in FINAL_REQUEST_STATES
