"""``pkobatch crds``: print a CustomResourceDefinition (Stack, Program, Workspace, Update)."""

from __future__ import annotations

from collections.abc import Callable

import click
import yaml

from pkobatch.api.crd import (
    generate_update_crd,
    generate_workspace_crd,
    render_crd_yaml,
    render_program_crd_yaml,
)


def _render(generate: Callable[[], object]) -> Callable[[], str]:
    return lambda: yaml.safe_dump(generate(), sort_keys=False)


RENDERERS: dict[str, Callable[[], str]] = {
    "stacks": render_crd_yaml,
    "programs": render_program_crd_yaml,
    "workspaces": _render(generate_workspace_crd),
    "updates": _render(generate_update_crd),
}


@click.command("crds")
@click.argument("kind", type=click.Choice(list(RENDERERS)), default="stacks")
def crds_command(kind: str) -> None:
    """Print the stacks.pulumi.com (default), programs.pulumi.com, workspaces.auto.pulumi.com
    or updates.auto.pulumi.com CRD as YAML (pipe it to `kubectl apply -f -`).

    pkobatch does not reconcile Workspaces and Updates yet: their CRDs are not part of
    crds/ or the Helm chart (docs/migration.md)."""
    click.echo(RENDERERS[kind](), nl=False)
