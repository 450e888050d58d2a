"""What the reconcile's decision reads and what it returns (``controller.decide``).

``Observed`` is everything ``decide`` may look at, read by ``controller.observe`` from the
stores (plus a few live reads); ``Decision`` is what it decided for one Stack, which
``controller.act`` carries out. Both are plain data: no rule lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pkobatch.api.objects import JSON
from pkobatch.api.run import Run
from pkobatch.api.status import StatusObject
from pkobatch.controller.outcome import Event, Outcome


@dataclass(frozen=True)
class SourceHead:
    """The polled head of the branch a Stack tracks (``commit`` None: not known yet)."""

    commit: str | None = None
    error: str = ""
    # The error is the git server's (or GitHub's) refusal of the credentials.
    credentials_refused: bool = False


@dataclass(frozen=True)
class SourceObject:
    """The Program (or Flux source) a Stack names; ``obj`` None: it does not exist."""

    kind: str
    name: str
    obj: Mapping[str, Any] | None = None
    # False while the watch of a Flux kind has not listed yet (obj None means nothing then).
    watched: bool = True
    # Why listing or watching the Flux kind last failed ("" when it did not).
    error: str = ""


@dataclass(frozen=True)
class RunCheck:
    """``steps.runs.run_refusal``'s answer for the observed Stack (its spec valid), with the
    controller's settings and template: None when its Job may be created."""

    refusal: str | None


@dataclass(frozen=True)
class Observed:
    """Everything ``decide`` may look at, read from the stores (and a few live reads)."""

    stack: Mapping[str, Any]
    jobs: Sequence[Mapping[str, Any]]
    # The Stack's result ConfigMaps by name (name == Job name).
    results: Mapping[str, Mapping[str, Any]]
    now: datetime
    # For a Stack tracking a branch; None when the Stack tracks none.
    source: SourceHead | None = None
    # For a Stack with spec.programRef (or spec.fluxSource): the object it names.
    source_object: SourceObject | None = None
    # The Stacks named in spec.prerequisites (None: does not exist).
    prerequisites: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    # Name -> prerequisites' names of the Stacks in the store reachable through
    # spec.prerequisites, to find a cycle among them.
    prerequisite_graph: Mapping[str, Sequence[str]] = field(default_factory=dict)
    namespace_terminating: bool = False
    # False when the cluster-wide cap of active Jobs is reached (see reconcile.Admission).
    slot_available: bool = True
    # The API server's message when it refused the Job this decision creates.
    job_rejected: str = ""
    # Job name -> why the Job controller cannot create its pod (its FailedCreate Event);
    # asked only for the current Job when it has no pod (see fold.job_without_pod).
    pod_creation_failures: Mapping[str, str] = field(default_factory=dict)
    # Job name -> its pods; read only for the current Job: once it has finished (its pod
    # vouches for its result, fold.trusted_result), or when they alone can tell why it cannot
    # start (see fold.pod_status_matters).
    run_pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    # The Stack's managedFields, read live only when it approves its pending plan (they name
    # the approver; the cache drops them).
    managed_fields: Sequence[Mapping[str, Any]] = ()
    # ``run_refusal``'s answer when the observer has already asked it (to decide whether to
    # poll the branch): building the probe Job is the costliest step of a reconcile, so it
    # is done once. None: ``decide`` asks itself.
    run_check: RunCheck | None = None
    # With the run cache enabled (``controller.run_cache``): the namespace's cache claim from
    # the controller's watch (None: it does not exist), and whether an active run of the
    # namespace mounts it.
    run_cache_claim: Mapping[str, Any] | None = None
    run_cache_in_use: bool = False


@dataclass(frozen=True)
class JobDeletion:
    name: str
    uid: str
    # Foreground for a cancelled run: the Job stays (and blocks new runs) until its pod
    # is gone, so two Pulumi processes never work on one stack.
    foreground: bool = False


@dataclass(frozen=True)
class FinishedRun:
    """A run folded in this reconcile (for metrics and for waking dependent Stacks)."""

    run: Run
    job_name: str
    outcome: Outcome
    started_at: datetime | None


@dataclass(frozen=True)
class PodCheck:
    """The decision's ``requeue_after`` is only to look at Job ``job``'s pod (whether the Job
    controller created it, whether it started). Once the Job shows its pod ready that look
    is moot, and ``otherwise`` is when the decision needs the Stack back (seconds; None: only
    on a change)."""

    job: str
    otherwise: float | None


@dataclass
class Decision:
    """What ``decide`` decided for one Stack; ``controller.act`` carries it out."""

    status: StatusObject | None
    """The desired status; None: leave status alone (the Stack is going away)."""
    finalizer: Literal["add", "remove"] | None = None
    create_job: JSON | None = None
    # What the pod of the new (or an adopted) Job reads besides the Job: inline secret values,
    # a large snapshot. Created after the Job, owned by it.
    create_inputs: tuple[JSON, ...] = ()
    inputs_job: str = ""
    # The namespace's run cache claim, created before the Job when it does not exist.
    create_run_cache: JSON | None = None
    run: Run | None = None
    delete_jobs: list[JobDeletion] = field(default_factory=list)
    delete_results: list[str] = field(default_factory=list)
    # Result ConfigMaps of runs that sent their result in their pod's termination message
    # (they may not write it): created before the status that folds them.
    create_results: list[JSON] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Prerequisite Stack name -> new value of its reconciliation-request annotation.
    prerequisite_requests: dict[str, str] = field(default_factory=dict)
    finished: list[FinishedRun] = field(default_factory=list)
    requeue_after: float | None = None
    pod_check: PodCheck | None = None
    # Set when deciding failed (see ``decide``): the error, for the controller's log.
    error: str = ""
    # The status as decided, also when ``status`` is None because the Stack is released:
    # notifications compare it with the old one (a destroy on deletion is an event too).
    decided_status: StatusObject | None = None
