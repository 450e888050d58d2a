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

The Job controller's record of a run's start (``job_started``: its pod created, then ready)
wakes nothing either, though it is not the controller's write: a decision reads those
fields only to time its checks of a pod that never comes or never starts, and the decision
before them already asked to come back for those checks (the one that creates a Job asks
for the first: ``steps.runs.start_run``). The same test checks this over every start the
Job controller can record in the planner's cases. What ends a run (a finished condition, a
pod count going down or failing, the Job's deletion) is always news.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from pkobatch.api.constants import FINALIZER
from pkobatch.api.objects import job_finished

# What the Job controller records of a run's start: its pod's start time, the pod created
# (``active``), its containers ready. A decision reads only whether they are set.
JOB_START_FIELDS: Final = ("startTime", "active", "ready")
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


def job_started(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Does this Job update only record its run's start: some ``JOB_START_FIELDS`` set that
    were not (a count of 0 or an absent field is not set), the Job unfinished and not being
    deleted, nothing else changed but the resourceVersion?"""
    if old is None or new is None or job_finished(new) or _meta(new).get("deletionTimestamp"):
        return False
    old_status, new_status = _set_fields(old), _set_fields(new)
    if "ready" in new_status and "active" not in new_status:
        return False  # ready pods are active ones: not a state the Job controller records
    for field in JOB_START_FIELDS:
        if field in old_status and old_status[field] != new_status.get(field):
            return False  # changed or unset once set: not a start
    rest = {k: v for k, v in old_status.items() if k not in JOB_START_FIELDS}
    new_rest = {k: v for k, v in new_status.items() if k not in JOB_START_FIELDS}
    return rest == new_rest and _without_version({**old, "status": {}}) == _without_version(
        {**new, "status": {}}
    )


def _set_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job's status without the fields that are not set (0, absent): the Job controller
    writes a count of 0 in one version and leaves it out in another."""
    status = job.get("status")
    return {k: v for k, v in (status if isinstance(status, Mapping) else {}).items() if v}


def _without_version(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in _meta(obj).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}
