"""Notes on what the user wrote, given on every pass before the other steps: the
generation observed (with the spec's notes — aliases used, PKO fields that pkobatch
ignores — once per generation), the FieldsIgnored condition (the ignored fields again, in
the status, for as long as the spec sets them) and the AnnotationsRefused condition.

Every annotation a user writes on the Stack is read through its rule in
``pkobatch.api.annotations``: a value that breaks it is ignored in the safe direction and
reported here (or, for an operation request, in the request's ``Rejected`` answer), never
copied.
"""

from __future__ import annotations

from typing import Final

from pkobatch.api.annotations import refusals
from pkobatch.api.conditions import find_condition, remove_condition, set_condition
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    ANNOTATION_INVALID_REASON,
    APPROVE_ANNOTATION,
    CONDITION_ANNOTATIONS_REFUSED,
    CONDITION_FIELDS_IGNORED,
    FIELDS_IGNORED_REASON,
    RECONCILE_REQUEST_ANNOTATION,
    REJECT_ANNOTATION,
)
from pkobatch.api.ignored_fields import NoopField, noop_fields_in_use
from pkobatch.api.messages import bound_message
from pkobatch.controller.steps.draft import Draft

EVENT_SPEC_NOTES: Final = "SpecNotes"
EVENT_ANNOTATION_REFUSED: Final = "AnnotationRefused"
# The annotations whose refusal the AnnotationsRefused condition reports; an operation
# request's is answered in status.operationRequest.
CONDITION_CHECKED_ANNOTATIONS: Final = (
    RECONCILE_REQUEST_ANNOTATION,
    ABANDON_ANNOTATION,
    APPROVE_ANNOTATION,
    REJECT_ANNOTATION,
)


def observe_generation(draft: Draft) -> None:
    """Record the generation and reconcile request seen; a Normal Event with the spec's
    notes the first time a generation is seen."""
    first_time = draft.old_status.get("observedGeneration") != draft.generation
    draft.status["observedGeneration"] = draft.generation
    draft.status["observedReconcileRequest"] = draft.request
    # Deletion raises the generation of a custom resource without a spec change: the
    # notes about the spec were given for it already.
    deleting = bool(draft.meta.get("deletionTimestamp"))
    if first_time and not deleting and draft.check.spec is not None:
        notes = list(draft.check.alias_notes)
        notes += _ignored(noop_fields_in_use(draft.check.spec))
        if notes:
            draft.event("Normal", EVENT_SPEC_NOTES, "; ".join(notes))


def _ignored(fields: list[NoopField]) -> list[str]:
    return [f"{n.path} is ignored: {n.reason}" for n in fields]


def ignored_fields(draft: Draft) -> None:
    """FieldsIgnored names every PKO field the spec sets that cannot apply to a Job; it is
    removed when the spec sets none (or cannot be read: SpecInvalid says why)."""
    ignored = noop_fields_in_use(draft.check.spec) if draft.check.spec is not None else []
    if not ignored:
        draft.conditions = remove_condition(draft.conditions, CONDITION_FIELDS_IGNORED)
        return
    draft.conditions = set_condition(
        draft.conditions,
        CONDITION_FIELDS_IGNORED,
        "True",
        FIELDS_IGNORED_REASON,
        bound_message("; ".join(_ignored(ignored))),
        now=draft.now,
        observed_generation=draft.generation,
    )


def refused_annotations(draft: Draft) -> None:
    """AnnotationsRefused names every annotation whose value breaks its rule (and is
    ignored); a Warning Event when that changes."""
    refused = refusals(draft.obs.stack, CONDITION_CHECKED_ANNOTATIONS)
    if not refused:
        draft.conditions = remove_condition(draft.conditions, CONDITION_ANNOTATIONS_REFUSED)
        return
    message = bound_message("; ".join(refused))
    previous = find_condition(draft.conditions, CONDITION_ANNOTATIONS_REFUSED)
    draft.conditions = set_condition(
        draft.conditions,
        CONDITION_ANNOTATIONS_REFUSED,
        "True",
        ANNOTATION_INVALID_REASON,
        message,
        now=draft.now,
        observed_generation=draft.generation,
    )
    if previous is None or previous.message != message:
        draft.event("Warning", EVENT_ANNOTATION_REFUSED, message)
