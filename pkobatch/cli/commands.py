"""The user commands of ``pkobatch``: see Stacks and their runs (this module), trigger and
control runs (``actions.py``), check the installation (``diagnostics.py``).

Commands are thin: fetch through ``pkobatch.kube``, turn objects into rows or text with
the pure functions of ``views``/``render``/``describe``/``runs``, print. ``register`` adds
them and the global options to the top-level group of ``pkobatch.main``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import click
from rich.live import Live
from rich.text import Text

from pkobatch.api.cron import ScheduleError
from pkobatch.api.objects import JSON
from pkobatch.cli import actions, approvals, diagnostics
from pkobatch.cli.completion import completion_command
from pkobatch.cli.describe_text import describe_stack
from pkobatch.cli.fetch import (
    complete_stack_names,
    follow_changes,
    get_stack,
    list_runs,
    list_stacks,
    object_key,
    related_objects,
    run_pods,
    stack_events,
)
from pkobatch.cli.follow import RUN_CONTAINER
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.session import CommandFailed, Session, command, global_params, now
from pkobatch.cli.stack_views import (
    StackView,
    StatusRequirement,
    parse_status_selector,
    stack_view,
    upcoming_runs,
)
from pkobatch.cli.text_format import (
    EVENT_HEADERS,
    Cell,
    age,
    changes_text,
    event_rows,
    event_view,
    format_table,
    human_duration,
    outputs_rows,
    short_commit,
    sort_events,
    stack_row,
    stack_table_headers,
    timestamp,
    until,
)
from pkobatch.kube.client import CORE_EVENTS, JOBS, PODS, STACKS, Forbidden, WatchEvent
from pkobatch.kube.pod_logs import ApiPodLogs, LogsUnavailable

NAME = click.argument("name", shell_complete=complete_stack_names)
OPTIONAL_NAME = click.argument("name", required=False, shell_complete=complete_stack_names)
SELECTOR = click.option(
    "-l", "--selector", metavar="SELECTOR", help="Label selector, e.g. team=payments."
)


def next_run(view: StackView, moment: datetime) -> datetime | None:
    if view.suspended:
        return None
    try:
        runs = upcoming_runs(view, moment)
    except ScheduleError:
        return None
    return runs[0].at if runs else None


# -- get ----------------------------------------------------------------------------------


def _matching(stacks: Sequence[JSON], requirements: Sequence[StatusRequirement]) -> list[JSON]:
    return [s for s in stacks if all(r.matches(stack_view(s)) for r in requirements)]


def _stack_table(session: Session, stacks: Sequence[JSON]) -> tuple[list[str], list[list[Cell]]]:
    """The headers and rows of ``pkobatch get`` (table or wide)."""
    moment = now()
    wide = session.output == "wide"
    namespaces = session.options.all_namespaces
    rows = [
        stack_row(v, moment, next_run(v, moment), wide=wide, namespaces=namespaces)
        for v in map(stack_view, stacks)
    ]
    return stack_table_headers(wide=wide, namespaces=namespaces), rows


def _print_stacks(
    session: Session, stacks: Sequence[JSON], *, header: bool = True, single: bool = False
) -> None:
    """Stacks in the ``-o`` format (a ``single`` one named on the command line is printed
    as itself in JSON and YAML, not in a List)."""
    if session.output in ("json", "yaml"):
        shown = [without_managed_fields(s) for s in stacks]
        session.print_data(shown[0] if single and shown else _as_list(shown))
    elif session.output == "name":
        session.print_names(STACKS, (str(s["metadata"]["name"]) for s in stacks))
    else:
        session.print_table(*_stack_table(session, stacks), header=header)


def _as_list(items: Sequence[JSON]) -> JSON:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def without_managed_fields(obj: JSON) -> JSON:
    """The object as ``kubectl get -o yaml`` shows it: without metadata.managedFields."""
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


@command(
    "get",
    short_help="List Stacks with their last run, readiness and next run.",
    epilog="""\b
