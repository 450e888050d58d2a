"""Every `pkobatch` user command against the real API server, with real objects.

Stacks are created directly and their status is written through the status subresource,
as the controller would; runs are real Jobs (the real Job controller and the node agent run
their pods) with result ConfigMaps written by the test. Commands whose effect needs the
controller (``refresh --wait`` ...) are in tests/e2e/test_cli_with_controller.py.

Tables are compared as text. The AGE column depends on the wall clock and is masked.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from click.testing import CliRunner, Result

from pkobatch import __version__
from pkobatch.api.run import RunResult, StackRef
from pkobatch.cli.reference import user_group
from pkobatch.dev.controlplane import ControlPlane
from pkobatch.dev.kubeconfig import (
    kubeconfig,
    request_token,
    service_account_user,
    write_kubeconfig,
)
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    CORE_EVENTS,
    DEPLOYMENTS,
    JOBS,
    LEASES,
    STACKS,
    Kube,
)

JSON = dict[str, Any]
RUN_LABELS = {"app.kubernetes.io/managed-by": "pkobatch"}
SHA = "0123456789abcdef0123456789abcdef01234567"
HOUR_AGO = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
HOUR_AGO_TEXT = HOUR_AGO.strftime("%Y-%m-%dT%H:%M:%SZ")
PLAN_ID = "plan-0123456789abcdef0123"


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def cli(cluster: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run `pkobatch ARGS -n <test namespace>` as the cluster admin."""
    monkeypatch.delenv("KUBECONFIG", raising=False)

    def run(*args: str, input: str | None = None, kubeconfig: Path | None = None) -> Result:
        config = str(kubeconfig or cluster.kubeconfig)
        return CliRunner().invoke(
            user_group(), [*args, "--kubeconfig", config, "-n", namespace], input=input
        )

    return run


def make_stack(
    kube: Kube, namespace: str, name: str, *, labels: JSON | None = None, **spec: Any
) -> JSON:
    body = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"stack": f"org/p/{name}", **spec},
    }
    return kube.create(STACKS, body, namespace)


def set_status(kube: Kube, namespace: str, name: str, status: JSON) -> JSON:
    return kube.merge_patch(STACKS, name, {"status": status}, namespace, subresource="status")


def condition(kind: str, status: str, reason: str, message: str) -> JSON:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": HOUR_AGO_TEXT,
    }


READY = [
    condition(
        "Ready", "True", "ProcessingCompleted", "the stack has been processed and is up to date"
    )
]
STALLED = [
    condition("Ready", "False", "NotReadyStalled", "reconciliation is stalled"),
    condition(
        "Stalled",
        "True",
        "UpdateFailed",
        "up failed 3 times; not retrying until the spec or source changes",
    ),
]


def mask_column(text: str, column: str, following: str) -> str:
    """Replace the cells of one column (between the headers ``column`` and ``following``) with
    stars."""
    header, *rows = text.splitlines()
    start, end = header.index(column), header.index(following)
    masked = [row[:start] + "*" * (end - start) + row[end:] for row in rows]
    return "\n".join([header, *masked]) + "\n"


def run_job(
    kube: Kube,
    python_job: Callable[..., JSON],
    namespace: str,
    name: str,
    stack: str,
    operation: str,
    code: str,
) -> JSON:
    labels = {**RUN_LABELS, "pkobatch.io/stack": stack, "pkobatch.io/operation": operation}
    body = python_job(name, code, container={"name": "pulumi"})
    body["metadata"]["labels"] = labels
    body["spec"]["template"]["metadata"] = {"labels": labels}
    return kube.create(JOBS, body, namespace)


def result_configmap(kube: Kube, namespace: str, name: str, stack: str, **fields: Any) -> JSON:
    result = RunResult.model_validate(
        {
            "operation": "up",
            "state": "succeeded",
            "reason": "Succeeded",
            "stack": StackRef(name=stack, namespace=namespace),
            "jobName": name,
            "commit": SHA,
            "startTime": HOUR_AGO,
            "endTime": HOUR_AGO + timedelta(seconds=42),
            "changes": {"create": 2, "same": 1},
            "outputs": {"url": "https://x.example", "token": "[secret]"},
            "secretOutputs": ["token"],
            "pulumiVersion": "3.259.0",
            **fields,
        }
    )
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {
                **RUN_LABELS,
                "pkobatch.io/stack": stack,
                "pkobatch.io/operation": result.operation,
            },
        },
        "data": {"result.json": result.to_json()},
    }
    return kube.create(CONFIGMAPS, body, namespace)


def finished(kube: Kube, namespace: str, job: str) -> None:
    def done() -> bool:
        conditions = (kube.get(JOBS, job, namespace).get("status") or {}).get("conditions") or []
        return any(
            c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions
        )

    wait_until(done, timeout=300, what=f"Job {job} to finish")


