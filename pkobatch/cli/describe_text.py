"""``pkobatch describe``: one Stack in full, as text (pure).

Layout follows ``kubectl describe``: ``Key:  value`` lines, then indented tables for
conditions, outputs, recent runs and Events. Everything a user needs to answer "why is
this Stack not Ready, and what happens next" is on one screen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from rich.text import Text

from pkobatch.api.objects import conditions_of
from pkobatch.api.status import current_update, last_update
from pkobatch.api.timestamps import parse_time
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.stack_views import (
    DRIFT_CHECK,
    SCHEDULE,
    ScheduledRun,
    stack_view,
)
from pkobatch.cli.text_format import (
    EVENT_HEADERS,
    NONE,
    EventView,
    age,
    changes_text,
    event_rows,
    format_table,
    human_duration,
    outputs_rows,
    short_commit,
    timestamp,
    until,
)

INDENT: Final = "  "
RECENT_RUNS: Final = 5
RECENT_EVENTS: Final = 10
BOOLEAN_OPTIONS: Final = (
    "refresh",
    "preview",
    "destroyOnFinalize",
    "runProgram",
    "continueResyncOnCommitMatch",
    "useLocalStackOnly",
    "targetDependents",
    "shallow",
)


def _fields(pairs: Sequence[tuple[str, str]], indent: str = "") -> list[str]:
    width = max(len(key) for key, _ in pairs) + 3
    return [f"{indent}{(key + ':').ljust(width)}{value}".rstrip() for key, value in pairs]


def _section(title: str, lines: Sequence[Text | str]) -> list[str]:
    body = [INDENT + (line.plain if isinstance(line, Text) else line) for line in lines]
    return [f"{title}:", *(body or [f"{INDENT}<none>"])]


def source_text(spec: Mapping[str, Any]) -> str:
    if spec.get("projectRepo"):
        parts = [f"git {spec['projectRepo']}"]
        if spec.get("branch"):
            parts.append(f"branch {spec['branch']}")
        if spec.get("commit"):
            parts.append(f"commit {spec['commit']}")
        if spec.get("repoDir"):
            parts.append(f"dir {spec['repoDir']}")
        return ", ".join(parts)
    flux = spec.get("fluxSource") or {}
    if flux:
        ref = flux.get("sourceRef") or {}
        text = f"flux {ref.get('kind', '?')}/{ref.get('name', '?')}"
        return text + (f", dir {flux['dir']}" if flux.get("dir") else "")
    program = spec.get("programRef") or {}
    if program:
        return f"program {program.get('name', '?')}"
    local = (((spec.get("workspaceTemplate") or {}).get("spec") or {}).get("local") or {}).get(
        "dir"
    )
    return f"image directory {local}" if local else "none (the program is in the run image)"


def _schedule_lines(
    spec: Mapping[str, Any], next_runs: Sequence[ScheduledRun], now: datetime
) -> list[tuple[str, str]]:
    zone = spec.get("timeZone") or "UTC"
    pairs = []
    for label, expr, source in (
        ("Schedule", spec.get("schedule"), SCHEDULE),
        ("Drift Check", (spec.get("driftDetection") or {}).get("schedule"), DRIFT_CHECK),
    ):
        if not expr:
            continue
        upcoming = next((r.at for r in next_runs if r.source == source), None)
        when = f"; next {timestamp(upcoming)} ({until(upcoming, now)})" if upcoming else ""
        pairs.append((label, f"{expr} ({zone}){when}"))
    return pairs


def _condition_lines(stack: Mapping[str, Any], now: datetime) -> list[Text]:
    rows = [
        [
            str(c.get("type") or ""),
            str(c.get("status") or ""),
            str(c.get("reason") or ""),
            age(parse_time(c.get("lastTransitionTime")), now),
            " ".join(str(c.get("message") or "").split()),
        ]
        for c in conditions_of(stack)
    ]
    if not rows:
        return []
    return format_table(["type", "status", "reason", "age", "message"], rows)


def _last_run_lines(last: Mapping[str, Any], record: RunRecord | None, now: datetime) -> list[str]:
    if not last:
        return []
    state = str(last.get("state") or NONE)
    if record is not None and record.reason and state == "failed":
        state = f"{state} ({record.reason})"
    pairs = [
        ("Run", str(last.get("name") or NONE)),
        ("Operation", str(last.get("type") or NONE)),
        ("Result", state),
    ]
    if last.get("message"):
        pairs.append(("Message", " ".join(str(last["message"]).split())))
    finished = parse_time(last.get("lastResyncTime"))
    pairs.append(("Finished", f"{timestamp(finished)} ({age(finished, now)} ago)"))
    if record is not None and record.duration is not None:
        pairs.append(("Duration", human_duration(record.duration)))
    if record is not None and record.changes:
        pairs.append(("Changes", changes_text(record.changes)))
    pairs += [
        ("Generation", str(last.get("generation") or 0)),
        ("Reconcile Request", str(last.get("reconcileRequest") or NONE)),
        ("Failures", str(last.get("failures") or 0)),
    ]
    if last.get("permalink"):
        pairs.append(("Permalink", str(last["permalink"])))
    return _fields(pairs)


def _current_operation(from_request: str, record: RunRecord | None) -> str:
    return from_request or (record.operation if record is not None else "") or NONE


def _run_rows(runs: Sequence[RunRecord], now: datetime) -> list[Text]:
    if not runs:
        return []
    rows = [
        [
            run.name,
            run.operation + (" (drift)" if run.drift_check else ""),
            run.state,
            run.reason,
            age(run.started or run.created, now),
            human_duration(run.duration) if run.duration is not None else NONE,
            changes_text(run.changes),
        ]
        for run in runs[:RECENT_RUNS]
    ]
    return format_table(
        ["run", "operation", "result", "reason", "started", "duration", "changes"], rows
    )


def describe_stack(
    stack: Mapping[str, Any],
    *,
    runs: Sequence[RunRecord],
    events: Sequence[EventView],
    next_runs: Sequence[ScheduledRun],
    now: datetime,
) -> str:
    view = stack_view(stack)
    spec = stack.get("spec") or {}
    status = stack.get("status") or {}
    options = [name for name in BOOLEAN_OPTIONS if spec.get(name) is True]
    commit = short_commit(view.commit) if view.commit else NONE
    if view.last_successful_commit and view.last_successful_commit != view.commit:
        commit += f" (last successful {short_commit(view.last_successful_commit)})"
    header = [
        ("Name", view.name),
        ("Namespace", view.namespace),
        ("Stack", view.stack or NONE),
        ("Created", f"{timestamp(view.created)} ({age(view.created, now)} ago)"),
        ("Generation", f"{view.generation} (observed {status.get('observedGeneration', NONE)})"),
        ("Suspended", str(view.suspended)),
        ("Source", source_text(spec)),
        ("Commit", commit),
        *_schedule_lines(spec, next_runs, now),
    ]
    if options:
        header.append(("Options", ", ".join(options)))
    if spec.get("prerequisites"):
        names = [str(p.get("name")) for p in spec["prerequisites"] if isinstance(p, dict)]
        header.append(("Prerequisites", ", ".join(names)))
    if view.held_after_destroy:
        header.append(
            (
                "Held",
                "destroyed on request: no automatic up until the spec changes or "
                "`pkobatch up` is run",
            )
        )
    lines = _fields(header)
    lines += _section("Conditions", _condition_lines(stack, now))

    records = {run.name: run for run in runs}
    last = last_update(status)
    lines += _section("Last Run", _last_run_lines(last, records.get(str(last.get("name"))), now))
    current = current_update(status)
    current_lines = []
    if current.get("name"):
        current_lines = _fields(
            [
                ("Run", str(current["name"])),
                (
                    "Operation",
                    _current_operation(view.last_operation, records.get(view.current_run)),
                ),
                ("Commit", short_commit(str(current.get("commit") or "")) or NONE),
                ("Generation", str(current.get("generation") or 0)),
            ]
        )
    lines += _section("Current Run", current_lines)
    request = view.operation_request
    if view.pending_request or request is not None:
        pairs = []
        if view.pending_request:
            pairs.append(("Pending", f"{view.pending_request} (not yet picked up)"))
        if request is not None:
            state = request.state + (f", run {request.job_name}" if request.job_name else "")
            pairs.append(("Last", f"{request.request}: {state}"))
            if request.message:
                pairs.append(("Message", " ".join(request.message.split())))
        lines += _section("Operation Request", _fields(pairs))
    outputs = status.get("outputs") or {}
    lines += _section(
        "Outputs", format_table(["name", "value"], outputs_rows(outputs)) if outputs else []
    )
    lines += _section("Recent Runs", _run_rows(runs, now))
    recent = list(events)[-RECENT_EVENTS:]
    lines += _section(
        "Events", format_table(EVENT_HEADERS, event_rows(recent, now)) if recent else []
    )
    return "\n".join(lines) + "\n"
