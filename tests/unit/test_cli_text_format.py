"""Rendering of Stacks, runs and Events into tables and text (pure, no cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.text import Text

from pkobatch.cli.describe_text import describe_stack, source_text
from pkobatch.cli.runs import RunRecord
from pkobatch.cli.stack_views import ScheduledRun, stack_view
from pkobatch.cli.text_format import (
    age,
    changes_text,
    clip,
    event_rows,
    event_view,
    format_table,
    human_duration,
    plain,
    short_commit,
    stack_row,
    stack_table_headers,
    timestamp,
    until,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SHA = "0123456789abcdef0123456789abcdef01234567"


def make_stack(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": "web",
            "namespace": "team",
            "uid": "4f1c2d3e-0000-4000-8000-000000000001",
            "generation": 3,
            "creationTimestamp": "2026-11-28T12:00:00Z",
        },
        "spec": {
            "stack": "org/web/dev",
            "projectRepo": "https://git.example/web.git",
            "branch": "main",
            "schedule": "0 3 * * *",
            "refresh": True,
        },
        "status": status,
    }


FAILED_STATUS: dict[str, Any] = {
    "observedGeneration": 3,
    "lastUpdate": {
        "name": "web-up-3",
        "type": "up",
        "state": "failed",
        "message": "error: program failed\ntraceback follows",
        "generation": 3,
        "lastAttemptedCommit": SHA,
        "lastSuccessfulCommit": "f" * 40,
        "lastResyncTime": "2026-11-30T11:55:00Z",
        "failures": 1,
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "NotReadyInProgress",
            "message": "reconciliation is in progress",
            "lastTransitionTime": "2026-11-30T11:55:00Z",
        },
        {
            "type": "Reconciling",
            "status": "True",
            "reason": "RetryingAfterFailure",
            "message": "1 update failure(s)",
            "lastTransitionTime": "2026-11-30T11:55:00Z",
        },
    ],
    "outputs": {"url": "https://web.example", "token": "[secret]", "replicas": 3},
}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (150, "2m30s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600 + 20 * 60, "3h20m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (3 * 86400 + 5 * 3600, "3d5h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400 + 10 * 86400, "3y10d"),
        (10 * 365 * 86400, "10y"),
        (-5, "<invalid>"),
    ],
)
def test_human_duration_matches_kubectl(seconds: int, text: str) -> None:
    assert human_duration(timedelta(seconds=seconds)) == text


def test_relative_times() -> None:
    assert age(NOW - timedelta(minutes=5), NOW) == "5m"
    assert age(None, NOW) == "-"
    assert until(NOW + timedelta(hours=15), NOW) == "in 15h"
    assert until(NOW - timedelta(seconds=1), NOW) == "due"
    assert timestamp(datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC)) == "2026-01-02T03:04:05Z"


def test_short_commit_shortens_only_shas() -> None:
    assert short_commit(SHA) == "0123456"
    assert short_commit(f"main@sha1:{SHA}") == "main@sha1:0123456"
    assert short_commit("7") == "7"
    assert short_commit("v1.2.3") == "v1.2.3"


def test_clip_keeps_the_first_line_and_marks_the_cut() -> None:
    assert clip("first\nsecond") == "first"
    assert clip("x" * 100, width=10) == "x" * 9 + "…"


def test_changes_text_uses_a_stable_order() -> None:
    assert changes_text({"same": 3, "update": 1, "create": 2, "read": 1, "delete": 0}) == (
        "create=2 update=1 same=3 read=1"
    )


def test_format_table_aligns_columns_without_trailing_blanks() -> None:
    lines = format_table(["name", "message"], [["a", "hello"], [Text("bbbb", style="red"), ""]])

    assert plain(lines) == "NAME   MESSAGE\na      hello\nbbbb   -\n"
    assert lines[2].spans, "styles survive padding"


def test_format_table_without_header() -> None:
    assert plain(format_table(["a", "b"], [["1", "2"]], header=False)) == "1   2\n"


def test_get_table_snapshot() -> None:
    view = stack_view(make_stack(**FAILED_STATUS))
    next_run = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)

    table = format_table(
        stack_table_headers(wide=False, namespaces=True),
        [stack_row(view, NOW, next_run, wide=False, namespaces=True)],
    )

    assert plain(table) == (
        "NAMESPACE   NAME   STACK         LAST OP   RESULT   READY   REASON"
        "                 SUSPENDED   NEXT RUN   AGE   MESSAGE\n"
        "team        web    org/web/dev   up        failed   False   RetryingAfterFailure"
        "   False       in 15h     2d    1 update failure(s)\n"
    )


def test_get_wide_table_adds_commit_run_and_permalink() -> None:
    status = {**FAILED_STATUS, "currentUpdate": {"name": "web-up-4", "generation": 3}}
    view = stack_view(make_stack(**status))

    table = format_table(
        stack_table_headers(wide=True, namespaces=False),
        [stack_row(view, NOW, None, wide=True, namespaces=False)],
    )

    header, row = plain(table).splitlines()
    assert header.split()[-3:] == ["COMMIT", "RUN", "PERMALINK"]
    assert row.split()[-3:] == ["0123456", "web-up-4", "-"]
    assert " running " in row


def test_a_stack_without_status_renders_with_placeholders() -> None:
    view = stack_view(make_stack())

    row = plain(
        format_table(["x"] * 10, [stack_row(view, NOW, None, wide=False, namespaces=False)])
    )

    assert row.splitlines()[1].split() == [
        "web",
        "org/web/dev",
        "-",
        "-",
        "Unknown",
        "-",
        "False",
        "-",
        "2d",
        "-",
    ]


def test_describe_snapshot() -> None:
    stack = make_stack(**FAILED_STATUS)
    runs = [
        RunRecord(
            name="web-up-3",
            operation="up",
            state="failed",
            reason="ProgramError",
            message="error: program failed",
            commit=SHA,
            started=datetime(2026, 11, 30, 11, 54, tzinfo=UTC),
            finished=datetime(2026, 11, 30, 11, 55, tzinfo=UTC),
            changes={"create": 1},
        )
    ]
    events = [
        event_view(
            {
                "type": "Warning",
                "reason": "StackUpdateFailure",
                "message": "up failed",
                "count": 2,
                "lastTimestamp": "2026-11-30T11:55:00Z",
                "involvedObject": {"kind": "Stack", "name": "web"},
            }
        )
    ]
    next_runs = [ScheduledRun(datetime(2026, 12, 1, 3, 0, tzinfo=UTC), "schedule", "up")]

    text = describe_stack(stack, runs=runs, events=events, next_runs=next_runs, now=NOW)

    assert (
        text
        == """\
