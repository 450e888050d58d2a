"""The annotations users and the CLI write on a Stack: the syntax and size bound of each.

Anyone who may patch a Stack may write any annotation, of any size the API server admits
(256 KiB for all of an object's annotations together). The controller copies some of them
into status, Jobs and Events, and acts on others, so each one it reads is checked here
first, against one rule: what its value must look like and how long it may be. A value
that breaks its rule is never acted on and never copied; the controller does what is safe
instead (the rule's ``refused``) and says so, naming the annotation, its rule and what to
do (``refusal``): ``status.operationRequest`` answers a refused operation request, the
``AnnotationsRefused`` condition and a Warning Event the others. The CLI refuses to write
such a value (``cli/requests.set_annotation``). docs/operations.md lists the rules.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    APPROVE_ANNOTATION,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    REJECT_ANNOTATION,
)
from pkobatch.api.operation_request import REQUEST_OPERATIONS, split_request
from pkobatch.api.run import PLAN_ID_PREFIX

# A request names one request; it is no place for data. The CLI's RFC 3339 tokens have 30
# characters, a UUID 36, the controller's own `after-<run>` at most 69; 256 leaves room
# for any token scheme while the five places a request is copied to (status, the Job's run
# record and snapshot, Events) stay small.
MAX_REQUEST_CHARS: Final = 256
# What status keeps of a refused request value: enough to recognise it.
_RECORDED_PREFIX_CHARS: Final = 64
# How much of a refused value a message quotes.
_QUOTED_CHARS: Final = 64

_PLAN_ID: Final = re.compile(re.escape(PLAN_ID_PREFIX) + "[0-9a-f]{20}")
_PLAN_ID_CHARS: Final = len(PLAN_ID_PREFIX) + 20


def _any_text(value: str) -> bool:
    return True


def _boolean(value: str) -> bool:
    return value in ("true", "false")


def _operation_request(value: str) -> bool:
    operation, token = split_request(value)
    return operation in REQUEST_OPERATIONS and bool(token)


def _plan_id(value: str) -> bool:
    return _PLAN_ID.fullmatch(value) is not None


@dataclass(frozen=True)
class AnnotationRule:
    """One annotation the controller reads, as docs/operations.md lists it."""

    name: str
    # How a value must look, as messages and the docs say it.
    syntax: str
    max_chars: int
    valid: Callable[[str], bool]
    # What the controller does when the value breaks the rule.
    refused: str
    # What the user should do then.
    fix: str

    def problem(self, value: str) -> str | None:
        """What is wrong with ``value`` (naming the annotation and its rule); None: nothing."""
        if len(value) > self.max_chars:
            return (
                f"{self.name} is {len(value)} characters long, over its bound of "
                f"{self.max_chars} ({self.syntax})"
            )
        if not self.valid(value):
            return f"{self.name}: {_quoted(value)} is not {self.syntax}"
        return None

    def refusal(self, value: str) -> str | None:
        """Why the controller refuses ``value``, what it does instead and what to do."""
        problem = self.problem(value)
        return None if problem is None else f"{problem}; {self.refused}; {self.fix}"


def _plan_id_rule(name: str, verb: str) -> AnnotationRule:
    """``pkobatch.io/approve`` and ``pkobatch.io/reject``: the id of the pending plan."""
    return AnnotationRule(
        name=name,
        syntax=f"a plan id ('{PLAN_ID_PREFIX}' and 20 hexadecimal digits, status.approval.planID)",
        max_chars=_PLAN_ID_CHARS,
        valid=_plan_id,
        refused=f"it is ignored: no plan is {verb}d",
        fix=f"{verb} with `pkobatch {verb} NAME`, which writes the pending plan's id",
    )


RULES: Final[tuple[AnnotationRule, ...]] = (
    AnnotationRule(
        name=RECONCILE_REQUEST_ANNOTATION,
        syntax=f"any text of at most {MAX_REQUEST_CHARS} characters",
        max_chars=MAX_REQUEST_CHARS,
        valid=_any_text,
        refused="the request is ignored: nothing runs for it and status keeps the last "
        "accepted request",
        fix="write a short token such as a timestamp (`pkobatch reconcile NAME` does)",
    ),
    AnnotationRule(
        name=OPERATION_REQUEST_ANNOTATION,
        syntax=f"'<operation>:<token>' with operation one of {', '.join(REQUEST_OPERATIONS)} "
        f"and at most {MAX_REQUEST_CHARS} characters in all",
        max_chars=MAX_REQUEST_CHARS,
        valid=_operation_request,
        refused="the request is rejected and nothing runs for it",
        fix="write '<operation>:<token>' with a short token such as a timestamp "
        "(`pkobatch up|preview|refresh|destroy|unlock|cancel NAME` does)",
    ),
    AnnotationRule(
        name=ABANDON_ANNOTATION,
        syntax="true or false",
        max_chars=len("false"),
        valid=_boolean,
        refused="it is ignored: deleting the Stack runs its destroy as if it were not set",
        fix="set it to true to delete the Stack without destroying its resources, or remove it",
    ),
    _plan_id_rule(APPROVE_ANNOTATION, "approve"),
    _plan_id_rule(REJECT_ANNOTATION, "reject"),
)
RULE_OF: Final[Mapping[str, AnnotationRule]] = {rule.name: rule for rule in RULES}


def _quoted(value: str) -> str:
    if len(value) <= _QUOTED_CHARS:
        return repr(value)
    return f"{value[:_QUOTED_CHARS]!r}... ({len(value)} characters)"


def _annotations(stack: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = (stack.get("metadata") or {}).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def refusal(name: str, value: str) -> str | None:
    """Why annotation ``name`` (one of ``RULES``) may not hold ``value``; None: it may."""
    return RULE_OF[name].refusal(value)


def accepted(stack: Mapping[str, Any], name: str) -> str:
    """The value of annotation ``name`` on ``stack``; "" when absent or refused."""
    value = str(_annotations(stack).get(name) or "")
    return value if value and refusal(name, value) is None else ""


def refusals(stack: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    """The refusal of each of the annotations ``names`` that ``stack`` holds a refused
    value of, in the order of ``names``."""
    found = []
    for name in names:
        value = _annotations(stack).get(name)
        problem = refusal(name, str(value)) if value else None
        if problem is not None:
            found.append(problem)
    return found


def reconcile_request(stack: Mapping[str, Any]) -> str:
    """The reconcile request the controller acts on: the annotation's value, or the last
    one it accepted (``status.observedReconcileRequest``) while the annotation's is
    refused, so a refused value starts no run and reaches no status."""
    annotations = _annotations(stack)
    value = str(annotations.get(RECONCILE_REQUEST_ANNOTATION) or "")
    if refusal(RECONCILE_REQUEST_ANNOTATION, value) is None:
        return value
    status = stack.get("status")
    observed = str((status or {}).get("observedReconcileRequest") or "")
    return observed if refusal(RECONCILE_REQUEST_ANNOTATION, observed) is None else ""


def recorded_request(value: str) -> str:
    """What ``status.operationRequest.request`` holds for an operation request: the value
    itself, or for one over its bound its start, length and digest (never more than the
    bound), by which the controller and the CLI know it was answered."""
    if len(value) <= MAX_REQUEST_CHARS:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:16]
    return f"{value[:_RECORDED_PREFIX_CHARS]}... ({len(value)} characters, sha256 {digest})"
