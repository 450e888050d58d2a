"""Entry point of the injected runner bundle (built by ``jobs/build-runner-bundle.sh``).

The bundle is ``pkobatch`` reduced to what runs a Stack operation: ``job run`` (inside a
run's Job) and ``run`` (a Stack manifest on this machine). Its command line is the same as
``pkobatch``'s, so ``<bundle> job run --snapshot ...`` is what the Job builder writes for an
image without pkobatch. The controller, the user-facing CLI and the development tools are
left out of the frozen app.

The bundle starts through its launcher (``jobs/runner_launcher.c``), which points
``LD_LIBRARY_PATH`` at the bundle's own C library and keeps the image's value in
``PKOBATCH_IMAGE_LD_LIBRARY_PATH``. Before anything else runs, the image's value is put back,
so every program the runner starts (pulumi, git, language hosts, the program's toolchain)
loads the image's libraries.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import click

from pkobatch import __version__
from pkobatch.runner.command import job_group

IMAGE_LIBRARY_PATH = "PKOBATCH_IMAGE_LD_LIBRARY_PATH"


def restore_image_library_path(environ: MutableMapping[str, str]) -> None:
    """Give ``environ`` the image's own ``LD_LIBRARY_PATH`` back (none when it had none)."""
    if IMAGE_LIBRARY_PATH not in environ:
        return  # not started by the launcher (e.g. the frozen app run directly)
    image_value = environ.pop(IMAGE_LIBRARY_PATH)
    # PyInstaller's record of the value it found (the launcher's); not the image's.
    environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if image_value:
        environ["LD_LIBRARY_PATH"] = image_value
    else:
        environ.pop("LD_LIBRARY_PATH", None)


restore_image_library_path(os.environ)


class RunnerCommands(click.Group):
    """``job`` and ``run``, the latter imported when it runs or is listed: every run's pod
    starts ``job run``, which has no use for ``run``'s terminal output (rich)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "run"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "run":
            from pkobatch.cli.local_run import run_command

            return run_command
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=RunnerCommands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80},
)
@click.version_option(__version__, prog_name="pkobatch-runner")
def cli() -> None:
    """pkobatch's runner, frozen: runs one Stack operation with the Pulumi CLI on PATH."""


cli.add_command(job_group)

if __name__ == "__main__":
    cli()
