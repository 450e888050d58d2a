"""Reviewing saved plans (``spec.approval``, docs/api.md): ``plan``, ``approve``, ``reject``.

``approve`` writes the annotation ``pkobatch.io/approve: <plan id>`` (``reject``:
``pkobatch.io/reject``), the controller answers in ``status.approval``. The annotation is
written under the field manager ``pkobatch-cli:<user>``, the user the API server
authenticated (a ``SelfSubjectReview``), which the controller records as the approver. The
functions that read a Stack are pure; the waiting is ``follow.wait_for``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import click

from pkobatch.api.constants import APPROVE_ANNOTATION, FIELD_MANAGER_CLI, REJECT_ANNOTATION
from pkobatch.api.objects import JSON
from pkobatch.cli.actions import print_outcomes, wait_option
from pkobatch.cli.fetch import complete_stack_names, get_stack
from pkobatch.cli.follow import wait_for
from pkobatch.cli.requests import Progress, RequestOutcome, outcome, set_annotation
from pkobatch.cli.session import CommandFailed, Session, command, exit_failed
from pkobatch.cli.stack_views import stack_view
from pkobatch.kube.client import SELF_SUBJECT_REVIEWS, Kube, KubeError

# The API server's limit on a field manager's name.
MAX_FIELD_MANAGER: Final = 128


def approval_record(stack: Mapping[str, Any]) -> Mapping[str, Any]:
    record = (stack.get("status") or {}).get("approval")
    return record if isinstance(record, Mapping) else {}


def pending_record(stack: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The plan that awaits approval; ``CommandFailed`` saying why there is none."""
    if not ((stack.get("spec") or {}).get("approval") or {}).get("required"):
        raise CommandFailed(f"stack {name} does not require approval (spec.approval.required)")
    record = approval_record(stack)
    if record.get("state") != "Pending":
        state = record.get("state") or "none yet"
        raise CommandFailed(
            f"stack {name} has no plan awaiting approval (last plan: {record.get('planID') or '-'}"
            f", {state}{': ' + str(record.get('message')) if record.get('message') else ''})"
        )
    return record


def chosen_plan(record: Mapping[str, Any], plan: str | None, name: str) -> str:
    pending = str(record.get("planID") or "")
    if plan and plan != pending:
        raise CommandFailed(
            f"plan {plan} is not the plan awaiting approval on stack {name} ({pending}); see "
            f"`pkobatch plan {name}`"
        )
    return pending


def plan_lines(name: str, record: Mapping[str, Any]) -> list[str]:
    """What a reviewer reads: the plan, what it changes, where it came from."""
    lines = [
        f"plan {record.get('planID')} for stack {name}: {record.get('summary')}",
        f"state: {record.get('state')}",
        f"commit: {record.get('commit') or '-'}",
        f"trigger: {record.get('trigger') or '-'}",
        f"preview: {record.get('previewJob') or '-'}",
    ]
    resources = record.get("resources") or []
    if resources:
        lines.append("changes:")
        lines += [f"  {item.get('op')}: {item.get('urn')}" for item in resources]
        more = int(record.get("resourceCount") or 0) - len(resources)
        if more > 0:
            lines.append(f"  ... and {more} more")
    if record.get("approvedBy"):
        lines.append(f"approved by: {record.get('approvedBy')} ({record.get('approvedVia')})")
    if record.get("message"):
        lines.append(f"message: {record.get('message')}")
    return lines


def approval_progress(stack: Mapping[str, Any], plan: str) -> Progress:
    """Progress of the approval of ``plan``, read from ``status.approval``."""
    record = approval_record(stack)
    if record.get("planID") != plan:
        return Progress(
            phase="Superseded",
            done=True,
            failed_reason="Superseded",
            message=f"plan {plan} was replaced by plan {record.get('planID') or '-'} "
            f"({record.get('state')})",
        )
    state = str(record.get("state") or "")
    job = str(record.get("updateJob") or "")
    message = str(record.get("message") or "")
    if state == "Applied":
        return Progress(phase="Succeeded", job_name=job, done=True, message=message)
    if state in ("Failed", "Rejected", "Superseded"):
        return Progress(phase=state, job_name=job, done=True, failed_reason=state, message=message)
    if state == "Approved":
        return Progress(phase="Running", job_name=job)
    return Progress(phase="Waiting for the controller")


def rejection_progress(stack: Mapping[str, Any], plan: str) -> Progress:
    """Progress of the rejection of ``plan``: done once ``status.approval`` records it
    Rejected (or the plan ended otherwise first)."""
    record = approval_record(stack)
    if record.get("planID") == plan and record.get("state") == "Rejected":
        return Progress(phase="Succeeded", done=True, message=str(record.get("message") or ""))
    progress = approval_progress(stack, plan)
    if progress.done or progress.phase == "Running":
        # Applied, failed, superseded, or approved (its update runs) before the rejection.
        return Progress(
            phase="Failed",
            job_name=progress.job_name,
            done=True,
            failed_reason=progress.failed_reason or "Approved",
            message=progress.message or f"plan {plan} was approved before it was rejected",
        )
    return progress