def create_event(
    kube: Kube, namespace: str, stack: JSON, name: str, reason: str, message: str
) -> JSON:
    moment = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return kube.create(
        CORE_EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "name": stack["metadata"]["name"],
                "namespace": namespace,
                "uid": stack["metadata"]["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "count": 1,
            "firstTimestamp": moment,
            "lastTimestamp": moment,
            "source": {"component": "pkobatch-controller"},
        },
        namespace,
    )


@pytest.fixture
def three_stacks(kube: Kube, namespace: str) -> None:
    make_stack(kube, namespace, "alpha", labels={"team": "a"})
    set_status(
        kube,
        namespace,
        "alpha",
        {
            "observedGeneration": 1,
            "lastUpdate": {
                "name": "alpha-up-1",
                "type": "up",
                "state": "succeeded",
                "generation": 1,
                "lastAttemptedCommit": SHA,
                "lastResyncTime": HOUR_AGO_TEXT,
            },
            "conditions": READY,
            "outputs": {"url": "https://alpha.example", "token": "[secret]", "replicas": 3},
        },
    )
    make_stack(kube, namespace, "beta", labels={"team": "a"})
    set_status(
        kube,
        namespace,
        "beta",
        {
            "lastUpdate": {
                "name": "beta-up-4",
                "type": "up",
                "state": "failed",
                "failures": 3,
                "message": "error: program failed",
                "lastResyncTime": HOUR_AGO_TEXT,
            },
            "conditions": STALLED,
        },
    )
    make_stack(kube, namespace, "gamma", labels={"team": "b"}, suspend=True)


