"""``JSON``: a Kubernetes object, or a part of one, as the API server sends it, and the
accessors everyone reads such objects with (no I/O).

The accessors read tolerantly: an object may have been written by PKO, by another version
of pkobatch, or be half-written, so a missing or malformed part reads as absent instead of
raising. Timestamps are read and written by ``pkobatch.api.timestamps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

JSON = dict[str, Any]


def conditions_of(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``status.conditions`` of ``obj`` (only the entries that are objects)."""
    status = obj.get("status")
    items = status.get("conditions") if isinstance(status, Mapping) else None
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def condition_in(
    items: Iterable[Mapping[str, Any]], condition_type: str
) -> Mapping[str, Any] | None:
    """The condition of ``condition_type`` among ``items``, or None."""
    return next((c for c in items if c.get("type") == condition_type), None)


def condition_of(obj: Mapping[str, Any], condition_type: str) -> Mapping[str, Any] | None:
    """``obj``'s condition of ``condition_type``, or None."""
    return condition_in(conditions_of(obj), condition_type)


def true_condition(obj: Mapping[str, Any], condition_type: str) -> Mapping[str, Any] | None:
    """``obj``'s condition of ``condition_type`` when its status is "True", else None."""
    condition = condition_of(obj, condition_type)
    return condition if condition is not None and condition.get("status") == "True" else None


def job_finished(job: Mapping[str, Any]) -> bool:
    """The Job controller has marked the Job Complete or Failed."""
    return true_condition(job, "Complete") is not None or true_condition(job, "Failed") is not None


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """One of ``obj``'s ownerReferences is the object with ``uid``."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners or ())
