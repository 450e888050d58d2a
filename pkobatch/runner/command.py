"""``pkobatch job run``: one run inside its Job.

Every run's pod starts here, so this module imports only what a run needs (no rich, none of
the user CLI): ``pkobatch.main`` loads it alone for ``job run``. The run itself is
``pkobatch.runner.job_run``.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import click
from pydantic import ValidationError

from pkobatch.api.run import (
    SNAPSHOT_CONFIGMAP_FLAG,
    SNAPSHOT_FLAG,
    SNAPSHOT_SHA256_FLAG,
    RunSnapshot,
    snapshot_forbidden_message,
)
from pkobatch.runner.job_run import EXIT_NO_RESULT, run_job
from pkobatch.runner.sdk import missing_runner_extra

EXIT_USAGE = 2


def report_refused_snapshot(termination_log: Path, ref: str) -> None:
    """Tell the controller, through the termination message, that the run may not read its
    snapshot's ConfigMap ``ref``: it fails the run as ``MissingPermission`` instead of
    retrying it like a run that failed on its own."""
    try:
        termination_log.write_text(snapshot_forbidden_message(ref))
    except OSError as error:
        click.echo(f"error: cannot write termination message {termination_log}: {error}", err=True)


# Internal: hidden from `pkobatch --help`.
@click.group("job", hidden=True)
def job_group() -> None:
    """Commands that run inside a run's Job (used by the controller, not by people)."""


@job_group.command("run")
@click.option(
    SNAPSHOT_FLAG,
    "snapshot",
    envvar="PKOBATCH_SNAPSHOT",
    help="The RunSnapshot JSON the controller's Job builder wrote.",
)
@click.option(
    SNAPSHOT_CONFIGMAP_FLAG,
    "snapshot_configmaps",
    multiple=True,
    metavar="NAMESPACE/NAME",
    help="A ConfigMap holding the next part of a snapshot too large for --snapshot (repeatable).",
)
@click.option(
    SNAPSHOT_SHA256_FLAG,
    "snapshot_digest",
    default="",
    help="The SHA-256 of the snapshot in the --snapshot-configmap parts.",
)
def job_run_command(
    snapshot: str | None, snapshot_configmaps: tuple[str, ...], snapshot_digest: str
) -> None:
    """Run one Stack operation and write its result ConfigMap.

    Exit status 0 when the operation succeeded, 1 when it failed (the result says why), 2 for
    an unreadable snapshot (one the run may not read is named in the termination message), 3
    when the result could not be written (also when this installation has no Pulumi SDK: the
    extra ``runner``).
    """
    missing = missing_runner_extra()
    if missing is not None:
        click.echo(f"error: {missing}", err=True)
        sys.exit(EXIT_NO_RESULT)
    if snapshot_configmaps:
        from pkobatch.kube.client import Kube  # slow to import: only for a large snapshot
        from pkobatch.runner.report import (
            SnapshotForbidden,
            SnapshotUnreadable,
            read_snapshot,
            termination_log_path,
        )

        try:
            snapshot = read_snapshot(Kube.connect, list(snapshot_configmaps), snapshot_digest)
        except SnapshotUnreadable as error:
            click.echo(f"error: the snapshot could not be read: {error}", err=True)
            if isinstance(error, SnapshotForbidden):
                report_refused_snapshot(termination_log_path(os.environ), error.ref)
            sys.exit(EXIT_USAGE)
    if snapshot is None:
        click.echo(f"error: give {SNAPSHOT_FLAG} or {SNAPSHOT_CONFIGMAP_FLAG}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        parsed = RunSnapshot.model_validate_json(snapshot)
    except ValidationError as error:
        click.echo(f"error: the snapshot is not a valid RunSnapshot:\n{error}", err=True)
        sys.exit(EXIT_USAGE)
    status = run_job(parsed)
    # The process ends here: exempt its objects from the interpreter's last garbage
    # collection, which takes 50 ms and more with the Automation API's modules loaded (exit
    # handlers and thread joins still run as usual).
    gc.freeze()
    sys.exit(status)
