"""``pkobatch crds``: print a CustomResourceDefinition (Stack, or Program)."""

from __future__ import annotations

import click

from pkobatch.api.crd import render_crd_yaml, render_program_crd_yaml


@click.command("crds")
@click.argument("kind", type=click.Choice(["stacks", "programs"]), default="stacks")
def crds_command(kind: str) -> None:
    """Print the stacks.pulumi.com (default) or programs.pulumi.com CRD as YAML (pipe it to
    `kubectl apply -f -`)."""
    click.echo(render_crd_yaml() if kind == "stacks" else render_program_crd_yaml(), nl=False)