def _lines_of(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's stdout lines, as they come (read by a thread)."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None

    def read() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


# -- get --------------------------------------------------------------------------------------


GET_TABLE = """\
NAME    STACK         LAST OP   RESULT      READY     REASON                SUSPENDED   NEXT RUN   AGE   MESSAGE
alpha   org/p/alpha   up        succeeded   True      ProcessingCompleted   False       -          ******the stack has been processed and is up to date
beta    org/p/beta    up        failed      False     UpdateFailed          False       -          ******up failed 3 times; not retrying until the spec or source changes
gamma   org/p/gamma   -         -           Unknown   -                     True        -          ******-
"""  # noqa: E501


def test_get_table(cli: Callable[..., Result], three_stacks: None) -> None:
    result = cli("get")

    assert result.exit_code == 0, result.output
    assert mask_column(result.stdout, "AGE", "MESSAGE") == GET_TABLE


def test_get_filters_and_formats(
    cli: Callable[..., Result], three_stacks: None, namespace: str
) -> None:
    not_ready = cli("get", "--status-selector", "ready!=true")
    team_a = cli("get", "-l", "team=a", "-o", "json")
    one = cli("get", "beta", "-o", "yaml")
    wide = cli("get", "alpha", "-o", "wide")
    everywhere = cli("get", "-A", "--status-selector", "suspended=true")

    assert [line.split()[0] for line in not_ready.stdout.splitlines()] == ["NAME", "beta", "gamma"]
    listed = json.loads(team_a.stdout)
    assert listed["kind"] == "List"
    assert [s["metadata"]["name"] for s in listed["items"]] == ["alpha", "beta"]
    beta = yaml.safe_load(one.stdout)
    assert beta["status"]["lastUpdate"]["failures"] == 3
    assert "managedFields" not in beta["metadata"]
    header, row = wide.stdout.splitlines()
    assert header.split()[-3:] == ["COMMIT", "RUN", "PERMALINK"]
    assert row.split()[-3:] == ["0123456", "alpha-up-1", "-"]
    rows = [line.split()[:2] for line in everywhere.stdout.splitlines()]
    assert rows[0] == ["NAMESPACE", "NAME"]
    assert [namespace, "gamma"] in rows


def test_get_names_and_tables_without_headers(
    cli: Callable[..., Result], three_stacks: None, namespace: str
) -> None:
    names = cli("get", "-o", "name")
    one = cli("get", "beta", "-o", "name")
    rows = cli("get", "--no-headers", "-l", "team=a")
    wide = cli("get", "-o", "wide", "--no-headers", "-A", "--status-selector", "suspended=true")

    assert names.stdout == "stack.pulumi.com/alpha\nstack.pulumi.com/beta\nstack.pulumi.com/gamma\n"
    assert one.stdout == "stack.pulumi.com/beta\n"
    assert [line.split()[:2] for line in rows.stdout.splitlines()] == [
        ["alpha", "org/p/alpha"],
        ["beta", "org/p/beta"],
    ]
    assert [namespace, "gamma"] in [line.split()[:2] for line in wide.stdout.splitlines()]
    assert "NAMESPACE" not in wide.stdout


def test_get_with_nothing_found_says_so_on_stderr(
    cli: Callable[..., Result], namespace: str
) -> None:
    result = cli("get")

    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == f"No stacks found in namespace {namespace}.\n"


def test_get_watch_prints_changes(cluster: Any, kube: Kube, namespace: str) -> None:
    make_stack(kube, namespace, "watched")
    process = subprocess.Popen(
        [sys.executable, "-m", "pkobatch.main", "get", "-w", "--timeout", "45s", "-n", namespace],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    reader = threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    try:
        assert lines.get(timeout=90).split()[:2] == ["NAME", "STACK"]
        assert lines.get(timeout=90).split()[:2] == ["watched", "org/p/watched"]
        set_status(
            kube,
            namespace,
            "watched",
            {"conditions": READY, "lastUpdate": {"type": "up", "state": "succeeded"}},
        )
        changed = lines.get(timeout=90).split()
        assert changed[:6] == [
            "watched",
            "org/p/watched",
            "up",
            "succeeded",
            "True",
            "ProcessingCompleted",
        ]
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()
        process.wait()


# -- describe, outputs, history, logs, events ------------------------------------------------


HISTORY_TABLE = """\
RUN        OPERATION   RESULT      REASON                 COMMIT    STARTED   DURATION   CHANGES
web-up-2   up          failed      BackoffLimitExceeded   -         *********************-
web-up-1   up          succeeded   Succeeded              0123456   *********************create=2 same=1
"""  # noqa: E501


def test_describe_outputs_history_logs_and_events(
    cli: Callable[..., Result], kube: Kube, namespace: str, python_job: Callable[..., JSON]
) -> None:
    stack = make_stack(
        kube, namespace, "web", projectRepo="https://git.example/web.git", branch="main"
    )
    run_job(kube, python_job, namespace, "web-up-1", "web", "up", "print('hello from the run')")
    run_job(
        kube,
        python_job,
        namespace,
        "web-up-2",
        "web",
        "up",
        "import sys; print('boom'); sys.exit(3)",
    )
    finished(kube, namespace, "web-up-1")
    finished(kube, namespace, "web-up-2")
    result_configmap(kube, namespace, "web-up-1", "web")
    set_status(
        kube,
        namespace,
        "web",
        {
            "observedGeneration": 1,
            "lastUpdate": {
                "name": "web-up-2",
                "type": "up",
                "state": "failed",
                "generation": 1,
                "message": "the run ended without writing a result",
                "failures": 1,
                "lastAttemptedCommit": SHA,
                "lastResyncTime": HOUR_AGO_TEXT,
            },
            "conditions": STALLED,
            "outputs": {"url": "https://x.example", "token": "[secret]"},
        },
    )
    create_event(kube, namespace, stack, "web.1", "StackUpdateFailure", "up failed: boom")

    described = cli("describe", "web")
    outputs = cli("outputs", "web")
    outputs_json = cli("outputs", "web", "-o", "json")
    history = cli("history", "web")
    history_json = cli("history", "web", "-o", "json")
    logs_last = cli("logs", "web")
    logs_first = cli("logs", "web", "--run", "web-up-1", "-f")
    events = cli("events", "web", "-o", "json")
    history_names = cli("history", "web", "-o", "name")
    history_rows = cli("history", "web", "--no-headers")

    assert described.exit_code == 0, described.output
    text = described.stdout
    assert "Source:      git https://git.example/web.git, branch main\n" in text
    assert "  Result:             failed (BackoffLimitExceeded)\n" in text
    assert "  token   [secret]\n" in text
    assert re.search(r"\n  \d+s +Warning +StackUpdateFailure +stack/web +up failed: boom\n", text)
    recent = text.split("Recent Runs:\n")[1].split("Events:")[0]
    assert [line.split()[:4] for line in recent.splitlines()] == [
        ["RUN", "OPERATION", "RESULT", "REASON"],
        ["web-up-2", "up", "failed", "BackoffLimitExceeded"],
        ["web-up-1", "up", "succeeded", "Succeeded"],
    ]

    assert outputs.stdout == "NAME    VALUE\ntoken   [secret]\nurl     https://x.example\n"
    assert json.loads(outputs_json.stdout) == {"url": "https://x.example", "token": "[secret]"}

    assert history.exit_code == 0, history.output
    assert mask_column(history.stdout, "STARTED", "CHANGES") == HISTORY_TABLE
    records = {r["run"]: r for r in json.loads(history_json.stdout)}
    assert records["web-up-1"]["durationSeconds"] == 42.0
    assert records["web-up-1"]["pulumiVersion"] == "3.259.0"
    assert records["web-up-2"]["result"] == "failed"
    assert history_names.stdout == "job.batch/web-up-2\njob.batch/web-up-1\n"
    assert [line.split()[0] for line in history_rows.stdout.splitlines()] == [
        "web-up-2",
        "web-up-1",
    ]

    assert logs_last.exit_code == 0, logs_last.output
    assert logs_last.stdout == "boom\n"
    assert logs_first.stdout == "hello from the run\n"

    reasons = [e["reason"] for e in json.loads(events.stdout)["items"]]
    assert "StackUpdateFailure" in reasons
    assert "SuccessfulCreate" in reasons, "the run Jobs' events are included"


def test_logs_of_a_run_that_does_not_exist(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    make_stack(kube, namespace, "web")

    no_runs = cli("logs", "web")
    unknown = cli("logs", "web", "--run", "web-up-9")

    assert (no_runs.exit_code, no_runs.stderr) == (1, "Error: stack web has no runs yet\n")
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("Error: run web-up-9 not found")


def test_events_watch_prints_new_events(cluster: Any, kube: Kube, namespace: str) -> None:
    stack = make_stack(kube, namespace, "web")
    create_event(kube, namespace, stack, "web.early", "StackUpdateDetected", "initial")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pkobatch.main",
            "events",
            "web",
            "-w",
            "--timeout",
            "45s",
            "-n",
            namespace,
        ],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _lines_of(process)
    try:
        assert lines.get(timeout=90).split() == [
            "LAST",
            "SEEN",
            "TYPE",
            "REASON",
            "OBJECT",
            "MESSAGE",
        ]
        assert "StackUpdateDetected   stack/web   initial" in lines.get(timeout=90)
        create_event(kube, namespace, stack, "web.late", "StackCreated", "up succeeded")
        assert "StackCreated   stack/web   up succeeded" in lines.get(timeout=90)
        assert process.wait(timeout=120) == 0
    finally:
        process.kill()
        process.wait()


# -- schedule ---------------------------------------------------------------------------------


def test_schedule(cli: Callable[..., Result], kube: Kube, namespace: str) -> None:
    make_stack(
        kube,
        namespace,
        "nightly",
        schedule="0 3 * * *",
        timeZone="Europe/Berlin",
        driftDetection={"schedule": "30 4 * * 1"},
    )
    make_stack(kube, namespace, "plain")

    table = cli("schedule", "nightly", "--next", "2")
    data = cli("schedule", "nightly", "--next", "3", "-o", "json")
    none = cli("schedule", "plain")

    assert table.exit_code == 0, table.output
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["TIME", "IN", "SCHEDULE", "OPERATION"]
    assert len(rows) == 4
    assert all(row.split()[0].endswith(("+01:00", "+02:00")) for row in rows)
    times = json.loads(data.stdout)
    scheduled = [t for t in times if t["schedule"] == "schedule"]
    assert [t["operation"] for t in scheduled] == ["up"] * 3
    for entry in scheduled:
        utc = datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
        local = utc.astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.hour, local.minute) == (3, 0)
    assert none.exit_code == 0
    assert none.stderr.startswith("Stack plain has no schedule")


# -- requests ---------------------------------------------------------------------------------


def test_operation_requests_set_the_annotation(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    make_stack(kube, namespace, "web")

    result = cli("refresh", "web", "--no-wait", "-o", "json")

    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["result"] == "requested"
    value = kube.get(STACKS, "web", namespace)["metadata"]["annotations"][
        "pkobatch.io/operation-request"
    ]
    assert value == outcome["request"]
    op, _, token = value.partition(":")
    assert op == "refresh"
    assert datetime.fromisoformat(token.replace("Z", "+00:00")) > datetime.now(UTC) - timedelta(
        minutes=5
    )


def test_a_second_request_replaces_an_unacknowledged_one_with_a_warning(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    make_stack(kube, namespace, "web")
    cli("up", "web", "--no-wait")

    second = cli("preview", "web", "--no-wait")

    assert second.exit_code == 0
    assert "replaced the pending request up:" in second.stderr
    annotations = kube.get(STACKS, "web", namespace)["metadata"]["annotations"]
    assert annotations["pkobatch.io/operation-request"].startswith("preview:")


def test_many_stacks_at_once(
    cli: Callable[..., Result], kube: Kube, namespace: str, three_stacks: None
) -> None:
    result = cli("up", "-l", "team=a", "--no-wait")

    assert result.exit_code == 0, result.output
    rows = [line.split()[1:4] for line in result.stdout.splitlines()]
    assert rows == [
        ["NAME", "OPERATION", "RESULT"],
        ["alpha", "up", "requested"],
        ["beta", "up", "requested"],
    ]
    for name, requested in (("alpha", True), ("beta", True), ("gamma", False)):
        annotations = kube.get(STACKS, name, namespace)["metadata"].get("annotations") or {}
        assert ("pkobatch.io/operation-request" in annotations) == requested


def test_destroy_asks_first(cli: Callable[..., Result], kube: Kube, namespace: str) -> None:
    make_stack(kube, namespace, "web")

    no_answer = cli("destroy", "web", "--no-wait")
    declined = cli("destroy", "web", "--no-wait", input="n\n")
    annotations_after_refusals = kube.get(STACKS, "web", namespace)["metadata"].get("annotations")
    confirmed = cli("destroy", "web", "--no-wait", input="y\n")

    assert no_answer.exit_code == 2
    assert "pass --yes" in no_answer.stderr
    assert declined.exit_code == 1
    assert "nothing was destroyed" in declined.stderr
    assert not annotations_after_refusals
    assert confirmed.exit_code == 0, confirmed.output
    assert "Destroy every resource of" in confirmed.stderr
    value = kube.get(STACKS, "web", namespace)["metadata"]["annotations"][
        "pkobatch.io/operation-request"
    ]
    assert value.startswith("destroy:")


def test_reconcile_sets_pko_annotation(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    make_stack(kube, namespace, "web")
    make_stack(kube, namespace, "paused", suspend=True)

    requested = cli("reconcile", "web", "--no-wait")
    token = kube.get(STACKS, "web", namespace)["metadata"]["annotations"][
        "pulumi.com/reconciliation-request"
    ]
    suspended = cli("reconcile", "paused")
    waited = cli("reconcile", "web", "--timeout", "3s")

    assert requested.exit_code == 0, requested.output
    assert requested.stdout == f"reconcile requested for {namespace}/web ({token})\n"
    assert suspended.exit_code == 1
    assert suspended.stderr == (
        "Error: stack paused is suspended: resume it first with `pkobatch resume paused`\n"
    )
    # Nobody answers without a controller: the wait times out with exit 1.
    assert waited.exit_code == 1
    assert "timed out after 3s waiting for reconcile" in waited.stderr


def test_cancel_needs_a_running_run(cli: Callable[..., Result], kube: Kube, namespace: str) -> None:
    make_stack(kube, namespace, "web")
    make_stack(kube, namespace, "busy")
    set_status(kube, namespace, "busy", {"currentUpdate": {"name": "busy-up-1", "generation": 1}})

    idle = cli("cancel", "web")
    busy = cli("cancel", "busy", "--no-wait")

    assert (idle.exit_code, idle.stderr) == (1, "Error: stack web has no run in progress\n")
    assert busy.exit_code == 0, busy.output
    value = kube.get(STACKS, "busy", namespace)["metadata"]["annotations"][
        "pkobatch.io/operation-request"
    ]
    assert value.startswith("cancel:")


def test_suspend_and_resume(
    cli: Callable[..., Result], kube: Kube, namespace: str, three_stacks: None
) -> None:
    suspended = cli("suspend", "alpha")
    assert kube.get(STACKS, "alpha", namespace)["spec"]["suspend"] is True
    resumed = cli("resume", "--all", "--no-wait", "-o", "json")

    assert suspended.stdout == f"stack {namespace}/alpha suspended\n"
    outcomes = json.loads(resumed.stdout)
    assert [(o["name"], o["operation"], o["result"]) for o in outcomes] == [
        (name, "resume", "requested") for name in ("alpha", "beta", "gamma")
    ]
    for outcome in outcomes:
        stack = kube.get(STACKS, outcome["name"], namespace)
        assert stack["spec"]["suspend"] is False
        # As `flux resume`: a run of the normal operation is requested in the same write.
        annotations = stack["metadata"]["annotations"]
        assert annotations["pulumi.com/reconciliation-request"] == outcome["request"]
    alpha = kube.get(STACKS, "alpha", namespace)
    managers = {m["manager"] for m in alpha["metadata"]["managedFields"]}
    assert "pkobatch-cli" in managers


def test_every_operation_follows_its_run_unless_told_not_to(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    """Without a controller nobody answers: following ends at --timeout with exit 1, on a
    terminal or not (CliRunner's stdout is none). --no-wait only requests, --wait changes
    nothing."""
    make_stack(kube, namespace, "web")
    make_stack(kube, namespace, "paused", suspend=True)
    make_stack(kube, namespace, "busy")
    set_status(kube, namespace, "busy", {"currentUpdate": {"name": "busy-up-1", "generation": 1}})
    make_stack(kube, namespace, "gated", approval={"required": True})
    set_status(kube, namespace, "gated", {"approval": {"planID": PLAN_ID, "state": "Pending"}})
    commands = {
        "up": ["up", "web"],
        "preview": ["preview", "web"],
        "refresh": ["refresh", "web"],
        "destroy": ["destroy", "web", "--yes"],
        "reconcile": ["reconcile", "web"],
        "cancel": ["cancel", "busy"],
        "resume": ["resume", "paused"],
        "approve": ["approve", "gated", "--yes"],
        "reject": ["reject", "gated"],
    }

    for label, args in commands.items():
        followed = cli(*args, "--timeout", "1s")
        also_followed = cli(*args, "--wait", "--timeout", "1s")
        requested = cli(*args, "--no-wait", "-o", "json")

        for result in (followed, also_followed):
            assert result.exit_code == 1, (label, result.output)
            assert f"timed out after 1s waiting for {label} {namespace}/" in result.stderr, label
        assert requested.exit_code == 0, (label, requested.output)
        assert json.loads(requested.stdout)["result"] == "requested", label


# -- completion -------------------------------------------------------------------------------


def test_stack_names_complete(cluster: Any, kube: Kube, namespace: str, three_stacks: None) -> None:
    words = f"pkobatch describe --kubeconfig {cluster.kubeconfig} -n {namespace} "
    result = CliRunner().invoke(
        user_group(),
        env={"_PKOBATCH_COMPLETE": "bash_complete", "COMP_WORDS": words + "a", "COMP_CWORD": "6"},
        prog_name="pkobatch",
    )

    assert result.stdout.splitlines() == ["plain,alpha"]


# -- check, version ---------------------------------------------------------------------------


def _lease(
    kube: Kube, namespace: str, renewed: datetime, name: str = "pkobatch-controller"
) -> None:
    kube.create(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": "controller-0",
                "leaseDurationSeconds": 35,
                "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        },
        namespace,
    )


def _deployment(
    kube: Kube,
    namespace: str,
    name: str = "pkobatch-controller",
    extra_labels: dict[str, str] | None = None,
    env: list[JSON] | None = None,
) -> None:
    # As deploy/ labels the main controller; a shard's extra_labels change the component.
    labels = {
        "app.kubernetes.io/name": "pkobatch",
        "app.kubernetes.io/part-of": "pkobatch",
        "app.kubernetes.io/component": "controller",
        **(extra_labels or {}),
    }
    container: JSON = {"name": "controller", "image": "pkobatch/runner:9.8.7", "env": env or []}
    kube.create(
        DEPLOYMENTS,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [container]},
                },
            },
        },
        namespace,
    )


def checks_of(result: Result) -> dict[str, JSON]:
    """`check -o json`'s checks by name."""
    return {c["check"]: c for c in json.loads(result.stdout)}


def test_check_with_a_leader(cli: Callable[..., Result], kube: Kube, namespace: str) -> None:
    _lease(kube, namespace, datetime.now(UTC))

    result = cli("check", "--controller-namespace", namespace, "-o", "json")

    checks = checks_of(result)
    assert result.exit_code == 0, result.output
    assert checks["api server"]["result"] == "ok"
    assert checks["crd"] == {
        "check": "crd",
        "result": "ok",
        "detail": "stacks.pulumi.com is installed and current",
    }
    assert checks["controller leader"]["result"] == "ok"
    assert checks["controller leader"]["detail"].startswith("controller-0 (renewed ")
    assert checks["controller deployment"]["result"] == "warning"
    rbac = [c for name, c in checks.items() if name.startswith("rbac: ")]
    assert rbac, f"no RBAC checks among {sorted(checks)}"
    assert all(c["result"] == "ok" for c in rbac), rbac


def test_check_names_each_controller_shard_without_a_leader(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    _lease(kube, namespace, datetime.now(UTC))
    for shard in ("blue", "green"):
        shard_labels = {
            "app.kubernetes.io/component": "controller-shard",
            "pkobatch.io/controller-shard": shard,
        }
        # With leader election, as deploy/kustomize/shard runs a shard.
        election = [{"name": "PKOBATCH_LEADER_ELECTION__ENABLED", "value": "true"}]
        _deployment(kube, namespace, f"pkobatch-controller-{shard}", shard_labels, election)
    _lease(kube, namespace, datetime.now(UTC), "pkobatch-controller-blue")

    result = cli("check", "--controller-namespace", namespace, "-o", "json")

    checks = checks_of(result)
    assert result.exit_code == 1, result.output
    assert checks["controller leader"]["result"] == "ok"
    assert checks["shard blue leader"]["result"] == "ok"
    assert checks["shard green leader"]["result"] == "FAIL"
    assert (
        f"no Lease {namespace}/pkobatch-controller-green"
        in (checks["shard green leader"]["detail"])
    )


def test_check_passes_a_ready_controller_without_leader_election(
    cli: Callable[..., Result], kube: Kube, namespace: str
) -> None:
    off = [{"name": "PKOBATCH_LEADER_ELECTION__ENABLED", "value": "false"}]
    # Renamed, as the chart's fullnameOverride does: check finds it by its labels.
    _deployment(kube, namespace, "acme-pko-controller", env=off)
    # The Deployment controller is not part of the test control plane: its status is set here.
    kube.merge_patch(
        DEPLOYMENTS,
        "acme-pko-controller",
        {"status": {"replicas": 1, "readyReplicas": 1}},
        namespace,
        subresource="status",
    )

    result = cli("check", "--controller-namespace", namespace, "-o", "json")

    checks = checks_of(result)
    assert result.exit_code == 0, result.output
    assert checks["controller deployment"]["result"] == "ok"
    assert checks["controller deployment"]["detail"].startswith(f"{namespace}/acme-pko-controller:")
    assert checks["controller leader"] == {
        "check": "controller leader",
        "result": "ok",
        "detail": "none needed: leader election is off (PKOBATCH_LEADER_ELECTION__ENABLED)",
    }


def test_check_without_a_controller_fails(cli: Callable[..., Result], namespace: str) -> None:
    result = cli("check", "--controller-namespace", namespace)

    assert result.exit_code == 1
    leader = next(
        line for line in result.stdout.splitlines() if line.startswith("controller leader")
    )
    assert leader.split()[2] == "FAIL"


def test_check_and_get_as_a_user_without_rights(
    cli: Callable[..., Result], cluster: Any, namespace: str, tmp_path: Path
) -> None:
    config = cluster.service_account_kubeconfig(namespace, "pkobatch-runner", tmp_path / "sa")

    check = cli("check", "--controller-namespace", namespace, "-o", "json", kubeconfig=config)
    get = cli("get", kubeconfig=config)
    describe = cli("describe", "web", kubeconfig=config)

    assert check.exit_code == 1
    rbac = [c for c in json.loads(check.stdout) if c["check"].startswith("rbac: ")]
    assert rbac and all(c["result"] == "FAIL" for c in rbac)
    assert "cannot get stacks, list stacks, watch stacks in namespace" in rbac[0]["detail"]
    for result in (get, describe):
        assert result.exit_code == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith("Error: forbidden: ")
        assert "system:serviceaccount:" in line and "`pkobatch check`" in line


def test_connection_options_impersonate_and_replace_server_and_token(
    cli: Callable[..., Result], cluster: Any, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    runner = service_account_user(namespace, "pkobatch-runner")
    make_stack(kube, namespace, "web")
    # A kubeconfig whose server is wrong and whose user has no credentials.
    ca = cluster.control_plane.pki.ca_cert.read_bytes()
    nowhere = write_kubeconfig(
        tmp_path / "nowhere", kubeconfig("https://127.0.0.1:1", ca, "nobody", {})
    )
    token = request_token(kube, namespace, "pkobatch-runner")

    as_runner = cli("get", "--as", runner)
    as_two_groups = cli(
        "get", "-o", "name", "--as", "jane", "--as-group", "x", "--as-group", "system:masters"
    )
    only_one_group = cli("get", "--as", "jane", "--as-group", "x")
    with_token = cli("get", "--server", cluster.server, "--token", token, kubeconfig=nowhere)
    unreachable = cli("get", kubeconfig=nowhere)

    for refused, user in ((as_runner, runner), (only_one_group, '"jane"'), (with_token, runner)):
        assert refused.exit_code == 1, refused.output
        (line,) = refused.stderr.splitlines()
        assert line.startswith("Error: forbidden: ") and user in line, line
    # Each group is its own Impersonate-Group header: system:masters is one of them.
    assert as_two_groups.exit_code == 0, as_two_groups.output
    assert as_two_groups.stdout == "stack.pulumi.com/web\n"
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in unreachable.stderr


def test_logs_of_the_controller_pods(
    cli: Callable[..., Result], kube: Kube, namespace: str, python_job: Callable[..., JSON]
) -> None:
    """Pods labelled as deploy/ labels the controller (and a shard); a run's pod and another
    application's controller pod are not."""
    for name, part_of, component in (
        ("main", "pkobatch", "controller"),
        ("shard", "pkobatch", "controller-shard"),
        ("other", "other-app", "controller"),
    ):
        body = python_job(
            name, f"print('{name} one'); print('{name} two')", container={"name": "controller"}
        )
        labels = {"app.kubernetes.io/part-of": part_of, "app.kubernetes.io/component": component}
        body["spec"]["template"]["metadata"] = {"labels": labels}
        kube.create(JOBS, body, namespace)
    run_job(kube, python_job, namespace, "web-up-1", "web", "up", "print('a run')")
    for job in ("main", "shard", "other", "web-up-1"):
        finished(kube, namespace, job)

    everything = cli("logs", "--controller", "--controller-namespace", namespace)
    last = cli("logs", "--controller", "--controller-namespace", namespace, "--tail", "1")
    elsewhere = cli("logs", "--controller")

    assert everything.exit_code == 0, everything.output
    lines = everything.stdout.splitlines()
    assert sorted(re.sub(r"^\[pod/(\w+)-\w+\] ", r"\1: ", line) for line in lines) == [
        "main: main one",
        "main: main two",
        "shard: shard one",
        "shard: shard two",
    ]
    assert sorted(line.split("] ")[1] for line in last.stdout.splitlines()) == [
        "main two",
        "shard two",
    ]
    assert elsewhere.exit_code == 1
    assert "no controller pod in namespace" in elsewhere.stderr


def test_version(cli: Callable[..., Result], kube: Kube, namespace: str) -> None:
    _deployment(kube, namespace, "acme-pko-controller")
    result_configmap(kube, namespace, "web-up-1", "web", pulumiVersion="3.259.0")

    result = cli("version", "--controller-namespace", namespace, "-o", "json")

    assert result.exit_code == 0, result.output
    versions = json.loads(result.stdout)
    assert versions["cli"]["version"] == __version__
    assert versions["kubernetes"]["version"].startswith("v1.")
    assert versions["controller"] == {
        "version": "9.8.7",
        "detail": f"Deployment {namespace}/acme-pko-controller runs pkobatch/runner:9.8.7",
    }
    assert versions["crd"] == {"version": "v1, v1alpha1", "detail": "matches this CLI"}
    assert versions["pulumi"] == {"version": "3.259.0", "detail": "used by run web-up-1"}


# -- errors -----------------------------------------------------------------------------------


def test_unknown_stack_is_one_line_and_exit_1(cli: Callable[..., Result], namespace: str) -> None:
    for args in (
        ["describe", "nope"],
        ["get", "nope"],
        ["refresh", "nope", "--no-wait"],
        ["outputs", "nope"],
    ):
        result = cli(*args)

        assert result.exit_code == 1
        assert result.stderr == (
            f'Error: stack "nope" not found in namespace "{namespace}" '
            "(list them with `pkobatch get`, or pass -n NAMESPACE)\n"
        )


@pytest.fixture(scope="module")
def cluster_without_crd(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A second real control plane on which the Stack CRD was never installed."""
    control_plane = ControlPlane(tmp_path_factory.mktemp("no-crd"), cluster.tools, crds_dir=None)
    control_plane.start()
    try:
        yield control_plane.kubeconfig
    finally:
        control_plane.stop()


def test_missing_crd_is_one_line_and_exit_1(
    cluster_without_crd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for args in (["get"], ["describe", "web"], ["refresh", "web", "--no-wait"]):
        result = CliRunner().invoke(user_group(), [*args, "--kubeconfig", str(cluster_without_crd)])

        assert result.exit_code == 1, result.output
        assert result.stderr == (
            "Error: the Stack CRD (stacks.pulumi.com/v1) is not installed in this cluster: "
            "install it with `pkobatch crds | kubectl apply -f -` "
            "(run `pkobatch check` for details)\n"
        )
    check = CliRunner().invoke(user_group(), ["check", "--kubeconfig", str(cluster_without_crd)])
    assert check.exit_code == 1
    crd = next(line for line in check.stdout.splitlines() if line.startswith("crd"))
    assert crd.split()[1] == "FAIL"


def test_kubectl_runs_pkobatch_as_a_plugin(cluster: Any, kube: Kube, namespace: str) -> None:
    bin_dir = Path(sys.executable).parent
    kubectl = bin_dir / "kubectl"
    assert (bin_dir / "kubectl-pkobatch").is_file(), "pip install -e . installs kubectl-pkobatch"
    make_stack(kube, namespace, "plugin-stack", projectRepo="https://e.invalid/r", branch="main")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cluster.state_dir)}
    listed = subprocess.run(
        [str(kubectl), "plugin", "list", "--name-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "kubectl-pkobatch" in listed.stdout, listed.stdout + listed.stderr
    got = subprocess.run(
        [str(kubectl), "pkobatch", "get", "-o", "json", "-n", namespace],
        env={**env, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert [item["metadata"]["name"] for item in json.loads(got.stdout)["items"]] == [
        "plugin-stack"
    ]


def test_kubectl_completes_the_plugin_stack_names_included(
    cluster: Any, kube: Kube, namespace: str, three_stacks: None
) -> None:
    """kubectl's own completion asks kubectl_complete-pkobatch (installed with pkobatch)."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "kubectl_complete-pkobatch").is_file(), "pip install -e . installs it"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cluster.state_dir)}

    def complete(*words: str) -> list[str]:
        done = subprocess.run(
            [str(bin_dir / "kubectl"), "__complete", "pkobatch", *words],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    flags = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    assert complete("comp") == [
        "completion\tPrint the shell completion script (bash, zsh, fish).",
        ":4",
    ]
    assert complete("describe", *flags, "") == ["alpha", "beta", "gamma", ":4"]
    assert complete("resume", *flags, "g") == ["gamma", ":4"]
