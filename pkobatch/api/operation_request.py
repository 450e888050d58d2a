"""The operation-request protocol, defined once for the controller and the CLI.

A user (or ``pkobatch up|preview|refresh|destroy|unlock|cancel``) asks for one run by setting the
annotation ``pkobatch.io/operation-request`` to ``"<operation>:<token>"``; the token makes
each request unique (the CLI writes an RFC 3339 timestamp, see ``cli/requests.new_token``).
The controller handles each value once and answers in ``status.operationRequest``:
``request`` echoes the value, ``state`` goes Pending → Running → Succeeded | Failed, or
Rejected with a message (docs/operations.md).
"""

from __future__ import annotations

from typing import Final, Literal

from pkobatch.api.constants import RUN_OPERATIONS

RequestState = Literal["Pending", "Running", "Succeeded", "Failed", "Rejected"]
# The states after which the controller does nothing more for a request.
FINAL_REQUEST_STATES: Final[tuple[RequestState, ...]] = ("Succeeded", "Failed", "Rejected")
REQUEST_OPERATIONS: Final = (*RUN_OPERATIONS, "cancel")


def request_value(operation: str, token: str) -> str:
    """The annotation value that asks for ``operation``."""
    return f"{operation}:{token}"


def split_request(value: str) -> tuple[str, str]:
    """``(operation, token)`` of an annotation value; either may be empty when malformed."""
    operation, _, token = value.partition(":")
    return operation.strip(), token.strip()
