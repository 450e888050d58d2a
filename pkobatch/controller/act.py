"""Act: carry out a ``Decision`` with as few API writes as possible.

Order: finalizer added → the namespace's run cache claim created (once per namespace, when
the run cache is enabled and it is missing) → Job created → its inputs created → status
written → old Jobs and results deleted → finalizer removed → Events queued (the recorder
posts them from its own thread, ``controller.events``) → prerequisites poked. The Job comes
before the status that names it, so status never points at a Job that was never made; if the
status write then fails, the next reconcile adopts the Job (deterministic names make a second
create an ``AlreadyExists``).

A run's inputs (its Secret of inline secret values, the ConfigMaps of a large snapshot) are
created after the Job because they are owned by it (the garbage collector removes them with
it), which needs the Job's UID; the pod waits for them. They are created again after an
``AlreadyExists`` of the Job, so a crash between the two writes is repaired by the retry.

Status is written only when it changed, as a JSON merge patch of the difference on the
status subresource, with field manager ``pkobatch-controller`` and the observed
``resourceVersion`` as a precondition: a write computed from a stale cache fails with a
conflict instead of overwriting newer status (the reconcile is then retried). Each Stack
version a write replaces is reported to ``on_stack_written`` (the reconciler then waits for
its cache to show the new one: ``reconcile.OwnWrites``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pkobatch.api.constants import (
    FIELD_MANAGER_CONTROLLER,
    FINALIZER,
    RECONCILE_REQUEST_ANNOTATION,
    SHARD_LABEL,
)
from pkobatch.api.objects import JSON
from pkobatch.controller.decision import Decision
from pkobatch.controller.events import EventRecorder
from pkobatch.controller.job_builder import owned_by_job
from pkobatch.controller.sharding import Relabel
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    PERSISTENTVOLUMECLAIMS,
    PROGRAMS,
    SECRETS,
    STACKS,
    AlreadyExists,
    Forbidden,
    Invalid,
    Kube,
    KubeError,
    NotFound,
)

log = logging.getLogger(__name__)


class NamespaceTerminating(Exception):
    """The Job cannot be created: its namespace is being deleted."""


class JobRejected(Exception):
    """The API server refused the Job (e.g. an invalid pod template from the Stack)."""


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns ``old`` into ``new`` (``{}`` when equal)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: JSON = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif isinstance(value, Mapping) and isinstance(old[key], Mapping):
            nested = merge_patch(old[key], value)
            if nested != {}:
                patch[key] = nested
        elif old[key] != value:
            patch[key] = value
    return patch


# The cause the API server's NamespaceLifecycle admission gives for a create in a namespace
# being deleted (k8s.io/api/core/v1 NamespaceTerminatingCause).
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"


StackWriting = Callable[[str, str, str], None]
"""Called with (namespace, name, the resourceVersion a write is about to replace), before
the write: its watch event may arrive before its response."""


class Actor:
    def __init__(
        self, kube: Kube, events: EventRecorder, on_stack_writing: StackWriting | None = None
    ) -> None:
        self._kube = kube
        self._events = events
        self._on_stack_writing = on_stack_writing

    def _replacing(self, namespace: str, name: str, old_version: str) -> None:
        """Report that a write is about to replace ``old_version`` of the Stack."""
        if self._on_stack_writing is not None:
            self._on_stack_writing(namespace, name, old_version)

    def create_run_cache(self, claim: JSON) -> None:
        """The namespace's run cache claim (``controller.run_cache``). A run never depends on
        it (this one has an emptyDir), so a refusal is logged, not raised."""
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        try:
            self._kube.create(PERSISTENTVOLUMECLAIMS, claim, namespace)
        except AlreadyExists:
            pass
        except KubeError as exc:
            log.warning("run cache claim %s/%s not created: %s", namespace, name, exc)

    def create_job(self, job: JSON, inputs: Sequence[JSON] = ()) -> None:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            created = self._kube.create(JOBS, job, namespace)
        except AlreadyExists:
            # The same decision was carried out before (crash, stale cache): adopt it.
            log.info("job %s/%s exists already", namespace, name)
            self.create_inputs(name, namespace, inputs)
            return
        except Forbidden as exc:
            if exc.has_cause(NAMESPACE_TERMINATING_CAUSE, "metadata.namespace"):
                raise NamespaceTerminating(exc.message) from exc
            raise
        except Invalid as exc:
            raise JobRejected(exc.message) from exc
        self.create_inputs(name, namespace, inputs, str(created["metadata"]["uid"]))

    def create_inputs(
        self, job_name: str, namespace: str, inputs: Sequence[JSON], job_uid: str = ""
    ) -> None:
        """The run inputs of Job ``job_name``, owned by it (those that exist are left alone)."""
        if not inputs:
            return
        if not job_uid:
            try:
                job_uid = str(self._kube.get(JOBS, job_name, namespace)["metadata"]["uid"])
            except NotFound:
                return  # the Job is gone: its inputs would be orphans
        for item in inputs:
            owned = owned_by_job(item, job_name, job_uid)
            with contextlib.suppress(AlreadyExists):
                self._kube.create(
                    SECRETS if item["kind"] == "Secret" else CONFIGMAPS, owned, namespace
                )

    def relabel(self, namespace: str, relabels: Sequence[Relabel]) -> None:
        """Move a Stack's Jobs and results into its shard's watches (``sharding.handover``)."""
        for item in relabels:
            with contextlib.suppress(NotFound):
                self._kube.merge_patch(
                    JOBS if item.kind == "Job" else CONFIGMAPS,
                    item.name,
                    {"metadata": {"labels": {SHARD_LABEL: item.shard}}},
                    namespace,
                    field_manager=FIELD_MANAGER_CONTROLLER,
                )

    def record_program_status(self, namespace: str, name: str, status: JSON) -> None:
        """Write a Program's ``status`` (``program_artifacts.program_status``); a Program
        deleted meanwhile needs none."""
        with contextlib.suppress(NotFound):
            self._kube.merge_patch(
                PROGRAMS,
                name,
                {"status": status},
                namespace,
                subresource="status",
                field_manager=FIELD_MANAGER_CONTROLLER,
            )

    def apply(self, stack: Mapping[str, Any], decision: Decision) -> None:
        """Everything in ``decision`` except the Job creation (see ``create_job``)."""
        meta = stack.get("metadata") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        resource_version = str(meta.get("resourceVersion") or "")
        if decision.finalizer == "add":
            finalizers = [*(meta.get("finalizers") or []), FINALIZER]
            self._replacing(namespace, name, resource_version)
            updated = self._kube.merge_patch(
                STACKS,
                name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}},
                namespace,
                field_manager=FIELD_MANAGER_CONTROLLER,
            )
            resource_version = str(updated["metadata"]["resourceVersion"])
        for result in decision.create_results:
            with contextlib.suppress(AlreadyExists):
                self._kube.create(CONFIGMAPS, result, namespace)
        if decision.status is not None:
            patch = merge_patch(stack.get("status") or {}, decision.status)
            if patch:
                self._replacing(namespace, name, resource_version)
                updated = self._kube.merge_patch(
                    STACKS,
                    name,
                    {"metadata": {"resourceVersion": resource_version}, "status": patch},
                    namespace,
                    subresource="status",
                    field_manager=FIELD_MANAGER_CONTROLLER,
                )
                resource_version = str(updated["metadata"]["resourceVersion"])
        for deletion in decision.delete_jobs:
            with contextlib.suppress(NotFound):
                self._kube.delete(
                    JOBS,
                    deletion.name,
                    namespace,
                    propagation="Foreground" if deletion.foreground else "Background",
                    uid=deletion.uid or None,
                )
        for result_name in decision.delete_results:
            with contextlib.suppress(NotFound):
                self._kube.delete(CONFIGMAPS, result_name, namespace)
        if decision.finalizer == "remove":
            finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            self._replacing(namespace, name, resource_version)
            self._kube.merge_patch(
                STACKS,
                name,
                {
                    "metadata": {
                        "finalizers": finalizers or None,
                        "resourceVersion": resource_version,
                    }
                },
                namespace,
                field_manager=FIELD_MANAGER_CONTROLLER,
            )
        for event in decision.events:
            self._events.post(stack, event.type, event.reason, event.message)
        for other, value in decision.prerequisite_requests.items():
            with contextlib.suppress(NotFound):
                self._kube.merge_patch(
                    STACKS,
                    other,
                    {"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: value}}},
                    namespace,
                    field_manager=FIELD_MANAGER_CONTROLLER,
                )