Examples:
  pkobatch get
  pkobatch get -A --status-selector ready=false
  pkobatch get web -o yaml
  pkobatch get -l team=payments -w""",
)
@OPTIONAL_NAME
@SELECTOR
@click.option(
    "--status-selector",
    metavar="KEY=VALUE",
    help="Filter on status: ready, suspended, result, reason or operation, with = or != "
    "(e.g. ready=false,suspended!=true).",
)
@click.option("-w", "--watch", is_flag=True, help="Keep watching and show changes.")
def get_command(
    name: str | None, selector: str | None, status_selector: str | None, watch: bool
) -> None:
    """List Stacks, or show one, with their last run, readiness and next scheduled run."""
    session = Session.current()
    try:
        requirements = parse_status_selector(status_selector or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--status-selector") from None
    if name and selector:
        raise click.UsageError("give a NAME or -l SELECTOR, not both")
    if name and session.options.all_namespaces:
        raise click.UsageError("-A cannot be used with a NAME; pass -n NAMESPACE")
    if watch:
        if name:
            get_stack(session, name)
        _watch_stacks(session, name, selector, requirements)
        return
    stacks = [get_stack(session, name)] if name else list_stacks(session, selector)
    matching = _matching(stacks, requirements)
    if not matching and session.output not in ("json", "yaml"):
        where = (
            "any namespace" if session.options.all_namespaces else f"namespace {session.namespace}"
        )
        session.progress(f"No stacks found in {where}.")
        return
    _print_stacks(session, matching, single=bool(name))


def _watch_stacks(
    session: Session,
    name: str | None,
    selector: str | None,
    requirements: Sequence[StatusRequirement],
) -> None:
    """List, then follow changes until --timeout (if given) or Ctrl-C: a live table on a
    terminal, else one line (or JSON document) per change, like ``kubectl get -w``."""
    namespace = session.namespace if name else session.list_namespace
    field_selector = f"metadata.name={name}" if name else None
    live = session.out.is_terminal and session.output in ("table", "wide")
    deadline = None if session.options.timeout is None else time.monotonic() + session.remaining()
    current: dict[tuple[str, str], JSON] = {}

    def render() -> Text:
        ordered = _matching(sorted(current.values(), key=object_key), requirements)
        headers, rows = _stack_table(session, ordered)
        return Text("\n").join(format_table(headers, rows, header=not session.options.no_headers))

    def emit(changed: Sequence[JSON], header: bool) -> None:
        shown = _matching(changed, requirements)
        if session.output in ("json", "yaml"):
            for stack in shown:
                session.print_data(without_managed_fields(stack))
        elif shown or header:
            _print_stacks(session, shown, header=header)

    def relist() -> str:
        items, version = session.kube.list_objects(
            STACKS, namespace, label_selector=selector, field_selector=field_selector
        )
        changed = [s for s in sorted(items, key=object_key) if current.get(object_key(s)) != s]
        header = not current
        current.clear()
        current.update({object_key(s): s for s in items})
        if display is None:
            emit(changed, header)
        return version

    def changed(event: WatchEvent) -> None:
        if event.type == "DELETED":
            current.pop(object_key(event.object), None)
        else:
            current[object_key(event.object)] = event.object
        if display is not None:
            display.update(render(), refresh=True)
        else:
            emit([event.object], header=False)

    display = Live(Text(""), console=session.out, auto_refresh=False) if live else None
    try:
        if display is not None:
            display.start()
        resource_version = relist()
        if display is not None:
            display.update(render(), refresh=True)
        follow_changes(
            session,
            STACKS,
            namespace,
            resource_version,
            relist=relist,
            on_event=changed,
            deadline=deadline,
            label_selector=selector,
            field_selector=field_selector,
        )
    except KeyboardInterrupt:
        pass
    finally:
        if display is not None:
            display.stop()


# -- describe -----------------------------------------------------------------------------


def _optional(session: Session, what: str, fetch: Any) -> Any:
    """Extra information the user may not be allowed to read: warn and go on without it."""
    try:
        return fetch()
    except Forbidden as exc:
        session.warn(f"cannot show {what}: {' '.join(exc.message.split())}")
        return []


@command(
    "describe",
    short_help="Show one Stack in detail.",
    epilog="""\b
Examples:
  pkobatch describe web
  pkobatch describe web -n team-payments""",
)
@NAME
def describe_command(name: str) -> None:
    """Show a Stack in detail: spec summary, source and commit, conditions, last and current
    run, outputs (secrets masked), recent runs and Events, schedule."""
    session = Session.current()
    session.require_output("table")
    stack = get_stack(session, name)
    moment = now()
    view = stack_view(stack)
    runs = _optional(session, "runs", lambda: list_runs(session.kube, view.namespace, view.name))
    events = _optional(session, "Events", lambda: stack_events(session.kube, stack))
    try:
        upcoming = upcoming_runs(view, moment)
    except ScheduleError as exc:
        session.warn(f"schedule: {exc}")
        upcoming = []
    text = describe_stack(
        stack,
        runs=runs,
        events=sort_events(map(event_view, events)),
        next_runs=upcoming,
        now=moment,
    )
    click.echo(text, nl=False)


# -- outputs ------------------------------------------------------------------------------


@command(
    "outputs",
    short_help="Show a Stack's outputs (secret values are never shown).",
    epilog="""\b
