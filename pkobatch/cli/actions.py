"""Commands that change something: request runs, reconcile, cancel, unlock, suspend and
resume.

Runs are requested through annotations the controller answers in the Stack's status
(``requests.py``); the CLI never creates Jobs itself, so a run it asks for obeys the same
rules (one run per Stack, suspension, RBAC of the run's ServiceAccount) as every other.

One wait rule, as ``flux reconcile``'s: every command that asks for a run (here, and
``approve``/``reject``) follows it to its end by default, and ``--no-wait`` only writes the
request (``wait_option``). ``--wait`` is still accepted, and changes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Final, TypeVar

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from pkobatch.api.constants import (
    OPERATION_REQUEST_ANNOTATION,
    OPERATIONS,
    RECONCILE_REQUEST_ANNOTATION,
)
from pkobatch.api.objects import JSON
from pkobatch.api.operation_request import request_value
from pkobatch.api.status import last_update
from pkobatch.cli.fetch import complete_stack_names, get_stack, list_runs, list_stacks
from pkobatch.cli.follow import wait_for
from pkobatch.cli.requests import (
    RequestOutcome,
    annotation_patch,
    new_token,
    operation_progress,
    outcome,
    patch_stack,
    reconcile_progress,
    resume_patch,
    set_annotation,
    suspend_patch,
)
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.session import CommandFailed, Session, command, exit_failed
from pkobatch.cli.stack_views import stack_view
from pkobatch.cli.text_format import changes_text, human_duration
from pkobatch.kube.client import Forbidden, KubeError

DEFAULT_CONCURRENCY: Final = 4
DecoratedCommand = TypeVar("DecoratedCommand", bound=Callable[..., Any])

OPERATION_SHORT_HELP: Final = {
    "up": "Run `pulumi up` on Stacks now.",
    "preview": "Run `pulumi preview` on Stacks now (changes nothing).",
    "refresh": "Run `pulumi refresh` on Stacks now.",
    "destroy": "Run `pulumi destroy` on Stacks now, then hold them.",
}
OPERATION_HELP: Final = {
    "up": "Run `pulumi up` on a Stack now (also releases a Stack held after a destroy).",
    "preview": "Run `pulumi preview` on a Stack now; nothing is changed.",
    "refresh": "Run `pulumi refresh` on a Stack now: update its state from the real resources.",
    "destroy": "Run `pulumi destroy` on a Stack now. The Stack is then held: no automatic "
    "up until its spec changes or `pkobatch up` is run.",
}


CONCURRENCY_OPTION: Final = click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Stacks in flight at once with -l/--all.",
)


def wait_option(what: str) -> Callable[[DecoratedCommand], DecoratedCommand]:
    """``--wait/--no-wait``: follow ``what`` to its end (the default), or only request it."""
    return click.option(
        "--wait/--no-wait",
        default=True,
        show_default=True,
        help=f"Follow {what} to its end, or only request it (--no-wait).",
    )


def _record(session: Session, stack: JSON, run: str) -> RunRecord | None:
    if not run:
        return None
    view = stack_view(stack)
    try:
        runs = list_runs(session.kube, view.namespace, view.name)
    except Forbidden:
        return None
    return next((r for r in runs if r.name == run), None)


def outcome_lines(result: RequestOutcome) -> list[str]:
    where = f"{result.namespace}/{result.name}"
    if result.result == "requested":
        return [f"{result.operation} requested for {where} ({result.request})"]
    details = [f"run {result.run}"] if result.run else []
    if result.duration is not None:
        details.append(human_duration(result.duration))
    head = f"{result.operation} {result.result}: {where}"
    lines = [head + (f" ({', '.join(details)})" if details else "")]
    if result.reason:
        lines.append(f"reason: {result.reason}")
    if result.message:
        lines.append(f"message: {result.message}")
    if result.changes:
        lines.append(f"changes: {changes_text(result.changes)}")
    return lines


def print_outcomes(session: Session, results: Sequence[RequestOutcome], *, single: bool) -> None:
    if session.output in ("json", "yaml"):
        data = [r.to_json() for r in results]
        session.print_data(data[0] if single else data)
    elif single:
        session.print_lines(outcome_lines(results[0]))
    else:
        rows = [
            [
                r.namespace,
                r.name,
                r.operation,
                r.result,
                r.reason,
                human_duration(r.duration) if r.duration is not None else "",
                r.run,
                r.message,
            ]
            for r in results
        ]
        headers = ["namespace", "name", "operation", "result", "reason", "duration", "run"]
        session.print_table([*headers, "message"], rows)


def _confirm_destroy(session: Session, stacks: Sequence[JSON]) -> None:
    names = ", ".join(
        f"{stack_view(s).namespace}/{stack_view(s).name} ({stack_view(s).stack})" for s in stacks
    )
    try:
        answer = click.confirm(
            f"Destroy every resource of {names}?", default=False, err=True, abort=False
        )
    except click.Abort:
        raise click.UsageError(
            "destroy needs confirmation: answer the prompt, or pass --yes"
        ) from None
    if not answer:
        raise CommandFailed("not confirmed: nothing was destroyed")


def request_and_wait(
    session: Session,
    stack: JSON,
    operation: str,
    *,
    wait: bool,
    show_logs: bool,
) -> RequestOutcome:
    value = request_value(operation, new_token())
    stack, replaced = set_annotation(session.kube, stack, OPERATION_REQUEST_ANNOTATION, value)
    view = stack_view(stack)
    if replaced:
        session.warn(f"{view.namespace}/{view.name}: replaced the pending request {replaced}")
    if not wait:
        return RequestOutcome(view.namespace, view.name, operation, value, "requested")
    stack, progress = wait_for(
        session,
        stack,
        lambda s: operation_progress(s, value),
        label=f"{operation} {view.namespace}/{view.name}",
        show_logs=show_logs,
    )
    return outcome(stack, operation, value, progress, _record(session, stack, progress.job_name))


def _stack_selection(function: DecoratedCommand) -> DecoratedCommand:
    """NAME, -l SELECTOR and --all: the parameters ``_select_stacks`` takes."""
    function = click.option(
        "--all",
        "all_stacks",
        is_flag=True,
        help="All Stacks in the namespace (or with -A, everywhere).",
    )(function)
    function = click.option(
        "-l", "--selector", metavar="SELECTOR", help="All Stacks matching this label selector."
    )(function)
    return click.argument("name", required=False, shell_complete=complete_stack_names)(function)


def _select_stacks(
    session: Session, name: str | None, selector: str | None, all_stacks: bool
) -> tuple[list[JSON], bool]:
    """The Stacks a command applies to, and whether it was one Stack named on the line."""
    given = sum([bool(name), bool(selector), all_stacks])
    if given != 1:
        raise click.UsageError("give exactly one of NAME, -l SELECTOR or --all")
    if name:
        if session.options.all_namespaces:
            raise click.UsageError("-A needs -l SELECTOR or --all, not a NAME")
        return [get_stack(session, name)], True
    stacks = list_stacks(session, selector)
    if not stacks:
        where = (
            "any namespace" if session.options.all_namespaces else f"namespace {session.namespace}"
        )
        what = f"matches -l {selector}" if selector else "exists"
        raise CommandFailed(f"no Stack {what} in {where}")
    return stacks, False


def _run_many(
    session: Session,
    stacks: Sequence[JSON],
    work: Callable[[JSON], RequestOutcome],
    concurrency: int,
) -> list[RequestOutcome]:
    """Apply ``work`` to every Stack, at most ``concurrency`` at a time, with a progress bar
    on stderr; an API error on one Stack becomes that Stack's outcome."""
    results: list[RequestOutcome] = []
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=session.err,
        disable=not session.err.is_terminal,
        transient=True,
    )

    def one(stack: JSON) -> RequestOutcome:
        view = stack_view(stack)
        try:
            return work(stack)
        except (KubeError, click.ClickException) as exc:
            message = exc.message if isinstance(exc, KubeError) else exc.format_message()
            return RequestOutcome(
                view.namespace, view.name, "", "", "error", message=" ".join(message.split())
            )

    with progress, ThreadPoolExecutor(max_workers=concurrency) as pool:
        task = progress.add_task("stacks", total=len(stacks))
        futures = [pool.submit(one, stack) for stack in stacks]
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            progress.advance(task)
            if not progress.disable:
                progress.console.print(
                    f"{result.namespace}/{result.name}: {result.result}", markup=False
                )
            else:
                session.progress(f"{result.namespace}/{result.name}: {result.result}")
    return sorted(results, key=lambda r: (r.namespace, r.name))


