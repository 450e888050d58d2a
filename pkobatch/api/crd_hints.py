"""CRD schema hints carried in ``Annotated`` metadata of the Stack models.

The CRD is generated from the pydantic models (``pkobatch.api.crd``). Most of a field's
schema follows from its Python type; a ``CrdHint`` adds what the type cannot say (an
integer's ``format``, a list's ``x-kubernetes-list-type``) or replaces the generated schema
outright where the API server must accept more than the model's canonical type (the alias
dialect, free-form templates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False)  # identity hash: typing hashes Annotated metadata
class CrdHint:
    # Replaces the schema derived from the type (descriptions are still added).
    schema: Mapping[str, Any] | None = None
    # Merged into the derived (or replacing) schema.
    extra: Mapping[str, Any] = field(default_factory=dict)


PRESERVE_UNKNOWN: Mapping[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
FREE_FORM_OBJECT = CrdHint(schema={"type": "object", **PRESERVE_UNKNOWN})
ANY_JSON = CrdHint(schema=PRESERVE_UNKNOWN)
INT64 = CrdHint(extra={"format": "int64"})
INT32 = CrdHint(extra={"format": "int32"})
ATOMIC_LIST = CrdHint(extra={"x-kubernetes-list-type": "atomic"})
INT_OR_STRING = CrdHint(schema={"x-kubernetes-int-or-string": True})


def map_list(*keys: str) -> CrdHint:
    """A list merged by ``keys`` (kubebuilder's ``+listType=map``)."""
    return CrdHint(
        extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}
    )


def default(value: Any) -> CrdHint:
    """A default the API server applies (kubebuilder's ``+default``)."""
    return CrdHint(extra={"default": value})


# The pod-spec fields of the Stack's templates that the CRD's CEL rules read. CEL sees only
# declared properties: the unknown fields a preserve-unknown-fields object keeps are
# invisible to it, so each field a rule needs is declared here (the rest stays free-form).
MAX_SERVICE_ACCOUNT_NAME: int = 253
POD_SPEC_IDENTITY: Mapping[str, Any] = {
    "serviceAccountName": {"type": "string", "maxLength": MAX_SERVICE_ACCOUNT_NAME},
    "serviceAccount": {"type": "string", "maxLength": MAX_SERVICE_ACCOUNT_NAME},
    "automountServiceAccountToken": {"type": "boolean"},
}
POD_SPEC_TEMPLATE = CrdHint(
    schema={"type": "object", **PRESERVE_UNKNOWN, "properties": POD_SPEC_IDENTITY}
)
POD_TEMPLATE_SPEC = CrdHint(
    schema={
        "type": "object",
        **PRESERVE_UNKNOWN,
        "properties": {
            "spec": {"type": "object", **PRESERVE_UNKNOWN, "properties": POD_SPEC_IDENTITY}
        },
    }
)
