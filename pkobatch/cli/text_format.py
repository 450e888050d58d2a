"""Objects to text: every table and report the CLI prints (pure functions).

Tables look like kubectl's: upper-case headers, columns separated by three spaces, no
borders, no trailing blanks, one line per object, so they can be read by people and cut
by scripts. Cells are ``rich.text.Text`` so that states can be coloured on a terminal; the
plain text (``Text.plain``) is what tests compare. Times are shown as kubectl shows them
("5m", "3h12m", "2d"), relative to a ``now`` passed in by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from rich.text import Text

from pkobatch.api.timestamps import parse_time
from pkobatch.cli.stack_views import RUNNING, StackView, first_line

NONE: Final = "-"
COLUMN_GAP: Final = "   "
MESSAGE_WIDTH: Final = 80

Cell = Text | str


# -- time ---------------------------------------------------------------------------------


def human_duration(delta: timedelta) -> str:
    """kubectl's ``duration.HumanDuration``: two significant units at most."""
    seconds = int(delta.total_seconds())
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m" if seconds % 60 == 0 else f"{minutes}m{seconds % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d" if hours % 24 == 0 else f"{days}d{hours % 24}h"
    if days < 365 * 2:
        return f"{days}d"
    years, rest = divmod(days, 365)
    if days < 365 * 8 and rest:
        return f"{years}y{rest}d"
    return f"{years}y"


def age(moment: datetime | None, now: datetime) -> str:
    return human_duration(now - moment) if moment else NONE


def until(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return NONE
    return "due" if moment <= now else f"in {human_duration(moment - now)}"


def timestamp(moment: datetime | None) -> str:
    """RFC 3339 in the moment's own time zone, to the second."""
    if moment is None:
        return NONE
    text = moment.replace(microsecond=0).isoformat()
    return text.replace("+00:00", "Z")


def short_commit(revision: str) -> str:
    """A 40/64-hex SHA shortened to 7 characters; other revisions (Flux, Program) as they are."""
    head, sep, sha = revision.rpartition(":")
    candidate = sha if sep else revision
    if len(candidate) in (40, 64) and all(c in "0123456789abcdef" for c in candidate.lower()):
        return (head + sep if sep else "") + candidate[:7]
    return revision


def clip(text: str, width: int = MESSAGE_WIDTH) -> str:
    line = first_line(text)
    return line if len(line) <= width else line[: width - 1] + "…"


# -- tables -------------------------------------------------------------------------------


def _text(cell: Cell) -> Text:
    if isinstance(cell, Text):
        return cell
    return Text(cell if cell else NONE)


def format_table(
    headers: Sequence[str], rows: Iterable[Sequence[Cell]], *, header: bool = True
) -> list[Text]:
    """kubectl-style lines; the last column is not padded."""
    cells = [[_text(c) for c in row] for row in rows]
    head = [Text(h.upper()) for h in headers]
    everything = [head, *cells] if header else cells
    widths = [max((len(row[i]) for row in [head, *cells]), default=0) for i in range(len(head))]
    lines = []
    for row in everything:
        line = Text()
        for index, cell in enumerate(row):
            if index:
                line.append(COLUMN_GAP)
            padded = cell.copy()
            if index < len(row) - 1:
                padded.pad_right(widths[index] - len(cell))
            line.append_text(padded)
        line.rstrip()
        lines.append(line)
    return lines


def plain(lines: Iterable[Text]) -> str:
    return "".join(line.plain + "\n" for line in lines)


def ready_cell(status: str) -> Text:
    style = {"True": "green", "False": "red"}.get(status, "yellow")
    return Text(status or "Unknown", style=style)


def result_cell(result: str) -> Text:
    style = {"succeeded": "green", "failed": "red", RUNNING: "cyan"}.get(result.lower(), "")
    return Text(result or NONE, style=style)


def suspended_cell(suspended: bool) -> Text:
    return Text("True", style="yellow") if suspended else Text("False")


# -- get ----------------------------------------------------------------------------------


def stack_table_headers(*, wide: bool, namespaces: bool) -> list[str]:
    headers = ["namespace"] if namespaces else []
    headers += ["name", "stack", "last op", "result", "ready", "reason", "suspended"]
    headers += ["next run", "age", "message"]
    if wide:
        headers += ["commit", "run", "permalink"]
    return headers


def stack_row(
    view: StackView, now: datetime, next_run: datetime | None, *, wide: bool, namespaces: bool
) -> list[Cell]:
    row: list[Cell] = [view.namespace] if namespaces else []
    row += [
        view.name,
        view.stack,
        view.last_operation,
        result_cell(view.result),
        ready_cell(view.ready),
        view.reason,
        suspended_cell(view.suspended),
        until(next_run, now),
        age(view.created, now),
        view.message if wide else clip(view.message),
    ]
    if wide:
        row += [short_commit(view.commit), view.current_run or view.last_run, view.permalink]
    return row


# -- describe -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EventView:
    type: str
    reason: str
    object: str
    message: str
    count: int
    last_seen: datetime | None


def event_view(event: Mapping[str, Any]) -> EventView:
    """A core/v1 Event (also those written through events.k8s.io/v1)."""
    metadata = event.get("metadata") or {}
    series = event.get("series") or {}
    involved = event.get("involvedObject") or {}
    last_seen = (
        parse_time(series.get("lastObservedTime"))
        or parse_time(event.get("lastTimestamp"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("firstTimestamp"))
        or parse_time(metadata.get("creationTimestamp"))
    )
    count = int(series.get("count") or event.get("count") or 1)
    return EventView(
        type=str(event.get("type") or ""),
        reason=str(event.get("reason") or ""),
        object=f"{str(involved.get('kind') or '').lower()}/{involved.get('name') or ''}",
        message=" ".join(str(event.get("note") or event.get("message") or "").split()),
        count=count,
        last_seen=last_seen,
    )


def sort_events(events: Iterable[EventView]) -> list[EventView]:
    return sorted(events, key=lambda e: (e.last_seen is None, e.last_seen or datetime.min))


def event_rows(events: Sequence[EventView], now: datetime) -> list[list[Cell]]:
    rows: list[list[Cell]] = []
    for event in events:
        seen = age(event.last_seen, now)
        if event.count > 1:
            seen = f"{seen} (x{event.count})"
        kind = Text(event.type, style="yellow" if event.type == "Warning" else "")
        rows.append([seen, kind, event.reason, event.object, event.message])
    return rows


EVENT_HEADERS: Final = ["last seen", "type", "reason", "object", "message"]


def outputs_rows(outputs: Mapping[str, Any]) -> list[list[Cell]]:
    return [[key, output_value(value)] for key, value in sorted(outputs.items())]


def output_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def changes_text(changes: Mapping[str, int]) -> str:
    """Pulumi's change summary in a fixed order, e.g. ``create=2 update=1 same=3``."""
    order = ["create", "update", "replace", "delete", "same"]
    keys = [k for k in order if changes.get(k)] + sorted(
        k for k in changes if k not in order and changes[k]
    )
    return " ".join(f"{k}={changes[k]}" for k in keys)