def approver_field_manager(kube: Kube) -> str:
    """``pkobatch-cli:<user>`` for the user the API server authenticated; ``pkobatch-cli``
    when it will not say (the controller then records that name)."""
    try:
        review = kube.create(
            SELF_SUBJECT_REVIEWS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    except KubeError:
        return FIELD_MANAGER_CLI
    user = str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")
    manager = f"{FIELD_MANAGER_CLI}:{user}" if user else FIELD_MANAGER_CLI
    return "".join(c for c in manager if c.isprintable())[:MAX_FIELD_MANAGER]


@command(
    "plan",
    short_help="Show the plan awaiting approval: summary and changes per resource.",
    epilog="""\b
Examples:
  pkobatch plan web
  pkobatch plan web -o json""",
)
@click.argument("name", shell_complete=complete_stack_names)
def plan_command(name: str) -> None:
    """Print the Stack's last saved plan (spec.approval): its id, what it changes (per
    resource), the commit it was made at and what triggered it. Exit 1 when no plan awaits
    approval."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    record = approval_record(stack)
    if session.output in ("json", "yaml"):
        session.print_data(dict(record))
    elif record:
        session.print_lines(plan_lines(name, record))
    if record.get("state") != "Pending":
        pending_record(stack, name)


@command(
    "approve",
    short_help="Approve the plan awaiting approval; its update runs exactly that plan.",
    epilog="""\b
Examples:
  pkobatch approve web
  pkobatch approve web --plan plan-3f9a1c0d5e7b2a4c6d8e --yes --no-wait""",
)
@click.argument("name", shell_complete=complete_stack_names)
@click.option("--plan", "plan", metavar="ID", help="Approve only if this plan is the pending one.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@wait_option("the update")
def approve_command(name: str, plan: str | None, yes: bool, wait: bool) -> None:
    """Show the pending plan, ask, and approve it (annotation pkobatch.io/approve). The
    update then runs `pulumi up --plan` with exactly that plan; if the stack or the program
    no longer match it, the update fails (PlanMismatch) and a new plan awaits approval. The
    command follows the update and exits 1 if it failed or the plan was superseded."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    record = pending_record(stack, name)
    plan_id = chosen_plan(record, plan, name)
    for line in plan_lines(name, record):
        session.progress(line)
    if not yes:
        try:
            answer = click.confirm(f"Apply plan {plan_id}?", default=False, err=True)
        except click.Abort:
            raise click.UsageError("approve needs confirmation: answer, or pass --yes") from None
        if not answer:
            raise CommandFailed("not approved: nothing changes")
    _decide(
        session,
        stack,
        "approve",
        plan_id,
        approval_progress,
        wait=wait,
        field_manager=approver_field_manager(session.kube),
    )


@command(
    "reject",
    short_help="Discard the plan awaiting approval; nothing runs until something changes.",
    epilog="""\b
Examples:
  pkobatch reject web --plan plan-3f9a1c0d5e7b2a4c6d8e""",
)
@click.argument("name", shell_complete=complete_stack_names)
@click.option("--plan", "plan", metavar="ID", help="Reject only if this plan is the pending one.")
@wait_option("the rejection")
def reject_command(name: str, plan: str | None, wait: bool) -> None:
    """Reject the pending plan (annotation pkobatch.io/reject): the controller discards it
    and runs nothing until the spec, the source or the reconcile request changes. The
    command waits until the controller has discarded it."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    plan_id = chosen_plan(pending_record(stack, name), plan, name)
    _decide(session, stack, "reject", plan_id, rejection_progress, wait=wait)


def _decide(
    session: Session,
    stack: JSON,
    decision: str,
    plan_id: str,
    progress: Callable[[Mapping[str, Any], str], Progress],
    *,
    wait: bool,
    field_manager: str = FIELD_MANAGER_CLI,
) -> None:
    """Write ``decision`` (approve, reject) on ``plan_id``, follow it to its end unless told
    not to (an approval's update with its output), print the outcome, exit 1 if it failed."""
    annotation = APPROVE_ANNOTATION if decision == "approve" else REJECT_ANNOTATION
    stack, _ = set_annotation(session.kube, stack, annotation, plan_id, field_manager=field_manager)
    view = stack_view(stack)
    result = RequestOutcome(view.namespace, view.name, decision, plan_id, "requested")
    if wait:
        stack, found = wait_for(
            session,
            stack,
            lambda s: progress(s, plan_id),
            label=f"{decision} {view.namespace}/{view.name} {plan_id}",
            show_logs=decision == "approve",
        )
        result = outcome(stack, decision, plan_id, found, None)
    print_outcomes(session, [result], single=True)
    if not result.ok:
        exit_failed()
