"""``pkobatch run``: a Stack manifest on this machine.

It runs the same runner (``pkobatch.runner``) as ``pkobatch job run`` inside a Job
(``pkobatch.runner.command``); they differ only in where the inputs come from and where the
result goes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pkobatch.api.constants import RUN_OPERATIONS, Operation
from pkobatch.api.run import RunResult
from pkobatch.runner.cancel import Budget, Cancellation, grace_seconds_from
from pkobatch.runner.command import EXIT_USAGE
from pkobatch.runner.embedded import (
    LocalRunError,
    load_stack_manifest,
    parse_ref_values,
    plan_local_run,
)
from pkobatch.runner.execute import execute, runner_only_env_names
from pkobatch.runner.job_run import EXIT_FAILED, EXIT_SUCCEEDED
from pkobatch.runner.redact import Redactor
from pkobatch.runner.run_log import RunLog
from pkobatch.runner.sdk import missing_runner_extra

_STATE_STYLE = {"succeeded": "green", "failed": "red"}


def render_result(result: RunResult, console: Console) -> None:
    """The result as a short rich summary and an outputs table (values are plain text:
    "[secret]" is not markup)."""
    summary = Table(box=box.SIMPLE, show_header=False)
    summary.add_column(style="bold", no_wrap=True)
    summary.add_column()
    rows: list[tuple[str, Text]] = [
        ("Stack", Text(f"{result.stack.namespace}/{result.stack.name}")),
        ("Operation", Text(result.operation + (" (drift check)" if result.drift_check else ""))),
        (
            "Result",
            Text.assemble(
                (result.state, _STATE_STYLE.get(result.state, "")), f" ({result.reason})"
            ),
        ),
    ]
    if result.commit:
        rows.append(("Commit", Text(result.commit)))
    if result.changes:
        changes = ", ".join(f"{op} {n}" for op, n in sorted(result.changes.items()))
        rows.append(("Changes", Text(changes)))
    if result.drifted_resources is not None:
        rows.append(("Drifted", Text(str(result.drifted_resources))))
    if result.permalink:
        rows.append(("Permalink", Text(result.permalink)))
    if result.message:
        rows.append(("Message", Text(result.message)))
    if result.truncated:
        rows.append(("Truncated", Text("yes: the result exceeded its size limit")))
    for label, value in rows:
        summary.add_row(label, value)
    console.print(summary)
    if result.outputs:
        outputs = Table("Output", "Value", box=box.SIMPLE)
        for key, value in sorted(result.outputs.items()):
            outputs.add_row(Text(key), Text(value if isinstance(value, str) else json.dumps(value)))
        console.print(outputs)


@click.command("run")
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML file holding one Stack (pulumi.com/v1).",
)
@click.option(
    "--op",
    "operation",
    type=click.Choice(RUN_OPERATIONS),
    help="Operation to run (default: preview for a spec.preview Stack, else up); unlock "
    "releases the stack's lock (pulumi cancel).",
)
@click.option(
    "--secret",
    "secret_args",
    multiple=True,
    metavar="NAME/KEY=VALUE",
    help="Value of key KEY of Secret NAME (repeatable); else $PKOBATCH_SECRET_<NAME>_<KEY>.",
)
@click.option(
    "--configmap",
    "configmap_args",
    multiple=True,
    metavar="NAME/KEY=VALUE",
    help="Value of key KEY of ConfigMap NAME (repeatable); else $PKOBATCH_CONFIGMAP_<NAME>_<KEY>.",
)
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def run_command(
    path: Path,
    operation: Operation | None,
    secret_args: tuple[str, ...],
    configmap_args: tuple[str, ...],
    output: str,
) -> None:
    """Run a Stack manifest on this machine, with no cluster (the Job's runner, embedded).

    Pulumi's output streams to the terminal (to stderr with -o json); the result follows.
    Exit status 0 when the operation succeeded, 1 when it failed, 2 for bad input or an
    installation without the Pulumi SDK (the extra ``runner``).
    """
    err = Console(stderr=True)
    missing = missing_runner_extra()
    if missing is not None:
        err.print(f"[red]error:[/] {escape(missing)}", highlight=False)
        sys.exit(EXIT_USAGE)
    try:
        local = plan_local_run(
            load_stack_manifest(path.read_text()),
            operation,
            parse_ref_values(secret_args, "--secret"),
            parse_ref_values(configmap_args, "--configmap"),
            os.environ,
        )
    except LocalRunError as error:
        err.print(f"[red]error:[/] {error}", highlight=False)
        sys.exit(EXIT_USAGE)
    for warning in local.warnings:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    # The program runs in this process and reads os.environ, as it would in a Job's pod.
    hidden = runner_only_env_names(local.snapshot)
    os.environ.update({name: value for name, value in local.env.items() if name not in hidden})
    stream: TextIO = sys.stderr if output == "json" else sys.stdout
    cancellation = Cancellation(Budget.for_grace(grace_seconds_from(local.env)))
    cancellation.install()
    result = execute(local.snapshot, local.env, RunLog(stream, Redactor()), cancellation)
    if output == "json":
        click.echo(result.to_json())
    else:
        render_result(result, Console())
    sys.exit(EXIT_SUCCEEDED if result.state == "succeeded" else EXIT_FAILED)
