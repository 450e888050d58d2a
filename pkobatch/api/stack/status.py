"""The Stack's status models, and the whole ``Stack`` object the CRD is generated from.

The controller writes status as JSON (``pkobatch.api.status`` types its sections); these
models describe the same fields for the CRD schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from pkobatch.api.crd_hints import CrdHint, map_list
from pkobatch.api.operation_request import RequestState
from pkobatch.api.run import ProjectInfo
from pkobatch.api.stack.base import ApiModel, FreeFormObject, Int64, LooseTime
from pkobatch.api.stack.spec import NotificationEvent, StackSpec


class StackUpdateState(ApiModel):
    generation: Int64 | None = Field(default=None, description="Generation the run was for.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value the run was for."
    )
    name: str | None = Field(default=None, description="Name of the run (the Job).")
    type: str | None = Field(default=None, description="up, preview, refresh or destroy.")
    state: str | None = Field(default=None, description="succeeded or failed.")
    message: str | None = Field(default=None, description="Error or summary of the run.")
    last_attempted_commit: str | None = Field(
        default=None, description="Source revision of the run."
    )
    last_successful_commit: str | None = Field(
        default=None, description="Last source revision that succeeded."
    )
    permalink: str | None = Field(default=None, description="Pulumi Cloud URL of the update.")
    last_resync_time: LooseTime | None = Field(
        default=None, description="When the result was recorded."
    )
    failures: Int64 | None = Field(
        default=None, description="Consecutive failures for this generation and request."
    )
    reason: str | None = Field(
        default=None,
        description="pkobatch: the run's result reason (Succeeded, InvalidSpec, ...).",
    )


class CurrentStackUpdate(ApiModel):
    generation: Int64 | None = Field(default=None, description="Generation being run.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value being run."
    )
    name: str | None = Field(default=None, description="Name of the running Job.")
    commit: str | None = Field(default=None, description="Source revision being run.")


_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class Condition(ApiModel):
    """metav1.Condition."""

    type: Annotated[str, CrdHint(extra={"maxLength": 316, "pattern": _CONDITION_TYPE})] = Field(
        description="Ready, Reconciling or Stalled."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: Annotated[int, CrdHint(extra={"format": "int64", "minimum": 0})] | None = (
        Field(default=None, description="Generation the condition was set for.")
    )
    last_transition_time: Annotated[LooseTime, CrdHint(extra={"format": "date-time"})] = Field(
        description="When the status last changed."
    )
    reason: Annotated[
        str, CrdHint(extra={"maxLength": 1024, "minLength": 1, "pattern": _CONDITION_REASON})
    ] = Field(description="CamelCase reason.")
    message: Annotated[str, CrdHint(extra={"maxLength": 32768})] = Field(
        description="Human-readable details."
    )


class OperationRequestStatus(ApiModel):
    """pkobatch: the controller's acknowledgement of pkobatch.io/operation-request."""

    request: str | None = Field(default=None, description="The annotation value handled.")
    operation: str | None = Field(
        default=None, description="up, preview, refresh, destroy, unlock or cancel."
    )
    state: RequestState | None = Field(
        default=None, description="Pending, Running, Succeeded, Failed or Rejected."
    )
    job_name: str | None = Field(default=None, description="The Job that ran (or was cancelled).")
    message: str | None = Field(default=None, description="Result or reason for rejection.")


class DriftCheckStatus(ApiModel):
    """pkobatch: the last scheduled drift check (spec.driftDetection)."""

    name: str | None = Field(default=None, description="The drift check's Job.")
    scheduled_time: LooseTime | None = Field(
        default=None, description="The schedule time the check ran for."
    )
    time: LooseTime | None = Field(default=None, description="When the check finished.")
    state: str | None = Field(default=None, description="succeeded or failed.")
    drifted_resources: Int64 | None = Field(
        default=None, description="Resources that differ from the last update."
    )
    message: str | None = Field(default=None, description="Error of a failed check.")


class PendingNotification(ApiModel):
    """pkobatch: an event not yet delivered to every receiver (written with the status
    change that caused it, removed per receiver after delivery or after the last retry)."""

    event: NotificationEvent = Field(description="The event kind.")
    time: LooseTime = Field(description="When the event happened.")
    summary: Annotated[str, CrdHint(extra={"maxLength": 1024})] = Field(
        description="One line about the event."
    )
    run: str | None = Field(default=None, description="The run (Job) the event is about.")
    operation: str | None = Field(default=None, description="The run's operation.")
    revision: str | None = Field(
        default=None, description="The source revision the event is about (the run's commit)."
    )
    receivers: dict[str, str] = Field(
        description="Receiver name -> type, for the receivers still to be sent to."
    )
    attempts: dict[str, int] | None = Field(
        default=None,
        description="Receiver name -> failed attempts so far (a restarted controller goes on "
        "counting).",
    )


