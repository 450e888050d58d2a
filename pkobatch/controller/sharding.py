"""Handing a Stack's run objects over between controller shards (docs/sharding.md).

A sharded controller watches only the Stacks labelled with its shard, and only the Jobs and
result ConfigMaps with the same label: every Job carries its Stack's ``pkobatch.io/shard``
label from creation (``jobs.run_labels``), and the runner copies the Job's label onto the
result. A relabelled Stack moves to another controller, but its running Job — and the result
the runner writes with the label it read at start — keep the old label. The new owner finds
that Job by name (``status.currentUpdate``; a live ``get`` in ``observe``) and its result the
same way, and ``handover`` says which of them to relabel so that its own watches report what
happens to them next. Finished Jobs of earlier runs keep their old label until their
``ttlSecondsAfterFinished`` removes them.

The old owner needs no step of its own: its filtered watch reports the Stack as deleted, and a
Stack missing from the store is simply not reconciled — no finalizer, no destroy, no Job
deleted. Its stale decisions cannot land either: status writes carry the ``resourceVersion``
they were computed from (the relabel changed it), and ``StackReconciler`` re-reads a sharded
Stack before creating a Job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pkobatch.api.constants import SHARD_LABEL


@dataclass(frozen=True)
class Relabel:
    """Set the shard label of one of the Stack's objects (None: remove it)."""

    kind: Literal["Job", "ConfigMap"]
    name: str
    shard: str | None


def shard_of(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(SHARD_LABEL)
    return str(value) if value is not None else None


def handover(
    stack: Mapping[str, Any],
    jobs: Iterable[Mapping[str, Any]],
    results: Mapping[str, Mapping[str, Any]],
) -> list[Relabel]:
    """The Stack's Jobs, and the results of those Jobs, whose shard label is not the
    Stack's."""
    shard = shard_of(stack)
    relabels: list[Relabel] = []
    for job in jobs:
        name = str((job.get("metadata") or {}).get("name") or "")
        if shard_of(job) != shard:
            relabels.append(Relabel("Job", name, shard))
        result = results.get(name)
        if result is not None and shard_of(result) != shard:
            relabels.append(Relabel("ConfigMap", name, shard))
    return relabels
