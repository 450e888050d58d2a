"""What the controller keeps of each watched object: reflector transforms (controller-runtime's
cache ``TransformFunc``), applied to every listed and watched object before it is stored.

With thousands of Stacks and a few runs of history each, the cache holds tens of thousands
of Jobs and result ConfigMaps; kept whole, their pod templates and run records would make
the controller's memory grow with history. So the cache keeps only what the controller
reads:

- every object: no ``managedFields``; only the annotations pkobatch or PKO define
  (``pkobatch.io/``, ``pulumi.com/``); keys, kinds, API versions and the values that come
  from a small fixed set (``BOUNDED_VALUES``: condition types, statuses and reasons, run
  states, pkobatch's own labels) are interned, as the same few strings repeat in every
  object. Values unique to an object (names, uids, times, messages) are not: an interned
  string can outlive its object (CPython 3.12 before 3.12.5 keeps every interned string
  forever), and a controller sees new ones with every run;
- Stacks: everything else, with the keys of ``spec`` and ``status`` and the enumerated
  values (``ENUM_FIELDS``) interned — the JSON decoder makes fresh strings for each
  watch event;
- Jobs: metadata, ``spec.activeDeadlineSeconds`` (the deadline a failed run reports) and
  the pod counts, times and final conditions (``Complete``, ``Failed``) of ``status``; not
  the pod template, which is most of a Job and only the Job controller reads, nor the
  interim conditions the Job controller sets before those (``SuccessCriteriaMet``,
  ``FailureTarget``: one more dict per finished Job that nothing reads);
- result ConfigMaps: metadata and ``result.json`` reduced to the fields folding reads
  (``FOLDED_RESULT_FIELDS``, and ``SAVED_PLAN_FIELDS`` of a preview that saved a plan for
  approval); unreadable JSON is kept as it is, so folding reports it. The digest of the
  whole ``result.json`` is kept beside it (``fold.RESULT_DIGEST_KEY``): folding checks it
  against the digest the run's pod reported (``fold.trusted_result``).

Live reads (``Kube.get``) return whole objects; nothing here changes what is written.

Finished Jobs and results stop changing, so the stores keep them packed (deflated JSON,
``pkobatch.controller.stores.SETTLED_RUNS``) against ``PACKING_DICTIONARY``: a finished run
as cached here, with placeholder names, uids and times, so that what every packed run
shares (keys, labels, conditions, result fields) costs a few bytes each time.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, Final

from pkobatch.api.constants import (
    API_VERSION,
    JOB_STACK_UID_ANNOTATION,
    KIND,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    OPERATION_LABEL,
    PREFIX,
    RESULT_KEY,
    RESULT_LABEL,
    RUN_ANNOTATION,
    SHARD_LABEL,
    STACK_LABEL,
)
from pkobatch.api.objects import JSON
from pkobatch.api.run import ProjectInfo, Run, RunResult, StackRef, result_config_map, result_labels
from pkobatch.controller.outcome import RESULT_DIGEST_KEY, result_text_digest

KEPT_ANNOTATION_PREFIXES: Final = (f"{PREFIX}/", "pulumi.com/")
KEPT_METADATA: Final = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
)
KEPT_JOB_SPEC: Final = ("activeDeadlineSeconds",)
# What fold and plan read of a Job's status (pod counts, times, conditions).
KEPT_JOB_STATUS: Final = (
    "active",
    "ready",
    "succeeded",
    "failed",
    "terminating",
    "startTime",
    "completionTime",
)
# The Job conditions fold and plan read (``job_finished``, ``job_outcome``).
KEPT_JOB_CONDITIONS: Final = frozenset({"Complete", "Failed"})
KEPT_CONDITION: Final = ("type", "status", "reason", "message", "lastTransitionTime")
KEPT_OWNER_REFERENCE: Final = ("apiVersion", "kind", "name", "uid", "controller")
# Stack spec/status fields whose string values come from a small fixed set.
ENUM_FIELDS: Final = frozenset({"type", "status", "reason", "state"})
# The keys whose string values are interned: those whose values come from a small fixed set.
BOUNDED_VALUES: Final = ENUM_FIELDS | {
    "apiVersion",
    "kind",
    MANAGED_BY_LABEL,
    OPERATION_LABEL,
    RESULT_LABEL,
    SHARD_LABEL,
}
# The RunResult fields pkobatch.controller.outcome and fold read (``read_result``, ``job_outcome``,
# ``fold_status``, outputs, project info, drift, cleared locks, the failed step that names a
# failure's Event) and the ones the model requires.
FOLDED_RESULT_FIELDS: Final = frozenset(
    {
        "schemaVersion",
        "operation",
        "driftCheck",
        "state",
        "reason",
        "failedStep",
        "message",
        "stack",
        "jobName",
        "generation",
        "reconcileRequest",
        "commit",
        "endTime",
        "outputs",
        "secretOutputs",
        "driftedResources",
        "permalink",
        "projectInfo",
        "clearedLocks",
    }
)
# And of a preview that saved a plan (spec.approval): what status.approval shows of it.
SAVED_PLAN_FIELDS: Final = frozenset(
    {"planID", "changes", "plannedResources", "plannedResourceCount"}
)


def _interned(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``mapping`` with interned keys, and interned values of ``BOUNDED_VALUES`` keys."""
    return {
        sys.intern(str(key)): (
            sys.intern(value) if key in BOUNDED_VALUES and isinstance(value, str) else value
        )
        for key, value in mapping.items()
    }