Examples:
  pkobatch outputs web
  pkobatch outputs web -o json | jq -r .url""",
)
@NAME
def outputs_command(name: str) -> None:
    """Show the outputs of a Stack's last successful run. Secret outputs show as
    "[secret]": their values never leave the backend."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    outputs = (stack.get("status") or {}).get("outputs") or {}
    if session.output in ("json", "yaml"):
        session.print_data(outputs)
        return
    if not outputs:
        session.progress(f"Stack {name} has no outputs yet.")
        return
    session.print_table(["name", "value"], outputs_rows(outputs))


# -- history ------------------------------------------------------------------------------


def run_json(run: RunRecord) -> JSON:
    return {
        "run": run.name,
        "operation": run.operation,
        "driftCheck": run.drift_check,
        "result": run.state,
        "reason": run.reason,
        "message": run.message,
        "commit": run.commit,
        "startTime": timestamp(run.started) if run.started else None,
        "endTime": timestamp(run.finished) if run.finished else None,
        "durationSeconds": run.duration.total_seconds() if run.duration else None,
        "changes": dict(run.changes),
        "permalink": run.permalink,
        "pulumiVersion": run.pulumi_version,
        "languageHost": run.language_host,
    }


def history_rows(runs: Sequence[RunRecord], moment: datetime, *, wide: bool) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for run in runs:
        row: list[Cell] = [
            run.name,
            run.operation + (" (drift)" if run.drift_check else ""),
            run.state,
            run.reason,
            short_commit(run.commit),
            age(run.started or run.created, moment),
            human_duration(run.duration) if run.duration is not None else "",
            changes_text(run.changes),
        ]
        if wide:
            row += [run.pulumi_version, run.message]
        rows.append(row)
    return rows


HISTORY_HEADERS = [
    "run",
    "operation",
    "result",
    "reason",
    "commit",
    "started",
    "duration",
    "changes",
]


@command(
    "history",
    short_help="List a Stack's past runs.",
    epilog="""\b
Examples:
  pkobatch history web
  pkobatch history web -o wide --limit 3""",
)
@NAME
@click.option("--limit", type=click.IntRange(min=1), help="Show at most this many runs.")
def history_command(name: str, limit: int | None) -> None:
    """List a Stack's runs, newest first: operation, result, reason, commit, start,
    duration and change summary. Runs are kept as long as their Jobs (the controller's
    history limit and Job TTL)."""
    session = Session.current()
    stack = get_stack(session, name)
    view = stack_view(stack)
    runs = list_runs(session.kube, view.namespace, view.name)[:limit]
    if session.output in ("json", "yaml"):
        session.print_data([run_json(r) for r in runs])
        return
    if not runs:
        session.progress(f"Stack {name} has no recorded runs.")
        return
    if session.output == "name":
        # A run is its Job.
        session.print_names(JOBS, (r.name for r in runs))
        return
    wide = session.output == "wide"
    headers = HISTORY_HEADERS + (["pulumi", "message"] if wide else [])
    session.print_table(headers, history_rows(runs, now(), wide=wide))


# -- logs ---------------------------------------------------------------------------------


def _pick_run(session: Session, stack: JSON, run: str | None) -> str:
    if run:
        return run
    view = stack_view(stack)
    if view.current_run or view.last_run:
        return view.current_run or view.last_run
    runs = list_runs(session.kube, view.namespace, view.name)
    if not runs:
        raise CommandFailed(f"stack {view.name} has no runs yet")
    return runs[0].name


