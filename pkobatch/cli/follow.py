"""Waiting for a requested run: progress on stderr, the runner's output, then the Stack.

The wait polls the one Stack (a GET a second is cheap and, unlike a watch, cannot stall
silently) and hands it to a pure ``step`` function (``requests.operation_progress`` or
``reconcile_progress``). Once the run's Job is known, a thread follows its pod's output
through ``pkobatch.kube.pod_logs`` and prints it to stderr; the data the command prints at the
end goes to stdout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from rich.text import Text

from pkobatch.api.objects import JSON
from pkobatch.cli.fetch import get_stack_in, run_pods
from pkobatch.cli.requests import Progress
from pkobatch.cli.session import CommandFailed, Session
from pkobatch.kube.client import KubeError
from pkobatch.kube.pod_logs import ApiPodLogs, LogsUnavailable

POLL_INTERVAL: Final = 1.0
# The run's container in every Job (the controller's Job template names it so).
RUN_CONTAINER: Final = "pulumi"
# After the run ended, how long the last lines of its output may take to arrive.
LOG_DRAIN_SECONDS: Final = 10.0


class LogFollower:
    """Prints a run's output to stderr from a background thread."""

    def __init__(self, session: Session, namespace: str, job_name: str) -> None:
        self._session = session
        self._namespace = namespace
        self._job_name = job_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logs-{job_name}", daemon=True)

    def start(self) -> LogFollower:
        self._thread.start()
        return self

    def finish(self, timeout: float = LOG_DRAIN_SECONDS) -> None:
        """Let the output drain (the pod has ended or is ending)."""
        self._thread.join(timeout)

    def stop(self) -> None:
        """Stop printing; the thread ends at its next line or poll."""
        self._stop.set()

    def _run(self) -> None:
        kube = self._session.kube
        try:
            pod = ""
            while not pod and not self._stop.is_set():
                pods = run_pods(kube, self._namespace, self._job_name)
                # The kubelet serves a container's output once it has started.
                started = [p for p in pods if (p.get("status") or {}).get("phase") != "Pending"]
                pod = str((started[0].get("metadata") or {}).get("name") or "") if started else ""
                if not pod:
                    self._stop.wait(POLL_INTERVAL)
            if not pod:
                return
            logs = ApiPodLogs(kube)
            for line in logs.follow(self._namespace, pod, container=RUN_CONTAINER):
                self._session.err.print(Text(line.rstrip("\n"), style="dim"), markup=False)
                if self._stop.is_set():
                    return
        except (LogsUnavailable, KubeError) as exc:
            self._session.warn(f"cannot show the run's output: {exc}")


def wait_for(
    session: Session,
    stack: JSON,
    step: Callable[[JSON], Progress],
    *,
    label: str,
    show_logs: bool,
) -> tuple[JSON, Progress]:
    """Poll the Stack until ``step`` says done; raises CommandFailed on timeout.

    With ``show_logs`` the wait is shown (a spinner on a terminal, else a line per phase)
    and the run's output is printed as it comes; without, it is silent (many Stacks at once
    show their own progress)."""
    metadata = stack["metadata"]
    namespace, name = str(metadata["namespace"]), str(metadata["name"])
    follower: LogFollower | None = None
    last_phase = ""
    spinner = session.err.status(label) if show_logs and session.err.is_terminal else None
    started = time.monotonic()
    try:
        if spinner is not None:
            spinner.start()
        while True:
            progress = step(stack)
            phase = progress.phase + (f" (run {progress.job_name})" if progress.job_name else "")
            if spinner is not None:
                spinner.update(f"{label}: {phase} {int(time.monotonic() - started)}s")
            elif show_logs and phase != last_phase:
                session.progress(f"{label}: {phase}")
            last_phase = phase
            if show_logs and follower is None and progress.job_name:
                follower = LogFollower(session, namespace, progress.job_name).start()
            if progress.done:
                if follower is not None:
                    follower.finish()
                return stack, progress
            remaining = session.remaining()
            if remaining <= 0:
                hint = (
                    f"; follow it with `pkobatch logs {name} -n {namespace} -f`"
                    if progress.job_name
                    else ""
                )
                raise CommandFailed(
                    f"timed out after {session.timeout_text()} waiting for {label} "
                    f"({progress.phase}){hint}"
                )
            time.sleep(min(POLL_INTERVAL, remaining))
            stack = get_stack_in(session, namespace, name)
    finally:
        if follower is not None:
            follower.stop()
        if spinner is not None:
            spinner.stop()
