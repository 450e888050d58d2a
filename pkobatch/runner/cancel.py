"""Ending a run cleanly on SIGTERM (pod deleted, evicted or past its deadline) or SIGINT.

Kubernetes sends SIGTERM, waits ``terminationGracePeriodSeconds``, then sends SIGKILL. A Pulumi
update must not simply die: a killed update keeps the stack locked (a DIY backend's lock file
stays behind, Pulumi Cloud shows the update as running) and leaves pending operations. The
Pulumi CLI has its own protocol for this, which the runner follows:

1. the first SIGINT **cancels**: no new resource operation starts, those in flight finish,
   the state is saved and the lock released;
2. a second SIGINT **terminates**: plugins are killed, the state is saved, the lock released;
3. only if the CLI is still running at the end of the budget is its process group killed,
   and the run then calls ``pulumi cancel`` to remove the lock it left.

The CLI runs in its own session, so only the runner signals it (a terminal's Ctrl-C reaches
the runner, not Pulumi, and is counted once). Other subprocesses (git, pip) hold no lock and
are killed at once. Each further signal the runner receives skips to the next step.

The budget is the grace period (``PKOBATCH_GRACE_PERIOD_SECONDS``, set by the Job builder
from ``terminationGracePeriodSeconds``; default 30 s, Kubernetes' default) minus a reserve for
writing the ``Cancelled`` result. The second SIGINT comes halfway through the budget, or
earlier so that terminating gets ``TERMINATE_SECONDS``.

When the Job has an ``activeDeadlineSeconds``, the runner does not wait for the Job
controller's SIGTERM: it starts the same sequence itself one grace period before the deadline
(``stop_before``), so the run ends ``DeadlineExceeded`` with its result written in time.

The signal handler only records the signal and wakes a watchdog thread; all the work happens
there, so the handler can never block on a lock the interrupted main thread holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Final

from pkobatch.api.constants import ResultReason
from pkobatch.runner.failures import RunFailure

GRACE_PERIOD_ENV: Final = "PKOBATCH_GRACE_PERIOD_SECONDS"
DEFAULT_GRACE_SECONDS: Final = 30.0
# What a terminating Pulumi CLI needs to save its state and exit: about 5 s when it runs an
# inline program (it waits for the program's language server), more on a loaded node.
TERMINATE_SECONDS: Final = 10.0
# Signals within this many seconds of the Job's deadline count as the deadline.
DEADLINE_SLACK_SECONDS: Final = 5.0
SIGNAL_SPACING_SECONDS: Final = 0.25
# The cancellation source when the runner stops itself ahead of the Job's deadline.
DEADLINE: Final = "deadline"

_INTERRUPT, _TERMINATE, _KILL = 1, 2, 3


def grace_seconds_from(env: Mapping[str, str]) -> float:
    try:
        value = float(env.get(GRACE_PERIOD_ENV, ""))
    except ValueError:
        return DEFAULT_GRACE_SECONDS
    return value if value > 0 else DEFAULT_GRACE_SECONDS


@dataclass(frozen=True)
class Budget:
    """Seconds after the first signal at which each step happens."""

    terminate_after: float
    kill_after: float
    exit_by: float

    @classmethod
    def for_grace(cls, grace: float) -> Budget:
        reserve = min(10.0, max(2.0, grace * 0.2))
        kill_after = max(grace - reserve, 1.0)
        return cls(
            terminate_after=max(0.0, min(kill_after / 2, kill_after - TERMINATE_SECONDS)),
            kill_after=kill_after,
            exit_by=max(grace - 1.0, kill_after),
        )


@dataclass
class _Tracked:
    process: subprocess.Popen[str]
    graceful: bool
    applied: int = 0


class Cancellation:
    """The run's cancellation state, shared by the main thread and the watchdog."""

    def __init__(
        self,
        budget: Budget,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.budget = budget
        self._clock = clock
        self._now = now
        self._signals = 0
        self._first_at: float | None = None
        self._first_wall: datetime | None = None
        self._signal_name = ""
        self.deadline: datetime | None = None  # the Job's activeDeadline, when known
        self.killed = False
        self._lock = threading.Lock()
        self._tracked: _Tracked | None = None
        self._wake = threading.Event()
        self._watchdog: threading.Thread | None = None

    # -- signals ------------------------------------------------------------------------

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (main thread only)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.request(signal.Signals(signum).name)

    def request(self, source: str) -> None:
        """Record one cancellation request (a signal's name, or ``DEADLINE``); safe to call
        from a signal handler."""
        if self._first_at is None:
            self._first_at = self._clock()
            self._first_wall = self._now()
            self._signal_name = source
        self._signals += 1
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name="pkobatch-cancel", daemon=True
            )
            self._watchdog.start()
        self._wake.set()

    @property
    def requested(self) -> bool:
        return self._first_at is not None

    def seconds_left(self) -> float:
        """Until the run must have exited (infinite while not cancelled)."""
        if self._first_at is None:
            return float("inf")
        return self.budget.exit_by - (self._clock() - self._first_at)

    # -- the outcome ----------------------------------------------------------------------

    @property
    def reason(self) -> ResultReason:
        if self._signal_name == DEADLINE:
            return "DeadlineExceeded"
        if (
            self.deadline is not None
            and self._first_wall is not None
            and (self.deadline - self._first_wall).total_seconds() <= DEADLINE_SLACK_SECONDS
        ):
            return "DeadlineExceeded"
        return "Cancelled"

    def failure(self) -> RunFailure:
        what = (
            "the Job reached its activeDeadlineSeconds"
            if self.reason == "DeadlineExceeded"
            else f"{self._signal_name} received (pod deleted or evicted, or run cancelled)"
        )
        how = (
            "Pulumi did not stop within the grace period and was killed; the runner tried "
            "`pulumi cancel` to release the stack lock, and resources may have pending "
            "operations: run a refresh"
            if self.killed
            else "the operation was interrupted the way Pulumi expects (state saved, lock released)"
        )
        return RunFailure(self.reason, f"run stopped: {what}; {how}")

    def raise_if_requested(self) -> None:
        if self.requested:
            raise self.failure()

    def stop_before(self, deadline: datetime) -> threading.Timer:
        """Cancel the run on its own a grace period before the Job's ``deadline``, so that
        Pulumi stops cleanly and the result is written before the Job controller ends the
        pod (its SIGTERM would come too late for a long operation to stop cleanly)."""
        self.deadline = deadline
        lead = self.budget.exit_by + 1.0
        delay = max(0.0, (deadline - self._now()).total_seconds() - lead)
        timer = threading.Timer(delay, self.request, args=(DEADLINE,))
        timer.daemon = True
        timer.start()
        return timer

    # -- subprocesses ---------------------------------------------------------------------

    @contextlib.contextmanager
    def track(self, process: subprocess.Popen[str], *, graceful: bool) -> Iterator[None]:
        """While in this block, cancellation acts on ``process`` (started with
        ``start_new_session=True``): signals for a Pulumi CLI (``graceful``), a kill otherwise."""
        with self._lock:
            self._tracked = _Tracked(process, graceful)
        if self.requested:
            self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._tracked = None

    def run(
        self,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        *,
        timeout: float,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command that holds no lock (git, pip): on cancellation it is killed and
        the run's cancellation failure raised; ``subprocess.TimeoutExpired`` after
        ``timeout``."""
        self.raise_if_requested()
        with (
            subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,
            ) as process,
            self.track(process, graceful=False),
        ):
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                process.communicate()
                raise
        self.raise_if_requested()
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    def _target_level(self) -> int:
        if self._first_at is None:
            return 0
        elapsed = self._clock() - self._first_at
        level = min(self._signals, _KILL)
        if elapsed >= self.budget.kill_after:
            level = _KILL
        elif elapsed >= self.budget.terminate_after:
            level = max(level, _TERMINATE)
        return level

    def _next_step_in(self) -> float | None:
        if self._first_at is None:
            return None
        elapsed = self._clock() - self._first_at
        for at in (self.budget.terminate_after, self.budget.kill_after):
            if elapsed < at:
                return at - elapsed
        return None

    def _watch(self) -> None:
        while True:
            self._wake.wait(timeout=self._next_step_in())
            self._wake.clear()
            with self._lock:
                tracked = self._tracked
                if tracked is not None:
                    self._escalate(tracked, self._target_level())

    def _escalate(self, tracked: _Tracked, level: int) -> None:
        process = tracked.process
        if process.poll() is not None:
            return
        if not tracked.graceful:
            if level >= _INTERRUPT and tracked.applied < _KILL:
                _kill_group(process)
                tracked.applied = _KILL
            return
        while tracked.applied < level:
            if tracked.applied > 0:
                # Two signals sent back to back can merge into one pending signal.
                time.sleep(SIGNAL_SPACING_SECONDS)
            tracked.applied += 1
            if tracked.applied < _KILL:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGINT)
            else:
                self.killed = True
                _kill_group(process)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
