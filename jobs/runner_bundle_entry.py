"""Entry point of the injected runner bundle (built by ``jobs/build-runner-bundle.sh``).

The bundle is ``pkobatch`` reduced to what runs a Stack operation: ``job run`` (inside a
run's Job) and ``run`` (a Stack manifest on this machine). Its command line is the same as
``pkobatch``'s, so ``<bundle> job run --snapshot ...`` is what the Job builder writes for an
image without pkobatch. The controller, the user-facing CLI and the development tools are
left out of the frozen app.
"""

from __future__ import annotations

import click

from pkobatch import __version__
from pkobatch.cli.job_command import job_group
from pkobatch.cli.local_run import run_command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80})
@click.version_option(__version__, prog_name="pkobatch-runner")
def cli() -> None:
    """pkobatch's runner, frozen: runs one Stack operation with the Pulumi CLI on PATH."""


cli.add_command(job_group)
cli.add_command(run_command)

if __name__ == "__main__":
    cli()
