"""The ``pkobatch`` console script (and ``kubectl-pkobatch``, the same as a kubectl plugin,
with ``kubectl_complete-pkobatch`` for its completion): one click group for users,
operators and the Job runner (whose internal commands ``pkobatch --help`` does not list).

It lives outside ``pkobatch.cli`` because it also mounts ``pkobatch controller`` (from
``pkobatch.controller``), which the user-facing CLI package must not import.
"""

from __future__ import annotations

import gc
import sys

import click

from pkobatch import __version__


def build_cli() -> click.Group:
    """The whole command tree (imports every command's modules)."""
    from pkobatch.cli.commands import register
    from pkobatch.cli.crds import crds_command
    from pkobatch.cli.local_run import run_command
    from pkobatch.controller.command import controller_command
    from pkobatch.dev.command import dev_group
    from pkobatch.runner.command import job_group

    @click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80})
    @click.version_option(__version__, prog_name="pkobatch")
    def cli() -> None:
        """pkobatch runs Pulumi stacks on Kubernetes, one Job per operation."""

    register(cli)
    for command in (crds_command, dev_group, run_command, job_group, controller_command):
        cli.add_command(command)
    return cli


def main() -> None:
    arguments = sys.argv[1:]
    if arguments[:2] == ["job", "run"]:
        # Every run's pod starts here: load the runner alone, not the whole CLI (its imports
        # cost about a third of a second on every run). Loading modules makes many objects and
        # no garbage: without collections it takes a quarter less CPU, and once frozen those
        # objects are no longer scanned by the run's collections.
        gc.disable()
        from pkobatch.runner.command import job_group

        gc.freeze()
        gc.enable()
        job_group(args=arguments[1:], prog_name="pkobatch job")
        return
    build_cli()()


def kubectl_main() -> None:
    """``kubectl-pkobatch``: the same commands as a kubectl plugin (``kubectl pkobatch ...``);
    kubectl hands every argument after the plugin name over unchanged."""
    build_cli()(prog_name="kubectl pkobatch")


def kubectl_complete_main() -> None:
    """``kubectl_complete-pkobatch``: what kubectl runs to complete ``kubectl pkobatch ...``
    (see ``pkobatch.cli.completion``)."""
    from pkobatch.cli.completion import kubectl_completions

    sys.stdout.write(kubectl_completions(build_cli(), sys.argv[1:]))


if __name__ == "__main__":
    main()