Name:        web
Namespace:   team
Stack:       org/web/dev
Created:     2026-11-28T12:00:00Z (2d ago)
Generation:  3 (observed 3)
Suspended:   False
Source:      git https://git.example/web.git, branch main
Commit:      0123456 (last successful fffffff)
Schedule:    0 3 * * * (UTC); next 2026-12-01T03:00:00Z (in 15h)
Options:     refresh
Conditions:
  TYPE          STATUS   REASON                 AGE   MESSAGE
  Ready         False    NotReadyInProgress     5m    reconciliation is in progress
  Reconciling   True     RetryingAfterFailure   5m    1 update failure(s)
Last Run:
  Run:                web-up-3
  Operation:          up
  Result:             failed (ProgramError)
  Message:            error: program failed traceback follows
  Finished:           2026-11-30T11:55:00Z (5m ago)
  Duration:           60s
  Changes:            create=1
  Generation:         3
  Reconcile Request:  -
  Failures:           1
Current Run:
  <none>
Outputs:
  NAME       VALUE
  replicas   3
  token      [secret]
  url        https://web.example
Recent Runs:
  RUN        OPERATION   RESULT   REASON         STARTED   DURATION   CHANGES
  web-up-3   up          failed   ProgramError   6m        60s        create=1
Events:
  LAST SEEN   TYPE      REASON               OBJECT      MESSAGE
  5m (x2)     Warning   StackUpdateFailure   stack/web   up failed
"""
    )


def test_describe_shows_a_stack_held_after_a_destroy_and_a_pending_request() -> None:
    stack = make_stack(
        lastUpdate={
            "name": "web-destroy-1",
            "type": "destroy",
            "state": "succeeded",
            "generation": 3,
        },
        operationRequest={
            "request": "destroy:2026-11-30T11:00:00Z",
            "operation": "destroy",
            "state": "Succeeded",
            "jobName": "web-destroy-1",
        },
    )
    stack["metadata"]["annotations"] = {"pkobatch.io/operation-request": "up:2026-11-30T11:59:00Z"}

    text = describe_stack(stack, runs=[], events=[], next_runs=[], now=NOW)

    assert "Held:" in text and "`pkobatch up`" in text
    assert "Pending:  up:2026-11-30T11:59:00Z (not yet picked up)" in text
    assert "Last:     destroy:2026-11-30T11:00:00Z: Succeeded, run web-destroy-1" in text


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"projectRepo": "r", "commit": "abc", "repoDir": "infra"}, "git r, commit abc, dir infra"),
        (
            {"fluxSource": {"sourceRef": {"kind": "GitRepository", "name": "g"}, "dir": "d"}},
            "flux GitRepository/g, dir d",
        ),
        ({"programRef": {"name": "p"}}, "program p"),
        ({"workspaceTemplate": {"spec": {"local": {"dir": "/app"}}}}, "image directory /app"),
        ({}, "none (the program is in the run image)"),
    ],
)
def test_source_text(spec: dict[str, Any], text: str) -> None:
    assert source_text(spec) == text


def test_event_view_reads_core_and_events_k8s_io_shapes() -> None:
    core = event_view(
        {
            "type": "Normal",
            "reason": "Created",
            "message": "created\n pod",
            "count": 1,
            "firstTimestamp": "2026-11-30T11:00:00Z",
            "involvedObject": {"kind": "Job", "name": "web-up-3"},
        }
    )
    new_style = event_view(
        {
            "type": "Normal",
            "reason": "StackCreated",
            "note": "done",
            "eventTime": "2026-11-30T11:30:00.000000Z",
            "series": {"count": 4, "lastObservedTime": "2026-11-30T11:50:00.000000Z"},
            "involvedObject": {"kind": "Stack", "name": "web"},
        }
    )

    rows = event_rows([core, new_style], NOW)

    assert [[str(c) for c in row] for row in rows] == [
        ["60m", "Normal", "Created", "job/web-up-3", "created pod"],
        ["10m (x4)", "Normal", "StackCreated", "stack/web", "done"],
    ]


def test_describe_names_the_operation_of_the_current_run_from_its_job() -> None:
    stack = make_stack(currentUpdate={"name": "web-up-4", "generation": 3, "commit": SHA})
    runs = [RunRecord(name="web-up-4", operation="up", state="running")]

    text = describe_stack(stack, runs=runs, events=[], next_runs=[], now=NOW)

    current = text.split("Current Run:\n")[1].split("Outputs:")[0]
    assert current == (
        "  Run:         web-up-4\n  Operation:   up\n  Commit:      0123456\n  Generation:  3\n"
    )
