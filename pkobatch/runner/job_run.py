"""``pkobatch job run``: what every run's Job executes.

Order matters for speed and for safety:

1. signal handlers first, so a SIGTERM at any moment ends the run cleanly;
2. reading the run's own Job (for the result's labels and the deadline) runs on a thread
   while the run checks out and runs Pulumi (it pays for importing and connecting the
   Kubernetes client, which the run itself does not need); with a deadline, the run stops
   itself a grace period before it (``Cancellation.stop_before``). The result's owner, the
   Job's UID, comes from the pod's environment (``PKOBATCH_JOB_UID``), so a Job the run cannot
   read (API unreachable, no RBAC) does not cost the result its owner;
3. the run (``execute``, which also writes the objects of ``spec.exportOutputs``), then the
   result ConfigMap and, last, its digest in the termination message file (the controller
   folds only a result the run's pod vouches for so), then the exit status.

Exit status: 0 the run succeeded and its result was written; 1 it failed and its result was
written; 3 no result could be written, or not vouched for (the controller then records the
Job's failure itself). A success is folded only from a Job that completed, so 0 and a
succeeded result go together.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Final, TextIO

from pkobatch.api.run import JOB_UID_ENV, RunResult, RunSnapshot
from pkobatch.runner.cancel import Budget, Cancellation, grace_seconds_from
from pkobatch.runner.execute import execute, runner_only_env_names
from pkobatch.runner.memory import ContainerMemory
from pkobatch.runner.redact import Redactor
from pkobatch.runner.run_log import RunLog

EXIT_SUCCEEDED: Final = 0
EXIT_FAILED: Final = 1
EXIT_NO_RESULT: Final = 3
JOB_READ_WAIT_SECONDS: Final = 30.0


def summary_line(result: RunResult) -> str:
    first = result.message.splitlines()[0] if result.message else ""
    changes = ", ".join(f"{op}={count}" for op, count in sorted(result.changes.items()))
    parts = [f"result: {result.state} ({result.reason})"]
    if changes:
        parts.append(f"changes: {changes}")
    if result.drifted_resources is not None:
        parts.append(f"drifted: {result.drifted_resources}")
    if first:
        parts.append(first)
    return "; ".join(parts)


def run_job(
    snapshot: RunSnapshot, env: Mapping[str, str] | None = None, out: TextIO = sys.stdout
) -> int:
    """Run ``snapshot`` in this process and write its result ConfigMap; the exit status."""
    if env is None:
        env = dict(os.environ)
        # The program runs in this process: it must not read what only the runner needs.
        for name in runner_only_env_names(snapshot):
            os.environ.pop(name, None)
    env = dict(env)
    cancellation = Cancellation(Budget.for_grace(grace_seconds_from(env)))
    cancellation.install()
    log = RunLog(out, Redactor())
    writer = None
    reader = None
    outputs_writer = None
    if snapshot.result_config_map:
        from pkobatch.kube.client import Kube  # the client is slow to import: off the hot path
        from pkobatch.runner.report import (
            OutputsWriter,
            ResultNotWritten,
            ResultWriter,
            job_deadline,
            termination_log_path,
        )

        outputs_writer = OutputsWriter(Kube.connect, snapshot.stack.namespace)

        writer = ResultWriter(
            Kube.connect,
            snapshot.stack.namespace,
            snapshot.result_config_map,
            termination_log=termination_log_path(env),
            job_uid=env.get(JOB_UID_ENV, ""),
        )
        job_error: list[str] = []

        def read_job() -> None:
            try:
                deadline = job_deadline(writer.load_job())
            except ResultNotWritten as error:
                job_error.append(str(error))
                return
            if deadline is not None:
                cancellation.stop_before(deadline)

        reader = threading.Thread(target=read_job, name="pkobatch-read-job", daemon=True)
        reader.start()

    try:
        result = execute(
            snapshot,
            env,
            log,
            cancellation,
            outputs_sink=outputs_writer,
            plan_store=outputs_writer,
            access_review=outputs_writer,
            memory=ContainerMemory.find(),
        )
    finally:
        if outputs_writer is not None:
            outputs_writer.close()
    log.step(summary_line(result))
    status = EXIT_SUCCEEDED if result.state == "succeeded" else EXIT_FAILED
    if writer is None or reader is None:
        return status
    reader.join(timeout=min(JOB_READ_WAIT_SECONDS, cancellation.seconds_left()))
    if job_error or writer.job is None:
        owner = (
            f"it is owned by the Job's UID from ${JOB_UID_ENV}"
            if writer.job_uid
            else f"${JOB_UID_ENV} is unset too: the result is written without an owner reference"
        )
        log.step(
            f"could not read Job {snapshot.stack.namespace}/{snapshot.result_config_map} "
            f"({'; '.join(job_error) or 'timed out'}); {owner} (check the runner's RBAC: get "
            "on batch/v1 jobs)"
        )
    try:
        if cancellation.requested:
            writer.write(result, time_limit=max(1.0, cancellation.seconds_left()))
        else:
            writer.write(result)
    except ResultNotWritten as error:
        log.step(f"the result could not be written: {error}")
        return EXIT_NO_RESULT
    finally:
        writer.close()
    if writer.inline:
        log.step(
            "the run may not write its result ConfigMap: the result is in the container's "
            "termination message, and the controller writes the ConfigMap"
        )
    else:
        log.step(f"result written to ConfigMap {snapshot.stack.namespace}/{writer.name}")
    return status