def _operation_command(operation: str) -> click.Command:
    confirm = " --yes" if operation == "destroy" else ""
    epilog = f"""\b
Examples:
  pkobatch {operation} web{confirm}
  pkobatch {operation} web{confirm} --no-wait
  pkobatch {operation} -l team=payments{confirm} --concurrency 8"""

    @command(
        operation,
        short_help=OPERATION_SHORT_HELP[operation],
        help=OPERATION_HELP[operation]
        + """

The controller runs the operation as a Job. The command follows the run, prints the
runner's output to stderr and the result to stdout, and exits 1 if the run failed or was
rejected; with --no-wait it only requests the run. With -l or --all it applies to many
Stacks, at most --concurrency at a time, and prints a summary table.""",
        epilog=epilog,
    )
    @_stack_selection
    @wait_option("the run")
    @CONCURRENCY_OPTION
    @click.option(
        "-y",
        "--yes",
        is_flag=True,
        hidden=operation != "destroy",
        help="Do not ask for confirmation.",
    )
    def run(
        name: str | None,
        selector: str | None,
        all_stacks: bool,
        wait: bool,
        concurrency: int,
        yes: bool,
    ) -> None:
        session = Session.current()
        session.require_output("table", "json", "yaml")
        stacks, single = _select_stacks(session, name, selector, all_stacks)
        if operation == "destroy" and not yes:
            _confirm_destroy(session, stacks)
        _apply_to_stacks(
            session,
            stacks,
            lambda stack, show_logs: request_and_wait(
                session, stack, operation, wait=wait, show_logs=show_logs
            ),
            single=single,
            concurrency=concurrency,
        )

    return run