def _interned_tree(value: Any) -> Any:
    """``value`` rebuilt with interned keys, and interned values of ``ENUM_FIELDS``."""
    if isinstance(value, dict):
        return {
            sys.intern(str(key)): (
                sys.intern(item)
                if key in ENUM_FIELDS and isinstance(item, str)
                else _interned_tree(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_interned_tree(item) for item in value]
    return value


def _metadata(meta: Mapping[str, Any]) -> JSON:
    kept: JSON = {key: meta[key] for key in KEPT_METADATA if key in meta}
    if "namespace" in kept:
        kept["namespace"] = sys.intern(str(kept["namespace"]))
    if kept.get("labels"):
        kept["labels"] = _interned(kept["labels"])
    annotations = {
        key: value
        for key, value in (kept.get("annotations") or {}).items()
        if key.startswith(KEPT_ANNOTATION_PREFIXES)
    }
    if annotations:
        kept["annotations"] = _interned(annotations)
    else:
        kept.pop("annotations", None)
    if kept.get("ownerReferences"):
        kept["ownerReferences"] = [
            _interned({key: owner[key] for key in KEPT_OWNER_REFERENCE if key in owner})
            for owner in kept["ownerReferences"]
        ]
    return kept


def _type(obj: Mapping[str, Any]) -> JSON:
    return {key: sys.intern(str(obj[key])) for key in ("apiVersion", "kind") if key in obj}


def cache_stack(obj: JSON) -> JSON:
    """A Stack as cached: everything the controller reads, which is all but metadata noise."""
    kept = {**obj, **_type(obj), "metadata": _metadata(obj.get("metadata") or {})}
    for part in ("spec", "status"):
        if part in kept:
            kept[part] = _interned_tree(kept[part])
    return kept


def cache_job(obj: JSON) -> JSON:
    """A Job as cached: metadata, its deadline and its status."""
    spec = obj.get("spec") or {}
    kept: JSON = {**_type(obj), "metadata": _metadata(obj.get("metadata") or {})}
    kept["spec"] = {key: spec[key] for key in KEPT_JOB_SPEC if key in spec}
    status = obj.get("status")
    if isinstance(status, dict):
        kept_status = {key: status[key] for key in KEPT_JOB_STATUS if key in status}
        if status.get("conditions"):
            # The same few condition types, statuses and reasons recur in every Job.
            kept_status["conditions"] = [
                _interned({key: c[key] for key in KEPT_CONDITION if key in c})
                for c in status["conditions"]
                if c.get("type") in KEPT_JOB_CONDITIONS
            ]
        kept["status"] = kept_status
    return kept


def folded_result(text: str) -> str:
    """``result.json`` with only the fields folding reads; unreadable text as it is."""
    try:
        result = json.loads(text)
    except ValueError:
        return text
    if not isinstance(result, dict):
        return text
    fields = (
        FOLDED_RESULT_FIELDS | SAVED_PLAN_FIELDS if result.get("planID") else FOLDED_RESULT_FIELDS
    )
    kept = {key: value for key, value in result.items() if key in fields}
    return json.dumps(kept, separators=(",", ":"))


def cache_result(obj: JSON) -> JSON:
    """A result ConfigMap as cached: metadata, the folded fields of ``result.json`` and the
    digest of all of it."""
    kept: JSON = {**_type(obj), "metadata": _metadata(obj.get("metadata") or {})}
    text = (obj.get("data") or {}).get(RESULT_KEY)
    if isinstance(text, str):
        kept[RESULT_DIGEST_KEY] = result_text_digest(obj)
        kept["data"] = {RESULT_KEY: folded_result(text)}
    return kept


def _sample_finished_run() -> tuple[JSON, JSON]:
    """A finished Job and its result as this module caches them, with placeholder values
    of the usual lengths."""
    stack, namespace, stack_uid = "app-stack", "default", "00000000-0000-4000-8000-000000000000"
    job_name, job_uid = "app-stack-up-0123456789", "00000000-0000-4000-8000-000000000001"
    at = "2026-01-01T00:00:00Z"
    # What the API server adds to every object.
    served = {"resourceVersion": "1000000", "generation": 1, "creationTimestamp": at}
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, STACK_LABEL: stack, OPERATION_LABEL: "up"}
    run = Run("up", "sync", 1, "", "0" * 40, "after::")
    job = cache_job(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name,
                "namespace": namespace,
                "uid": job_uid,
                **served,
                "labels": labels,
                "annotations": {
                    JOB_STACK_UID_ANNOTATION: stack_uid,
                    RUN_ANNOTATION: run.to_annotation(),
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": KIND,
                        "name": stack,
                        "uid": stack_uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"activeDeadlineSeconds": 3600},
            "status": {
                "failed": 1,
                "succeeded": 1,
                "startTime": at,
                "completionTime": at,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline",
                        "lastTransitionTime": at,
                    },
                    {
                        "type": "Complete",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastTransitionTime": at,
                    },
                ],
            },
        }
    )
    result = RunResult(
        operation="up",
        state="succeeded",
        reason="Succeeded",
        message="",
        stack=StackRef(name=stack, namespace=namespace, uid=stack_uid),
        job_name=job_name,
        generation=1,
        commit="0" * 40,
        end_time=at,
        permalink="",
        project_info=ProjectInfo(name="app", runtime="python"),
    )
    # As the runner writes it (``pkobatch.runner.result``), then served.
    written = result_config_map(
        result,
        name=job_name,
        namespace=namespace,
        labels=result_labels(labels, stack, "up"),
        job_uid=job_uid,
    )
    written["metadata"].update(uid="00000000-0000-4000-8000-000000000002", **served)
    configmap = cache_result(written)
    return job, configmap


PACKING_DICTIONARY: Final = b"".join(
    json.dumps(obj, separators=(",", ":")).encode() for obj in _sample_finished_run()
)