@command(
    "logs",
    short_help="Print the output of a Stack's last (or a given) run, or the controller's log.",
    epilog="""\b
Examples:
  pkobatch logs web
  pkobatch logs web -f
  pkobatch logs web --run web-refresh-1a2b3c --tail 50
  pkobatch logs --controller --tail 100""",
)
@OPTIONAL_NAME
@click.option("--run", "run_name", metavar="RUN", help="The run (Job name, see `history`).")
@click.option(
    "--controller",
    is_flag=True,
    help="The controller's own log, of each of its pods, instead of a run's output.",
)
@diagnostics.CONTROLLER_NAMESPACE_OPTION
@click.option("-f", "--follow", is_flag=True, help="Keep printing output until the run ends.")
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines.")
def logs_command(
    name: str | None,
    run_name: str | None,
    controller: bool,
    controller_namespace: str,
    follow: bool,
    tail: int | None,
) -> None:
    """Print the output of a Stack's current or last run, or of the run named by --run.
    With --controller, the log of the controller's pods in --controller-namespace (those
    labelled as deploy/ labels the controller and its shards), each line prefixed with its
    pod when there are several."""
    session = Session.current()
    session.require_output("table")
    if controller:
        if name or run_name:
            raise click.UsageError("--controller takes no NAME and no --run")
        _controller_logs(session, controller_namespace, follow=follow, tail=tail)
        return
    if not name:
        raise click.UsageError("give a Stack NAME, or --controller")
    stack = get_stack(session, name)
    namespace = stack_view(stack).namespace
    job = _pick_run(session, stack, run_name)
    pods = run_pods(session.kube, namespace, job)
    if not pods:
        exists = session.kube.get_or_none(JOBS, job, namespace) is not None
        raise CommandFailed(
            f"run {job} has no pod yet; try again in a moment"
            if exists
            else f"run {job} not found (its Job was deleted; `pkobatch history {name}` "
            "lists the runs that still exist)"
        )
    pod = str(pods[0]["metadata"]["name"])
    logs = ApiPodLogs(session.kube)
    try:
        if follow:
            for line in logs.follow(namespace, pod, container=RUN_CONTAINER, tail_lines=tail):
                click.echo(line, nl=False)
        else:
            click.echo(
                logs.read(namespace, pod, container=RUN_CONTAINER, tail_lines=tail), nl=False
            )
    except LogsUnavailable as exc:
        raise CommandFailed(f"cannot read the output of run {job}: {exc}") from None


def _controller_logs(session: Session, namespace: str, *, follow: bool, tail: int | None) -> None:
    pods, _ = session.kube.list_objects(
        PODS, namespace, label_selector=diagnostics.CONTROLLER_SELECTOR
    )
    names = sorted(str(p["metadata"]["name"]) for p in pods)
    if not names:
        raise CommandFailed(
            f"no controller pod in namespace {namespace} (labelled "
            f"{diagnostics.CONTROLLER_SELECTOR}); pass --controller-namespace"
        )
    logs = ApiPodLogs(session.kube)
    prefixes = {pod: f"[pod/{pod}] " if len(names) > 1 else "" for pod in names}
    printing = threading.Lock()

    def show(pod: str, text: str) -> None:
        with printing:
            for line in text.splitlines(keepends=True):
                click.echo(prefixes[pod] + line, nl=False)

    def read(pod: str) -> None:
        container = diagnostics.CONTROLLER_CONTAINER
        if follow:
            for line in logs.follow(namespace, pod, container=container, tail_lines=tail):
                show(pod, line)
        else:
            show(pod, logs.read(namespace, pod, container=container, tail_lines=tail))

    try:
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            for done in [pool.submit(read, pod) for pod in names]:
                done.result()
    except LogsUnavailable as exc:
        raise CommandFailed(f"cannot read the controller's log: {exc}") from None


# -- events -------------------------------------------------------------------------------


@command(
    "events",
    short_help="Show Events of a Stack and of its runs.",
    epilog="""\b
Examples:
  pkobatch events web
  pkobatch events web -w""",
)
@NAME
@click.option("-w", "--watch", is_flag=True, help="Keep watching for new Events.")
def events_command(name: str, watch: bool) -> None:
    """Show the Events of a Stack, of its run Jobs and of their pods, oldest first."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    # Taken before the listing so that no Event falls between the listing and the watch.
    resource_version = _events_resource_version(session, str(stack["metadata"]["namespace"]))
    events = sorted(stack_events(session.kube, stack), key=_event_time)
    if session.output in ("json", "yaml") and not watch:
        session.print_data(_as_list(events))
        return
    _print_events(session, events, header=True)
    if watch:
        _watch_events(session, stack, resource_version, {_event_id(e) for e in events})


def _event_time(event: JSON) -> datetime:
    return event_view(event).last_seen or datetime.min.replace(tzinfo=UTC)


def _event_id(event: JSON) -> tuple[str, str]:
    metadata = event.get("metadata") or {}
    return str(metadata.get("uid")), str(metadata.get("resourceVersion"))


def _events_resource_version(session: Session, namespace: str) -> str:
    """The namespace's current Event resourceVersion, from a listing that matches nothing."""
    _, version = session.kube.list_objects(
        CORE_EVENTS, namespace, field_selector="metadata.name=", page_size=1
    )
    return version


