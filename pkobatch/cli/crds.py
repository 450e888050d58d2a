"""``pkobatch crds``: print the Stack CustomResourceDefinition."""

from __future__ import annotations

import click

from pkobatch.api.crd import render_crd_yaml


@click.command("crds")
def crds_command() -> None:
    """Print the stacks.pulumi.com CRD as YAML (pipe it to `kubectl apply -f -`)."""
    click.echo(render_crd_yaml(), nl=False)
