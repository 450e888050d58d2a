"""Observe: everything ``decide`` needs about one Stack, from the stores (plus rare live reads).

The stores are eventually consistent, and Jobs, ConfigMaps and Stacks arrive on separate
watches. Two gaps matter because ``decide`` would otherwise draw a wrong, irreversible
conclusion, so they are closed with a live ``get``:

- the Job named in ``status.currentUpdate`` is not in the store: it may just have been
  created (its watch event is behind the Stack's) — only a 404 makes it "vanished";
- that Job has finished but its result ConfigMap is not in the store: the runner wrote it
  before exiting, so only a 404 means "no result".

Only objects owned by this Stack's UID count: the Jobs of a deleted Stack that had the same
name are not adopted by its successor.

The current Job's pods are listed (by the Job controller's label, one small ``list``) once
the Job has finished — its result is folded only if its pod vouches for it
(``fold.trusted_result``), and its pod's status tells why a run without one failed (OOMKilled,
evicted, deadline) — and while it runs only when its pod has not become ready for
``pod_causes.FIXED_BY_SPEC_LIMIT``, the first start limit (image pull errors, unschedulable), or a
spec change supersedes it (whether its pod has started decides if the new spec replaces it):
``fold.pod_status_matters``. So a run costs one list when it is folded. A list that fails
fails the reconcile, which is retried, rather than folding a genuine result as untrusted.

When the current Job still has no pod some seconds after its creation
(``fold.job_without_pod``), the Job controller may be unable to create one. Its reason is
only in a ``FailedCreate`` Event on the Job, so the observer lists those Events for that
one Job (field selector on the Job's UID and the reason): one small ``list`` per Stack whose
Job is stuck, none for Jobs whose pod exists — no watch of all Events.

Whether the Stack's Job may be created at all (``steps.runs.run_refusal``: it builds a probe Job)
depends only on the spec, the settings and the template, so it is kept per Stack for its
UID and ``metadata.generation`` (the API server raises the generation on every spec change)
and asked again only when they change: a Stack is reconciled several times per run.

With the run cache enabled, the namespace's cache claim is read from the controller's watch
of the claims it labels (``Stores.run_caches``), and whether an active run mounts it from the
Job store: no API call per reconcile (``controller.run_cache``).

The Flux source a Stack names (``spec.fluxSource``) is read from the watch of its kind,
which the Stack needs only while it may run (``run_refusal`` also checks the kind against
the kinds the controller accepts): a refused Stack, one that names no Flux source any more,
and a deleted one release it, and a kind no Stack needs is no longer watched
(``pkobatch.runtime.on_demand_watches``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pkobatch.api.annotations import reconcile_request
from pkobatch.api.constants import FINALIZER, JOB_STACK_UID_ANNOTATION
from pkobatch.api.objects import JSON, job_finished, owned_by
from pkobatch.api.prerequisites import prerequisite_names
from pkobatch.api.stack.validation import load_stack_spec
from pkobatch.api.status import current_update, last_update
from pkobatch.config import Settings
from pkobatch.controller import approval
from pkobatch.controller.decision import Observed, RunCheck, SourceObject
from pkobatch.controller.outcome import job_without_pod, pod_status_matters
from pkobatch.controller.pod_causes import JOB_CONTROLLER_UID_LABEL
from pkobatch.controller.polling import GitPoller, poll_key
from pkobatch.controller.run_cache import claim_in_use
from pkobatch.controller.steps.runs import run_refusal
from pkobatch.controller.stores import StackKey, Stores, flux_source_resource
from pkobatch.kube.client import (
    CONFIGMAPS,
    CORE_EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    STACKS,
    Kube,
    KubeError,
    NotFound,
    Resource,
)

log = logging.getLogger(__name__)


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def of_stack(obj: Mapping[str, Any], uid: str) -> bool:
    """``obj`` is a run of the Stack with ``uid``: owned by it, or (a Job the garbage
    collector must not tie to the Stack) annotated with its UID."""
    meta = obj.get("metadata") or {}
    return (meta.get("annotations") or {}).get(JOB_STACK_UID_ANNOTATION) == uid or owned_by(
        obj, uid
    )


def run_awaited_for(stack: Mapping[str, Any]) -> tuple[int, str] | None:
    """The change (generation, reconcile request) that still awaits its run — neither the
    last run, the one in progress nor a saved plan (``status.approval``) was for it — else
    None. Such a run uses a branch head
    fetched after the change was seen (``GitPoller.head(fresh_for=...)``), as PKO's
    per-reconcile ``ls-remote`` does."""
    meta = stack.get("metadata") or {}
    status = stack.get("status")
    change = (int(meta.get("generation") or 0), reconcile_request(stack))
    saved_plan = status.get("approval") if isinstance(status, Mapping) else None
    for recorded in (
        last_update(status),
        current_update(status),
        saved_plan if isinstance(saved_plan, Mapping) else {},
    ):
        if (recorded.get("generation"), str(recorded.get("reconcileRequest") or "")) == change:
            return None
    return change


class Observer:
    def __init__(
        self,
        kube: Kube,
        stores: Stores,
        poller: GitPoller,
        settings: Settings,
        template: Mapping[str, Any],
    ) -> None:
        self._kube = kube
        self._stores = stores
        self._poller = poller
        self._settings = settings
        self._template = template
        # StackKey -> (uid, generation, answer) of the last run check (``_run_check``).
        self._run_checks: dict[StackKey, tuple[str, int, RunCheck | None]] = {}

    def forget(self, key: StackKey) -> None:
        """``key`` is gone or out of scope: stop polling its branch and watching its source."""
        self._poller.forget(key)
        self._release_flux_source(key)
        self._run_checks.pop(key, None)

    def observe(self, key: StackKey, now: datetime) -> Observed | None:
        """What ``decide`` needs about ``key``; None when the Stack does not exist."""
        stack = self._stores.stacks.get(key.namespace, key.name)
        if stack is None:
            self.forget(key)
            return None
        meta = stack.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        spec = stack.get("spec") or {}
        jobs = {
            str(job["metadata"]["name"]): job
            for job in self._stores.jobs.for_owner(key.namespace, key.name)
            if job.get("kind", "Job") == "Job" and of_stack(job, uid)
        }
        results = {
            str(cm["metadata"]["name"]): cm
            for cm in self._stores.configmaps.for_owner(key.namespace, key.name)
        }
        current = str(current_update(stack.get("status")).get("name") or "")
        if current and current not in jobs:
            live = self._get(JOBS, current, key.namespace)
            if live is not None and of_stack(live, uid):
                jobs[current] = live
        job = jobs.get(current)
        if job is not None and job_finished(job) and current not in results:
            live_result = self._get(CONFIGMAPS, current, key.namespace)
            if live_result is not None:
                results[current] = live_result
        pod_creation_failures: dict[str, str] = {}
        run_pods: dict[str, list[JSON]] = {}
        if job is not None and job_without_pod(job, now):
            failure = self._failed_create(job)
            if failure:
                pod_creation_failures[current] = failure
        if job is not None and pod_status_matters(job, now, int(meta.get("generation") or 0)):
            run_pods[current] = self._pods_of(job)

        source = None
        run_check = self._run_check(key, stack)
        may_run = run_check is not None and run_check.refusal is None
        polled = poll_key(key.namespace, spec) if may_run else None
        if polled is None:
            self._poller.forget(key)
        else:
            resync = spec.get("resyncFrequencySeconds")
            # A suspended Stack starts no run; unsuspending it is a change of its own.
            awaited = None if spec.get("suspend") else run_awaited_for(stack)
            source = self._poller.head(key, polled, float(resync) if resync else None, awaited)

        prerequisites: dict[str, Mapping[str, Any] | None] = {}
        for name in prerequisite_names(spec):
            prerequisite = self._stores.stacks.get(key.namespace, name)
            if prerequisite is None and self._settings.shard_selector:
                # It may belong to another shard, whose Stacks this store does not hold.
                prerequisite = self._get(STACKS, name, key.namespace)
            prerequisites[name] = prerequisite

        managed_fields: list[JSON] = []
        if approval.names_pending_plan(stack):
            live_stack = self._get(STACKS, key.name, key.namespace)
            managed_fields = list(
                ((live_stack or {}).get("metadata") or {}).get("managedFields") or []
            )

        return Observed(
            stack=stack,
            source_object=self._source_object(key, spec, may_run),
            jobs=list(jobs.values()),
            results=results,
            now=now,
            source=source,
            prerequisites=prerequisites,
            prerequisite_graph=self._prerequisite_graph(key, spec),
            namespace_terminating=self._namespace_terminating(stack),
            pod_creation_failures=pod_creation_failures,
            run_pods=run_pods,
            managed_fields=managed_fields,
            run_check=run_check,
            **self._run_cache(key.namespace),
        )

    def _run_cache(self, namespace: str) -> dict[str, Any]:
        """The namespace's run cache claim and whether an active run mounts it, from the
        stores (no API call): ``Observed.run_cache_claim`` and ``run_cache_in_use``."""
        settings = self._settings.run_cache
        if not settings.enabled:
            return {}
        return {
            "run_cache_claim": self._stores.run_caches.get(namespace, settings.claim_name),
            "run_cache_in_use": claim_in_use(
                self._stores.jobs.list_unpacked(), namespace, settings.claim_name
            ),
        }

    def _prerequisite_graph(self, key: StackKey, spec: Mapping[str, Any]) -> dict[str, list[str]]:
        """The prerequisites of the Stacks in the store reachable from ``key``'s, by name
        (a Stack the store lacks, in another shard or missing, has none here)."""
        graph = {key.name: prerequisite_names(spec)}
        reached = list(graph[key.name])
        while reached:
            name = reached.pop()
            other = None if name in graph else self._stores.stacks.get(key.namespace, name)
            if other is not None:
                graph[name] = prerequisite_names(other.get("spec") or {})
                reached.extend(graph[name])
        return graph

    def _source_object(
        self, key: StackKey, spec: Mapping[str, Any], may_run: bool
    ) -> SourceObject | None:
        """The Program (spec.programRef) or Flux source (spec.fluxSource) the Stack names,
        from the watches (None: the Stack names neither). The watch of a Flux kind is needed
        only by a Stack that may run (``run_refusal`` checks the kind against the
        controller's accepted kinds): anything else releases the one it needed."""
        reference = spec.get("programRef")
        if isinstance(reference, Mapping) and reference.get("name"):
            self._release_flux_source(key)
            name = str(reference["name"])
            return SourceObject("Program", name, self._stores.programs.get(key.namespace, name))
        flux = spec.get("fluxSource")
        ref = flux.get("sourceRef") if isinstance(flux, Mapping) else None
        watches = self._stores.flux_sources
        if not may_run or not isinstance(ref, Mapping) or not ref.get("name") or watches is None:
            self._release_flux_source(key)
            return None
        kind, name = str(ref.get("kind")), str(ref["name"])
        found = watches.lookup(flux_source_resource(kind), key.namespace, name, key)
        return SourceObject(kind, name, found.obj, watched=found.synced, error=found.error)

    def _release_flux_source(self, key: StackKey) -> None:
        if self._stores.flux_sources is not None:
            self._stores.flux_sources.release(key)

    def _run_check(self, key: StackKey, stack: Mapping[str, Any]) -> RunCheck | None:
        """Whether the Stack's Job may be created (None: its spec is invalid). Only a Stack
        that could run gets its branch polled (with its git credentials)."""
        meta = stack.get("metadata") or {}
        uid, generation = str(meta.get("uid") or ""), int(meta.get("generation") or 0)
        known = self._run_checks.get(key)
        if generation and known is not None and known[:2] == (uid, generation):
            return known[2]
        answer = None
        check = load_stack_spec(stack.get("spec") or {}, str(meta.get("namespace")))
        if check.spec is not None and check.valid:
            answer = RunCheck(run_refusal(stack, check.spec, self._settings, self._template))
        if generation:
            self._run_checks[key] = (uid, generation, answer)
        return answer

    def _failed_create(self, job: Mapping[str, Any]) -> str:
        """The latest FailedCreate message the Job controller recorded on ``job`` ("": none)."""
        meta = job.get("metadata") or {}
        try:
            events, _ = self._kube.list_objects(
                CORE_EVENTS,
                str(meta.get("namespace")),
                field_selector=f"involvedObject.uid={meta.get('uid')},reason=FailedCreate",
            )
        except KubeError as exc:
            log.warning("cannot list the Events of job %s: %s", meta.get("name"), exc)
            return ""
        if not events:
            return ""
        latest = max(events, key=_event_time)
        return str(latest.get("message") or latest.get("note") or "")

    def _pods_of(self, job: Mapping[str, Any]) -> list[JSON]:
        """The pods of ``job`` (by the Job controller's label)."""
        meta = job.get("metadata") or {}
        pods, _ = self._kube.list_objects(
            PODS,
            str(meta.get("namespace")),
            label_selector=f"{JOB_CONTROLLER_UID_LABEL}={meta.get('uid')}",
        )
        return pods

    def _get(self, resource: Resource, name: str, namespace: str) -> JSON | None:
        try:
            return self._kube.get(resource, name, namespace)
        except NotFound:
            return None

    def _namespace_terminating(self, stack: Mapping[str, Any]) -> bool:
        """Only asked when it matters: a Stack being deleted that must run a destroy."""
        meta = stack.get("metadata") or {}
        spec = stack.get("spec") or {}
        if not meta.get("deletionTimestamp") or FINALIZER not in (meta.get("finalizers") or ()):
            return False
        if not (spec.get("destroyOnFinalize") or spec.get("destroyOnDelete")):
            return False
        try:
            namespace = self._kube.get(NAMESPACES, str(meta.get("namespace")))
        except KubeError:
            return False
        return bool(
            namespace.get("metadata", {}).get("deletionTimestamp")
            or (namespace.get("status") or {}).get("phase") == "Terminating"
        )