class NotificationsStatus(ApiModel):
    """pkobatch: delivery state of spec.notifications (docs/notifications.md)."""

    pending: dict[str, PendingNotification] | None = Field(
        default=None, description="Event id -> the event, while some receiver still awaits it."
    )


class PlannedResource(ApiModel):
    """One resource of a saved plan and what the plan does to it."""

    urn: str = Field(description="The resource's URN.")
    op: str = Field(description="create, update, replace, delete, ... (Pulumi's step).")


class ApprovalStatus(ApiModel):
    """pkobatch: the saved plan of spec.approval, and what became of it."""

    plan_id: str | None = Field(
        default=None,
        alias="planID",
        description="Digest of the plan, the commit and the spec: what an approval names.",
    )
    state: (
        Literal[
            "Previewing",
            "Pending",
            "Approved",
            "Applied",
            "Failed",
            "Rejected",
            "Superseded",
            "PreviewFailed",
        ]
        | None
    ) = Field(
        default=None,
        description="Previewing, Pending, Approved (its update runs), Applied, Failed, Rejected, "
        "Superseded or PreviewFailed.",
    )
    summary: str | None = Field(default=None, description="What the plan changes, in short.")
    changes: dict[str, Int64] | None = Field(
        default=None, description="Operation counts of the plan, e.g. {create: 2, same: 1}."
    )
    resources: list[PlannedResource] | None = Field(
        default=None, description="The resources the plan changes (at most 100)."
    )
    resource_count: Int64 | None = Field(
        default=None, description="How many resources the plan changes in all."
    )
    commit: str | None = Field(default=None, description="Source revision the plan was made at.")
    generation: Int64 | None = Field(default=None, description="Generation of the preview.")
    reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value of the preview."
    )
    target: str | None = Field(
        default=None,
        description="What the plan is for: a digest of the spec (without approval), the "
        "reconcile request, the commit and the trigger; a new one supersedes the plan.",
    )
    trigger: str | None = Field(default=None, description="What asked for the change.")
    preview_job: str | None = Field(
        default=None, description="The preview Job; it owns the Secret that holds the plan."
    )
    plan_secret: str | None = Field(default=None, description="The Secret that holds the plan.")
    created_time: LooseTime | None = Field(default=None, description="When the plan was saved.")
    approved_by: str | None = Field(
        default=None,
        description="Who approved: the field manager that wrote the approval (managedFields).",
    )
    approved_via: str | None = Field(
        default=None,
        description="spec.approval.approvedPlan or the pkobatch.io/approve annotation.",
    )
    approved_time: LooseTime | None = Field(default=None, description="When it was approved.")
    update_job: str | None = Field(default=None, description="The update that runs the plan.")
    failures: Int64 | None = Field(default=None, description="Consecutive failed previews.")
    message: str | None = Field(default=None, description="What happened, or what to do.")


class StackStatus(ApiModel):
    observed_generation: Int64 | None = Field(
        default=None, description="Generation last processed."
    )
    observed_reconcile_request: str | None = Field(
        default=None, description="Reconcile-request annotation value last processed."
    )
    last_update: StackUpdateState | None = Field(default=None, description="The last run.")
    current_update: CurrentStackUpdate | None = Field(
        default=None, description="The run in progress."
    )
    outputs: dict[str, Any] | None = Field(
        default=None, description="Stack outputs; secret values are '[secret]'."
    )
    conditions: Annotated[list[Condition], map_list("type")] | None = Field(
        default=None, description="Ready, Reconciling and Stalled."
    )
    project_info: ProjectInfo | None = Field(
        default=None, description="Project name and runtime of the last successful run."
    )
    operation_request: OperationRequestStatus | None = Field(
        default=None, description="pkobatch: the last operation request handled."
    )
    last_schedule_time: LooseTime | None = Field(
        default=None, description="pkobatch: the last spec.schedule time a run started for."
    )
    last_drift_check: DriftCheckStatus | None = Field(
        default=None, description="pkobatch: the last drift check."
    )
    notifications: NotificationsStatus | None = Field(
        default=None, description="pkobatch: notifications not yet delivered."
    )
    approval: ApprovalStatus | None = Field(
        default=None, description="pkobatch: the saved plan of spec.approval."
    )


class Stack(ApiModel):
    api_version: str = Field(description="pulumi.com/v1")
    kind: str = Field(description="Stack")
    metadata: FreeFormObject = Field(description="Standard object metadata.")
    spec: StackSpec
    status: StackStatus | None = None