def _apply_to_stacks(
    session: Session,
    stacks: Sequence[JSON],
    work: Callable[[JSON, bool], RequestOutcome],
    *,
    single: bool,
    concurrency: int,
) -> None:
    """Run ``work(stack, show_logs)`` on one Stack (its run's output shown) or many (a
    progress bar instead), print the outcomes, exit 1 unless all went well."""
    if single:
        results = [work(stacks[0], True)]
    else:
        results = _run_many(session, stacks, lambda stack: work(stack, False), concurrency)
    print_outcomes(session, results, single=single)
    if not all(r.ok for r in results):
        exit_failed()


OPERATION_COMMANDS: Final = tuple(_operation_command(op) for op in OPERATIONS)


# -- reconcile ----------------------------------------------------------------------------


@command(
    "reconcile",
    short_help="Re-run a Stack's normal operation now and wait for Ready.",
    epilog="""\b
Examples:
  pkobatch reconcile web
  pkobatch reconcile web --timeout 30m""",
)
@click.argument("name", shell_complete=complete_stack_names)
@wait_option("the run and Ready")
def reconcile_command(name: str, wait: bool) -> None:
    """Ask the controller to run the Stack's normal operation now (PKO's
    pulumi.com/reconciliation-request annotation, as `flux reconcile` does), follow the run,
    and exit 0 if the Stack is Ready, 1 if not."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    if stack_view(stack).suspended:
        raise CommandFailed(
            f"stack {name} is suspended: resume it first with `pkobatch resume {name}`"
        )
    token = new_token()
    _apply_to_stacks(
        session,
        [stack],
        lambda one, show_logs: reconcile_and_wait(
            session,
            one,
            annotation_patch(RECONCILE_REQUEST_ANNOTATION, token),
            token,
            "reconcile",
            wait=wait,
            show_logs=show_logs,
        ),
        single=True,
        concurrency=1,
    )


def reconcile_and_wait(
    session: Session,
    stack: JSON,
    request: JSON,
    token: str,
    asked: str,
    *,
    wait: bool,
    show_logs: bool,
) -> RequestOutcome:
    """Write ``request`` (which sets reconcile request ``token``), then follow the run it
    starts; the outcome names the run's operation (``asked`` until there is one)."""
    stack, _ = patch_stack(session.kube, stack, request)
    view = stack_view(stack)
    if not wait:
        return RequestOutcome(view.namespace, view.name, asked, token, "requested")
    stack, progress = wait_for(
        session,
        stack,
        lambda s: reconcile_progress(s, token),
        label=f"{asked} {view.namespace}/{view.name}",
        show_logs=show_logs,
    )
    record = _record(session, stack, progress.job_name)
    operation = (record.operation if record else "") or str(
        last_update(stack.get("status")).get("type") or asked
    )
    return outcome(stack, operation, token, progress, record)


# -- cancel -------------------------------------------------------------------------------


