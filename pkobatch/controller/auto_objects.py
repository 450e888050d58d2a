"""The I/O shell of PKO's Workspace and Update reconciles (the decisions are
``controller.auto_runs``): read the Update, its Workspace, its Job, that Job's result and
pods; then write the status, create the Job or the outputs Secret, delete an expired Update.

An Update's Job has a deterministic name (``job_builder.job_name`` of the Update's name, UID
and generation), so it is looked up by name — in the store, else live, since a Job just
created may not have reached the store — and a repeated decision meets ``AlreadyExists``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pkobatch.api.constants import FIELD_MANAGER_CONTROLLER
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import JSON, job_finished
from pkobatch.config import Settings
from pkobatch.controller.act import Actor, JobRejected
from pkobatch.controller.auto_runs import (
    UpdateDecision,
    UpdateObserved,
    decide_update,
    update_owner,
    update_run,
    workspace_status,
)
from pkobatch.controller.events import EventRecorder
from pkobatch.controller.job_builder import job_name
from pkobatch.controller.pod_causes import JOB_CONTROLLER_UID_LABEL
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    PODS,
    SECRETS,
    UPDATES,
    WORKSPACES,
    AlreadyExists,
    Forbidden,
    Invalid,
    Kube,
    NotFound,
    Resource,
)
from pkobatch.runtime.interfaces import ObjectKey, ReconcileResult
from pkobatch.runtime.store import Store

log = logging.getLogger(__name__)


class AutoObjects:
    """Reconciles Workspaces (their status) and Updates (one Job each)."""

    def __init__(
        self,
        kube: Kube,
        actor: Actor,
        events: EventRecorder,
        stores: tuple[Store, Store, Store],
        settings: Settings,
        template: Mapping[str, Any],
        clock: Callable[[], datetime],
    ) -> None:
        self._kube = kube
        self._actor = actor
        self._events = events
        self._workspaces, self._updates, self._jobs = stores
        self._settings = settings
        self._template = template
        self._clock = clock

    def reconcile_workspace(self, key: ObjectKey) -> ReconcileResult:
        workspace = self._workspaces.get(key.namespace, key.name)
        if workspace is None:
            return ReconcileResult()
        status = workspace_status(workspace, self._clock())
        if status is not None:
            self._patch_status(WORKSPACES, key, status)
        return ReconcileResult()

    def reconcile_update(self, key: ObjectKey) -> ReconcileResult:
        update = self._updates.get(key.namespace, key.name)
        if update is None:
            return ReconcileResult()
        spec = update.get("spec") or {}
        workspace = self._workspaces.get(key.namespace, str(spec.get("workspaceName") or ""))
        job = result = None
        pods: Sequence[JSON] = ()
        run = update_run(update)
        if run is not None:
            name = job_name(key.name, str(update["metadata"].get("uid", "")), run)
            job = self._cached_or_live(self._jobs, JOBS, key.namespace, name)
            if job is not None and job_finished(job):
                # Read whole: the store keeps only what a Stack's status folds of a result.
                result = self._kube.get_or_none(CONFIGMAPS, name, key.namespace)
                pods, _ = self._kube.list_objects(
                    PODS,
                    key.namespace,
                    label_selector=f"{JOB_CONTROLLER_UID_LABEL}={job['metadata'].get('uid')}",
                )
        observed = UpdateObserved(update, workspace, job, result, pods, self._clock())
        decision = decide_update(
            observed, self._settings.job, self._template, self._settings.insecure_http_git_hosts
        )
        self._act(key, update, decision)
        after = decision.requeue_after
        return ReconcileResult(requeue_after=after.total_seconds() if after else None)

    def _act(self, key: ObjectKey, update: Mapping[str, Any], decision: UpdateDecision) -> None:
        if decision.create is not None:
            try:
                self._actor.create_job(decision.create.job, decision.create.inputs)
            except JobRejected as error:
                log.warning("the Job of update %s was rejected: %s", key, error)
                decision.events.append(("Warning", "UpdateFailed", str(error)))
        if decision.outputs_secret is not None:
            try:
                self._kube.create(SECRETS, decision.outputs_secret, key.namespace)
            except AlreadyExists:
                pass
            except (Forbidden, Invalid) as error:
                # A retry cannot help (RBAC, the admission policy): the run's outcome is
                # recorded all the same, without the Secret, saying why.
                self._outputs_refused(decision, str(error))
        if decision.status is not None:
            self._patch_status(UPDATES, key, decision.status)
        if decision.delete_update:
            with contextlib.suppress(NotFound):
                self._kube.delete(UPDATES, key.name, key.namespace)
        for event_type, reason, message in decision.events:
            self._events.post(update_owner(update), event_type, reason, message)

    @staticmethod
    def _outputs_refused(decision: UpdateDecision, error: str) -> None:
        note = f"its outputs Secret could not be created: {error}"
        if decision.status is not None:
            decision.status.pop("outputs", None)
            decision.status["message"] = bound_message(f"{decision.status['message']}; {note}")
        decision.events.append(("Warning", "OutputsSecretFailed", note))

    def _cached_or_live(
        self, store: Store, resource: Resource, namespace: str, name: str
    ) -> JSON | None:
        cached = store.get(namespace, name)
        if cached is not None:
            return cached
        return self._kube.get_or_none(resource, name, namespace)

    def _patch_status(self, resource: Resource, key: ObjectKey, status: JSON) -> None:
        with contextlib.suppress(NotFound):
            self._kube.merge_patch(
                resource,
                key.name,
                {"status": status},
                key.namespace,
                subresource="status",
                field_manager=FIELD_MANAGER_CONTROLLER,
            )
