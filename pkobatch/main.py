"""The ``pkobatch`` console script: one click group for users, operators and the Job runner.

It lives outside ``pkobatch.cli`` because it also mounts ``pkobatch controller`` (from
``pkobatch.runtime``), which the user-facing CLI package must not import.
"""

from __future__ import annotations

import click

from pkobatch import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80})
@click.version_option(__version__, prog_name="pkobatch")
def cli() -> None:
    """pkobatch runs Pulumi stacks on Kubernetes, one Job per operation."""


def main() -> None:
    cli()
