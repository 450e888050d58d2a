"""PKO v2.9's ``auto.pulumi.com/v1alpha1`` Update: its schema, for the CRD.

An Update asks for one Pulumi operation (``spec.type``) on one stack of a Workspace. Its
status follows PKO's update controller: ``startTime``/``endTime``, the operation's
``message`` and ``permalink``, the name of the Secret holding the outputs (``outputs``,
``<update>-stack-outputs``), and the conditions Progressing, Failed and Complete.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

from pkobatch.api.crd_hints import INT32, map_list
from pkobatch.api.run import ProjectInfo
from pkobatch.api.stack.base import ApiModel, Int64, LooseTime
from pkobatch.api.stack.status import Condition

UPDATE_KIND: Final = "Update"
UPDATE_LIST_KIND: Final = "UpdateList"
UPDATE_PLURAL: Final = "updates"
UPDATE_SINGULAR: Final = "update"


class UpdateSpec(ApiModel):
    continue_on_error: bool | None = Field(
        default=None, description="Keep going after a resource fails."
    )
    expect_no_changes: bool | None = Field(
        default=None, description="Fail if the operation would change anything."
    )
    message: str | None = Field(default=None, description="Message of the update.")
    parallel: Annotated[int, INT32] | None = Field(
        default=None, description="Resource operations run in parallel."
    )
    refresh: bool | None = Field(default=None, description="Refresh before the operation.")
    remove: bool | None = Field(
        default=None, description="Remove the stack from the backend after a destroy."
    )
    replace: list[str] | None = Field(default=None, description="URNs to replace.")
    run_program: bool | None = Field(
        default=None, description="Run the program during destroy or refresh."
    )
    stack_name: str | None = Field(default=None, description="The stack of the workspace.")
    target: list[str] | None = Field(default=None, description="URNs to operate on.")
    target_dependents: bool | None = Field(
        default=None, description="Also operate on the targets' dependents."
    )
    ttl_after_completed: str | None = Field(
        default=None, description="Delete the Update this long after it completed (e.g. 1h)."
    )
    type: str | None = Field(default=None, description="preview, up, destroy or refresh.")
    workspace_name: str | None = Field(default=None, description="The Workspace to run in.")


class UpdateStatus(ApiModel):
    conditions: Annotated[list[Condition], map_list("type")] | None = Field(
        default=None, description="Progressing, Failed and Complete."
    )
    end_time: LooseTime | None = Field(default=None, description="When the update ended.")
    message: str | None = Field(default=None, description="Result message of the update.")
    observed_generation: Int64 | None = Field(
        default=None, description="Generation the status was set for."
    )
    outputs: str | None = Field(
        default=None, description="Name of the Secret holding the stack's outputs."
    )
    permalink: str | None = Field(default=None, description="Pulumi Cloud URL of the update.")
    project_info: ProjectInfo | None = Field(default=None, description="Project name and runtime.")
    start_time: LooseTime | None = Field(default=None, description="When the update started.")
