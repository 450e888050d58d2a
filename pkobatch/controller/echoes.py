"""Which watch events only echo the controller's own writes (pure).

Each of a reconcile's writes (the Job it creates, the finalizer, the status) comes back as a
watch event that would queue its Stack again, although deciding again from what the writes
left is a no-op (``tests/unit/test_controller_echoes.py`` checks that fixed point over the
planner's cases). Like controller-runtime's generation-changed predicates, these predicates
say which events can be dropped; the shell (``reconcile.OwnWrites``) knows which versions and
Jobs the controller wrote and never drops an event a reconcile is waiting for.

An event is an echo only if nothing that can ask for work changed: a Stack's generation
(its spec), deletion, labels, the ``pulumi.com/`` and ``pkobatch.io/`` annotations, and
finalizers other than the controller's; a Job's whole cached state but its resourceVersion.
No event of a Stack being deleted is an echo: the status a destroy's decision writes is
completed by the next reconcile.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pkobatch.api.constants import FINALIZER

# The annotations that ask for work (reconciliation and operation requests, approvals, ...).
_WORK_ANNOTATION_PREFIXES = ("pulumi.com/", "pkobatch.io/")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _version(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


def _what_asks_for_work(stack: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = _meta(stack)
    annotations = meta.get("annotations") or {}
    return (
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        meta.get("labels") or {},
        {k: v for k, v in annotations.items() if k.startswith(_WORK_ANNOTATION_PREFIXES)},
        sorted(f for f in meta.get("finalizers") or () if f != FINALIZER),
    )


def stack_update_is_echo(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, replaced: Collection[str]
) -> bool:
    """Does this Stack event only bring back a write of the controller without changing
    anything that asks for work? ``replaced``: the versions the controller's writes replace.
    Each write has the version it replaces as its precondition, so the update of one of them
    is the controller's own (had another client's come first, the controller's write was
    refused, and its reconcile looks again a second later)."""
    if old is None or new is None:
        return False  # a Stack appeared or went: always news
    if _meta(new).get("deletionTimestamp"):
        return False  # a deletion's decisions are not a fixed point of their own writes
    return _version(old) in replaced and _what_asks_for_work(old) == _what_asks_for_work(new)


def job_event_is_echo(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, created: bool
) -> bool:
    """Does this Job event change nothing a decision reads? The Job's appearance is an echo
    only when the controller ``created`` it; an update only when nothing but its
    resourceVersion changed."""
    if new is None:
        return False  # a Job that goes may free a slot or end a deletion
    if old is None:
        return created
    return _without_version(old) == _without_version(new)


def _without_version(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in _meta(obj).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}
