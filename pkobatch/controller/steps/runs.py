"""Starting runs: one run at a time, whether a Stack's Job may be created at all, and the
Job a run gets (``controller.job_builder`` builds it).

Job names are deterministic per decision, so when a Job with the name a step would create
already exists and has finished (its result was never folded), ``start_run`` returns
``Refold`` and ``decide`` folds it instead of starting another run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pkobatch.api.constants import (
    EVENT_CONFIG_INVALID,
    EVENT_UPDATE_DETECTED,
    RECONCILING_PROCESSING_REASON,
    STALLED_SPEC_INVALID_REASON,
)
from pkobatch.api.objects import job_finished
from pkobatch.api.run import ProjectInfo, Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import Settings
from pkobatch.controller.fold import changes_stack
from pkobatch.controller.job_builder import RunObjects, build_run, job_name
from pkobatch.controller.outcome import POD_CREATION_GRACE
from pkobatch.controller.run_cache import (
    EVENT_RUN_CACHE_UNAVAILABLE,
    CacheChoice,
    cache_claim,
    choose_cache,
    mounts_cache,
)
from pkobatch.controller.run_pod import JobBuildError
from pkobatch.controller.run_snapshot import flux_artifact
from pkobatch.controller.steps.draft import (
    DONE,
    NEXT,
    Draft,
    Refold,
    StepResult,
    running_message,
)

# How often to look again while waiting for a free run slot (it sends no event of its own).
SLOT_RECHECK: Final = 30.0
# pkobatch's: a run starts from a Flux artifact that has neither a digest nor a checksum.
EVENT_ARTIFACT_UNVERIFIABLE: Final = "ArtifactUnverifiable"

# The run whose Job ``run_refusal`` builds to check a Stack (the pod does not depend on it).
_PROBE_RUN: Final = Run(
    operation="up", kind="sync", generation=0, reconcile_request="", commit="", trigger="check"
)


def one_run_at_a_time(draft: Draft) -> StepResult:
    """While any Job of the Stack is active, nothing else starts. DONE while the current
    run is active; a Job whose run is recorded (cancelled) but whose pod has not stopped yet
    is remembered in ``draft.stopping``: the steps decide as usual, only start nothing."""
    blocking = draft.blocking_job()
    if blocking is None:
        return NEXT
    name = str(blocking["metadata"]["name"])
    if name == draft.current_name():
        run = draft.run_of(name, blocking)
        if changes_stack(run):
            draft.reconciling(RECONCILING_PROCESSING_REASON, running_message(run, name))
        return DONE
    draft.stopping = name
    return NEXT


def run_allowed(draft: Draft) -> StepResult:
    """DONE (Stalled/SpecInvalid) when no Job of this Stack may be created
    (``run_refusal``, or the observer's answer to it)."""
    spec = draft.valid_spec()
    refusal = (
        draft.obs.run_check.refusal
        if draft.obs.run_check is not None
        else run_refusal(draft.obs.stack, spec, draft.settings, draft.template)
    )
    if refusal is None:
        return NEXT
    draft.stalled(STALLED_SPEC_INVALID_REASON, refusal, EVENT_CONFIG_INVALID)
    return DONE


def build(draft: Draft, run: Run) -> RunObjects:
    """The Job (and its run inputs) for ``run`` of the Stack; raises ``JobBuildError``."""
    spec = draft.valid_spec()
    project_info = None
    if draft.status.get("projectInfo"):
        try:
            project_info = ProjectInfo.model_validate(draft.status["projectInfo"])
        except ValueError:
            project_info = None
    return build_run(
        draft.obs.stack,
        spec,
        run,
        draft.settings.job,
        draft.template,
        project_info,
        insecure_http_git_hosts=draft.settings.insecure_http_git_hosts,
        source=draft.obs.source_object.obj if draft.obs.source_object else None,
        ended_runs=draft.ended_runs(),
        cache=_run_cache(draft),
    )


def _run_cache(draft: Draft) -> CacheChoice | None:
    """The run cache a new Job of the Stack gets; None when the run cache is disabled."""
    settings = draft.settings.run_cache
    if not settings.enabled:
        return None
    return choose_cache(draft.obs.run_cache_claim, settings, draft.obs.run_cache_in_use)


def _use_run_cache(draft: Draft, job: Mapping[str, Any], name: str) -> None:
    """The claim the new Job's cache needs, and why the Job runs without it (Warning)."""
    cache = _run_cache(draft)
    if cache is None or not mounts_cache(job):
        return
    if cache.create_claim:
        draft.decision.create_run_cache = cache_claim(draft.namespace, draft.settings.run_cache)
    if cache.warning:
        draft.event("Warning", EVENT_RUN_CACHE_UNAVAILABLE, f"run {name}: {cache.warning}")


def repair_inputs(draft: Draft, job: Mapping[str, Any], run: Run) -> None:
    """An adopted Job was created by a reconcile that may have stopped before its inputs:
    create them again (``AlreadyExists`` when they are there), if the spec is unchanged."""
    if draft.spec is None or run.generation != draft.generation:
        return
    try:
        objects = build(draft, run)
    except JobBuildError:
        return
    if objects.job["metadata"]["name"] == job["metadata"]["name"]:
        draft.decision.create_inputs = objects.inputs
        draft.decision.inputs_job = str(job["metadata"]["name"])


def start_run(draft: Draft, run: Run, reason: str) -> bool | Refold:
    """Decide the Job for ``run``: True when it is created, False when it cannot start now
    (the status says why; ``draft.start_refused`` when it never can as specified), Refold
    when a finished Job of its name exists."""
    name = job_name(draft.name, draft.uid, run)
    existing = draft.jobs.get(name)
    if existing is not None and job_finished(existing):
        return Refold(existing)
    if draft.stopping:
        draft.reconciling(
            RECONCILING_PROCESSING_REASON,
            f"waiting for run {draft.stopping} to stop before starting {run.operation}",
        )
        return False
    if not draft.obs.slot_available:
        draft.reconciling(
            RECONCILING_PROCESSING_REASON,
            "waiting for a free run slot (the controller's max_active_jobs is reached)",
        )
        draft.requeue_in(SLOT_RECHECK)
        return False
    try:
        objects = build(draft, run)
    except JobBuildError as exc:
        draft.start_refused = str(exc)
        draft.stalled(STALLED_SPEC_INVALID_REASON, draft.start_refused, EVENT_CONFIG_INVALID)
        return False
    if draft.obs.job_rejected:
        draft.start_refused = (
            f"the API server refused the run's Job: {draft.obs.job_rejected}. The Job "
            "carries the Stack's spec.workspaceTemplate and spec.jobTemplate (its pod, "
            "labels and annotations): change what the API server's message names"
        )
        draft.stalled(STALLED_SPEC_INVALID_REASON, draft.start_refused, EVENT_CONFIG_INVALID)
        return False
    draft.decision.create_job = objects.job
    draft.decision.create_inputs = objects.inputs
    draft.decision.inputs_job = name
    draft.decision.run = run
    draft.set_current(run, name)
    if changes_stack(run):
        draft.reconciling(RECONCILING_PROCESSING_REASON, running_message(run, name))
    draft.event("Normal", EVENT_UPDATE_DETECTED, f"{reason}: starting {run.operation} {name}")
    _warn_unverifiable_artifact(draft, name)
    _use_run_cache(draft, objects.job, name)
    # Neither the Job's creation nor its start wakes the Stack (``controller.echoes``): look
    # then whether it got a pod (``settle.fold_job``), as the next decision would ask.
    draft.look_at_pod_in(name, POD_CREATION_GRACE)
    return True


def _warn_unverifiable_artifact(draft: Draft, job: str) -> None:
    """A Warning Event when the run's Flux artifact carries nothing to verify it against."""
    source = draft.obs.source_object
    if draft.valid_spec().flux_source is None or source is None or source.obj is None:
        return
    artifact = flux_artifact(source.obj)
    if artifact is None or artifact.digest or artifact.checksum:
        return
    draft.event(
        "Warning",
        EVENT_ARTIFACT_UNVERIFIABLE,
        f"the artifact of {artifact.kind} {artifact.name} (revision {artifact.revision}) has "
        f"neither a digest nor a checksum: run {job} refuses it unless its environment has "
        "PKOBATCH_ALLOW_UNVERIFIED_ARTIFACTS=true, and then runs it unverified",
    )


def run_refusal(
    stack: Mapping[str, Any], spec: StackSpec, settings: Settings, template: Mapping[str, Any]
) -> str | None:
    """Why no Job of this Stack may be created (Flux source kind, Pod Security,
    ServiceAccount, git transport).

    Checked before the Stack waits for its source, so a Stack that can never run is Stalled
    at once, the branch poller never sends its credentials anywhere, and no watch of a Flux
    kind the controller does not accept is started.
    """
    flux = spec.flux_source
    if flux is not None and flux.source_ref.kind not in settings.flux_source_kinds:
        kind = flux.source_ref.kind
        return (
            f"spec.fluxSource.sourceRef.kind {kind!r} is not a Flux source kind this controller "
            f"reads ({', '.join(settings.flux_source_kinds)}): name one of them, or ask the "
            f"operator to add {kind} with the controller setting "
            f"PKOBATCH_EXTRA_FLUX_SOURCE_KINDS and to let the controller get, list and watch it"
        )
    try:
        build_run(
            stack,
            spec,
            _PROBE_RUN,
            settings.job,
            template,
            insecure_http_git_hosts=settings.insecure_http_git_hosts,
        )
    except JobBuildError as exc:
        return str(exc)
    return None