@command(
    "cancel",
    short_help="Stop a Stack's running run.",
    epilog="""\b
Examples:
  pkobatch cancel web""",
)
@click.argument("name", shell_complete=complete_stack_names)
@wait_option("the cancellation")
def cancel_command(name: str, wait: bool) -> None:
    """Cancel the run in progress: the controller deletes its Job (Pulumi gets the grace
    period to stop cleanly) and records the run as failed with reason Cancelled."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    if not stack_view(stack).current_run:
        raise CommandFailed(f"stack {name} has no run in progress")
    result = request_and_wait(session, stack, "cancel", wait=wait, show_logs=False)
    print_outcomes(session, [result], single=True)
    if not result.ok:
        exit_failed()


# -- unlock -------------------------------------------------------------------------------


def confirm_unlock(where: str, *, yes: bool) -> None:
    """Unless ``yes``: ask on a terminal, and refuse without one (a script says --yes)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.UsageError(
            "unlock needs confirmation and standard input is not a terminal: pass --yes"
        )
    try:
        answer = click.confirm(
            f"Remove the Pulumi lock of Stack {where}, whoever holds it?", default=False, err=True
        )
    except click.Abort:
        answer = False
    if not answer:
        raise CommandFailed("not confirmed: nothing was unlocked")


@command(
    "unlock",
    short_help="Release a Stack's Pulumi lock left by a killed update.",
    epilog="""\b
Examples:
  pkobatch unlock web
  pkobatch unlock web --yes --no-wait""",
)
@click.argument("name", shell_complete=complete_stack_names)
@wait_option("the unlock run")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def unlock_command(name: str, wait: bool, yes: bool) -> None:
    """Run `pulumi cancel` on the Stack's stack in a Job: the lock that an update killed
    without cleanup left is removed (on any backend), and the next run can start.

    `pulumi cancel` removes the lock whoever holds it (a `pulumi up` on a laptop, another
    cluster's run): unlock only when no update of the stack runs anywhere. The controller
    rejects the request while a run of this Stack is in progress (wait, or `pkobatch
    cancel` it first). The unlock changes no resource and not status.lastUpdate; its answer
    is status.operationRequest. It asks for confirmation on a terminal; elsewhere, pass
    --yes."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    confirm_unlock(f"{session.namespace}/{name}", yes=yes)
    stack = get_stack(session, name)
    running = stack_view(stack).current_run
    if running:
        raise CommandFailed(
            f"stack {name} has run {running} in progress: wait for it to finish, or stop it "
            f"with `pkobatch cancel {name}`, then unlock"
        )
    result = request_and_wait(session, stack, "unlock", wait=wait, show_logs=True)
    print_outcomes(session, [result], single=True)
    if not result.ok:
        exit_failed()


# -- suspend / resume ---------------------------------------------------------------------


@command(
    "suspend",
    short_help="Stop starting new runs of Stacks (a running one finishes).",
    epilog="""\b
Examples:
  pkobatch suspend web
  pkobatch suspend --all -n team-payments""",
)
@_stack_selection
def suspend_command(name: str | None, selector: str | None, all_stacks: bool) -> None:
    """Stop starting new runs of Stacks (a running one finishes): sets spec.suspend. It
    requests no run, so there is nothing to follow."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stacks, _ = _select_stacks(session, name, selector, all_stacks)
    done = []
    for stack in stacks:
        patch_stack(session.kube, stack, suspend_patch(True))
        view = stack_view(stack)
        done.append({"namespace": view.namespace, "name": view.name, "suspended": True})
    if session.output in ("json", "yaml"):
        session.print_data(done)
        return
    session.print_lines(f"stack {d['namespace']}/{d['name']} suspended" for d in done)


@command(
    "resume",
    short_help="Let suspended Stacks run again, and run them now.",
    epilog="""\b
Examples:
  pkobatch resume web
  pkobatch resume --all -n team-payments --no-wait""",
)
@_stack_selection
@wait_option("the run and Ready")
@CONCURRENCY_OPTION
def resume_command(
    name: str | None, selector: str | None, all_stacks: bool, wait: bool, concurrency: int
) -> None:
    """Let suspended Stacks run again, as `flux resume` does: sets spec.suspend to false
    and, in the same write, asks for a run of the normal operation now (PKO's
    pulumi.com/reconciliation-request annotation), then follows it as `reconcile` does:
    exit 0 if the Stack is Ready, 1 if not."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stacks, single = _select_stacks(session, name, selector, all_stacks)

    def resume(stack: JSON, show_logs: bool) -> RequestOutcome:
        token = new_token()
        return reconcile_and_wait(
            session, stack, resume_patch(token), token, "resume", wait=wait, show_logs=show_logs
        )

    _apply_to_stacks(session, stacks, resume, single=single, concurrency=concurrency)
