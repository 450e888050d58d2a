"""``pkobatch crds``: print a CustomResourceDefinition (Stack, Program, Workspace, Update)."""

from __future__ import annotations

import click

from pkobatch.api.crd import (
    AUTO_CRD_FILES,
    render_auto_crd_yaml,
    render_crd_yaml,
    render_program_crd_yaml,
)


@click.command("crds")
@click.argument(
    "kind",
    type=click.Choice(["stacks", "programs", *AUTO_CRD_FILES]),
    default="stacks",
)
def crds_command(kind: str) -> None:
    """Print the stacks.pulumi.com (default), programs.pulumi.com, workspaces.auto.pulumi.com
    or updates.auto.pulumi.com CRD as YAML (pipe it to `kubectl apply -f -`)."""
    if kind == "stacks":
        text = render_crd_yaml()
    elif kind == "programs":
        text = render_program_crd_yaml()
    else:
        text = render_auto_crd_yaml(kind)
    click.echo(text, nl=False)
