"""Cancellation: SIGINT, a second SIGINT, then a kill — on real child processes.

The children are small Python scripts that behave like the Pulumi CLI (count SIGINTs), so the
escalation can be watched with budgets of a second or two.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pkobatch.runner.cancel import Budget, Cancellation, grace_seconds_from
from pkobatch.runner.failures import RunFailure

# Prints one line per SIGINT; exits after `exit_after` of them (0 = never, ignores them).
CHILD = """
import signal, sys, time
exit_after = int(sys.argv[1])
count = 0
def on_int(signum, frame):
    global count
    count += 1
    print(f"sigint {count}", flush=True)
    if exit_after and count >= exit_after:
        sys.exit(130)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def start_child(exit_after: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(exit_after)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def finish(process: subprocess.Popen[str], cancellation: Cancellation) -> tuple[int, str]:
    with cancellation.track(process, graceful=True):
        cancellation.request("SIGTERM")
        output, _ = process.communicate(timeout=30)
    return process.returncode, output


def test_first_signal_cancels_and_the_budget_brings_the_second() -> None:
    cancellation = Cancellation(Budget(terminate_after=0.5, kill_after=20, exit_by=25))
    started = time.monotonic()
    code, output = finish(start_child(exit_after=2), cancellation)
    assert output.split("\n")[:2] == ["sigint 1", "sigint 2"]
    assert code == 130
    assert time.monotonic() - started >= 0.5
    assert not cancellation.killed


def test_a_child_that_ignores_signals_is_killed_at_the_end_of_the_budget() -> None:
    cancellation = Cancellation(Budget(terminate_after=0.2, kill_after=1.0, exit_by=2))
    code, output = finish(start_child(exit_after=0), cancellation)
    assert code == -9
    assert output.split() == ["sigint", "1", "sigint", "2"]
    assert cancellation.killed
    assert "was killed" in cancellation.failure().message


def test_each_further_signal_skips_a_step() -> None:
    cancellation = Cancellation(Budget(terminate_after=60, kill_after=120, exit_by=130))
    process = start_child(exit_after=2)
    with cancellation.track(process, graceful=True):
        cancellation.request("SIGINT")
        cancellation.request("SIGINT")
        output, _ = process.communicate(timeout=30)
    assert output.split("\n")[:2] == ["sigint 1", "sigint 2"]


def test_commands_without_a_lock_are_killed_at_once() -> None:
    cancellation = Cancellation(Budget(terminate_after=60, kill_after=120, exit_by=130))
    threading.Timer(0.3, cancellation.request, args=("SIGTERM",)).start()
    started = time.monotonic()
    with pytest.raises(RunFailure) as raised:
        cancellation.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=60)
    assert raised.value.reason == "Cancelled"
    assert time.monotonic() - started < 30


def test_nothing_starts_after_cancellation(tmp_path: Path) -> None:
    cancellation = Cancellation(Budget.for_grace(30))
    cancellation.request("SIGTERM")
    marker = tmp_path / "ran"
    with pytest.raises(RunFailure):
        cancellation.run(["touch", str(marker)], timeout=10)
    assert not marker.exists()


def test_a_signal_at_the_jobs_deadline_is_deadline_exceeded() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    cancellation = Cancellation(Budget.for_grace(30), now=lambda: now)
    cancellation.deadline = now + timedelta(seconds=1)
    cancellation.request("SIGTERM")
    assert cancellation.reason == "DeadlineExceeded"
    early = Cancellation(Budget.for_grace(30), now=lambda: now)
    early.deadline = now + timedelta(minutes=10)
    early.request("SIGTERM")
    assert early.reason == "Cancelled"
    assert "SIGTERM received" in early.failure().message


def test_budget_leaves_room_to_write_the_result() -> None:
    budget = Budget.for_grace(30)
    assert budget.terminate_after < budget.kill_after < budget.exit_by < 30
    assert 30 - budget.kill_after >= 2
    assert Budget.for_grace(600).kill_after == 590
    for grace in (15, 30, 120, 600):
        budget = Budget.for_grace(grace)
        # Terminating (saving the state, releasing the lock) gets enough time.
        assert budget.kill_after - budget.terminate_after >= min(10, budget.kill_after)
    assert grace_seconds_from({"PKOBATCH_GRACE_PERIOD_SECONDS": "120"}) == 120
    assert grace_seconds_from({"PKOBATCH_GRACE_PERIOD_SECONDS": "x"}) == 30
    assert grace_seconds_from({}) == 30


def test_seconds_left_counts_down_only_after_a_signal() -> None:
    clock = [100.0]
    cancellation = Cancellation(Budget.for_grace(30), clock=lambda: clock[0])
    assert cancellation.seconds_left() == float("inf")
    cancellation.request("SIGTERM")
    clock[0] += 10
    assert cancellation.seconds_left() == pytest.approx(Budget.for_grace(30).exit_by - 10)


def test_the_runner_stops_itself_a_grace_period_before_the_jobs_deadline() -> None:
    budget = Budget(terminate_after=5, kill_after=10, exit_by=12)
    soon = Cancellation(budget)
    soon.stop_before(datetime.now(UTC) + timedelta(seconds=budget.exit_by + 1.5))
    started = time.monotonic()
    while not soon.requested and time.monotonic() - started < 20:
        time.sleep(0.05)
    assert soon.requested
    assert soon.reason == "DeadlineExceeded"
    assert "activeDeadlineSeconds" in soon.failure().message

    later = Cancellation(budget)
    timer = later.stop_before(datetime.now(UTC) + timedelta(hours=1))
    assert not later.requested
    timer.cancel()
