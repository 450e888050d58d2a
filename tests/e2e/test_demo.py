"""`pkobatch dev demo` as the README's main job runs it: a real Stack through the whole chain
(control plane, node agent, controller, runner, Pulumi), and nothing left running after it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.dev_env import alive, environment_pids, leftovers, listening_ports, pkobatch, row

from pkobatch.dev.processes import wait_until

# Building nothing, the demo takes about a minute; a slow, shared CI machine gets far more.
DEMO_TIMEOUT = 1500


@pytest.fixture
def state(tmp_path: Path, all_tools: Any) -> Iterator[Path]:
    state = tmp_path / "dev"
    yield state
    pkobatch("dev", "down", "--state-dir", str(state), check=False)


def status_of(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "status.json").read_text()))


def assert_the_demo_ran(result: Any, state: Path) -> None:
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    files = state / "demo" / "files"
    # The up's outputs, printed from status.outputs: plain values and the masked secret.
    assert row(out, "Ready", "True (ProcessingCompleted)")
    assert row(out, "contents", '["hello 0", "hello 1"]')
    assert row(out, "paths", json.dumps([str(files / "file-0.txt"), str(files / "file-1.txt")]))
    assert row(out, "token", "[secret]")
    # The refresh saw the file changed behind Pulumi's back.
    assert row(out, "refresh result", "Succeeded: same 2, update 1")
    assert row(out, "drifted resources", "1")
    # The destroy removed what the up created.
    assert row(out, "destroy result", "Succeeded: delete 3")
    assert files.is_dir() and list(files.iterdir()) == []
    assert out.rstrip().endswith("demo complete")
    # The secret's value never reaches the output.
    assert "demo-token-" not in out + result.stderr


def test_demo_runs_end_to_end_and_stops_what_it_started(state: Path) -> None:
    result = pkobatch("dev", "demo", "--state-dir", str(state), check=False, timeout=DEMO_TIMEOUT)

    assert_the_demo_ran(result, state)
    assert f"stopped the dev environment in {state}" in result.stdout
    status = status_of(state)
    assert status["state"] == "stopped"
    pids = [status["pid"], *status["components"].values(), status["controller"]["pid"]]
    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=60, what="processes to end")
    assert leftovers(state, set()) == []


def test_demo_keep_then_dev_down_leaves_nothing_behind(state: Path) -> None:
    result = pkobatch(
        "dev", "demo", "--keep", "--state-dir", str(state), check=False, timeout=DEMO_TIMEOUT
    )

    assert_the_demo_ran(result, state)
    assert f"pkobatch dev down --state-dir {state}" in result.stdout
    status = json.loads(pkobatch("dev", "status", "--state-dir", str(state), "-o", "json").stdout)
    assert status["state"] == "running"
    pids = environment_pids(status)
    ports = listening_ports(pids)
    assert status["controller"]["state"] == "running"

    assert "stopped" in pkobatch("dev", "down", "--state-dir", str(state)).stdout

    wait_until(lambda: not any(alive(pid) for pid in pids), timeout=60, what="processes to end")
    assert leftovers(state, ports) == []
    assert pkobatch("dev", "status", "--state-dir", str(state), check=False).returncode == 1