def _print_events(session: Session, events: Sequence[JSON], *, header: bool) -> None:
    if session.output in ("json", "yaml"):
        for event in events:
            session.print_data(event)
        return
    rows = event_rows([event_view(e) for e in events], now())
    if rows or header:
        session.print_table(EVENT_HEADERS, rows, header=header)


def _watch_events(
    session: Session, stack: JSON, resource_version: str, printed: set[tuple[str, str]]
) -> None:
    """Print new Events of the Stack and its runs until --timeout (if given) or Ctrl-C."""
    metadata = stack["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    related = related_objects(session.kube, namespace, name)
    deadline = None if session.options.timeout is None else time.monotonic() + session.remaining()

    def changed(event: WatchEvent) -> None:
        nonlocal related
        if event.type not in ("ADDED", "MODIFIED") or _event_id(event.object) in printed:
            return
        involved = event.object.get("involvedObject") or {}
        kind, object_name = str(involved.get("kind")), involved.get("name")
        if kind in related and object_name not in related[kind]:
            related = related_objects(session.kube, namespace, name)
        if (kind == "Stack" and object_name == name) or object_name in related.get(kind, set()):
            printed.add(_event_id(event.object))
            _print_events(session, [event.object], header=False)

    with contextlib.suppress(KeyboardInterrupt):
        follow_changes(
            session,
            CORE_EVENTS,
            namespace,
            resource_version,
            relist=lambda: _events_resource_version(session, namespace),
            on_event=changed,
            deadline=deadline,
        )


# -- schedule -----------------------------------------------------------------------------


@command(
    "schedule",
    short_help="Show when a Stack runs next.",
    epilog="""\b
Examples:
  pkobatch schedule web
  pkobatch schedule web --next 10""",
)
@NAME
@click.option(
    "--next",
    "count",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="How many upcoming times per schedule.",
)
def schedule_command(name: str, count: int) -> None:
    """Show the next times of a Stack's schedule (spec.schedule) and drift checks
    (spec.driftDetection.schedule), in the Stack's time zone."""
    session = Session.current()
    session.require_output("table", "json", "yaml")
    stack = get_stack(session, name)
    view = stack_view(stack)
    moment = now()
    try:
        runs = upcoming_runs(view, moment, count)
    except ScheduleError as exc:
        raise CommandFailed(f"stack {name} has an invalid schedule: {exc}") from None
    if view.suspended:
        session.warn(
            f"stack {name} is suspended: these runs start only after `pkobatch resume {name}`"
        )
    if session.output in ("json", "yaml"):
        session.print_data(
            [
                {"time": timestamp(r.at), "schedule": r.source, "operation": r.operation}
                for r in runs
            ]
        )
        return
    if not runs:
        session.progress(
            f"Stack {name} has no schedule (set spec.schedule or spec.driftDetection.schedule)."
        )
        return
    zone = ZoneInfo(view.time_zone)
    rows: list[list[Cell]] = [
        [timestamp(r.at.astimezone(zone)), until(r.at, moment), r.source, r.operation] for r in runs
    ]
    session.print_table(["time", "in", "schedule", "operation"], rows)


# -- registration -------------------------------------------------------------------------

USER_COMMANDS: tuple[click.Command, ...] = (
    get_command,
    describe_command,
    *actions.OPERATION_COMMANDS,
    actions.reconcile_command,
    actions.cancel_command,
    actions.unlock_command,
    approvals.plan_command,
    approvals.approve_command,
    approvals.reject_command,
    actions.suspend_command,
    actions.resume_command,
    logs_command,
    history_command,
    outputs_command,
    events_command,
    schedule_command,
    diagnostics.check_command,
    diagnostics.version_command,
    completion_command,
)


def register(cli: click.Group) -> None:
    """Add the user commands, and the global options, to the ``pkobatch`` group."""
    cli.params.extend(global_params())
    for user_command in USER_COMMANDS:
        cli.add_command(user_command)
