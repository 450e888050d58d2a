"""The generated Workspace and Update CRDs (auto.pulumi.com/v1alpha1): PKO v2.9's schemas.

Each CRD is compared, property path by property path, with a table of PKO's paths
(tests/fixtures/pko/*-schema-paths.tsv, read from PKO's generated CRDs). crds/ holds them as
``pkobatch crds workspaces|updates`` prints them (pkobatch.controller.auto_runs runs them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers.schema_paths import walk
from pydantic import ValidationError

from pkobatch.api.crd import (
    AUTO_CRD_FILES,
    generate_update_crd,
    generate_workspace_crd,
    regenerate_command,
    render_auto_crd_yaml,
)
from pkobatch.api.update import UpdateSpec
from pkobatch.api.workspace import WorkspaceSpec
from pkobatch.cli.crds import crds_command

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pko"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
FORBIDDEN_KEYS = {"$ref", "anyOf", "oneOf", "allOf", "not", "nullable", "definitions", "$defs"}
CRDS: dict[str, tuple[Callable[[], dict[str, Any]], str, int]] = {
    "workspaces": (generate_workspace_crd, "workspace-schema-paths.tsv", 138),
    "updates": (generate_update_crd, "update-schema-paths.tsv", 35),
}


def reference(file: str, rows: int) -> dict[str, tuple[str, list[str]]]:
    table = {}
    for line in (FIXTURES / file).read_text().splitlines():
        if line and not line.startswith("#"):
            path, kind, notes = line.split("\t")
            table[path] = (kind, [n for n in notes.split("; ") if n])
    assert len(table) == rows, f"{file}: the reference table could not be parsed"
    return table


def schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return result


def notes_of(node: dict[str, Any]) -> list[str]:
    """The reference table's notes, derived from a node of our schema."""
    notes = []
    if node.get(PRESERVE):
        notes.append("free-form" if node.get("type") == "object" else "preserve-unknown-fields")
    if "enum" in node:
        notes.append("enum " + ", ".join(node["enum"]))
    if node.get("required"):
        notes.append("requires " + ", ".join(sorted(node["required"])))
    if "format" in node:
        notes.append("format " + node["format"])
    if "x-kubernetes-list-type" in node:
        notes.append("list-type " + node["x-kubernetes-list-type"])
    if node.get("x-kubernetes-int-or-string"):
        notes.append("int-or-string")
    if "default" in node:
        notes.append(f"default {node['default']}")
    return notes


@pytest.mark.parametrize("plural", sorted(CRDS))
def test_paths_types_and_constraints_are_pkos(plural: str) -> None:
    generate, file, rows = CRDS[plural]
    top_level = {"", "apiVersion", "kind", "metadata"}
    ours = {path: node for path, node in walk(schema(generate())) if path not in top_level}
    expected = reference(file, rows)
    assert sorted(ours) == sorted(expected)
    for path, (kind, notes) in expected.items():
        node = ours[path]
        assert node.get("type", "") == kind, path
        assert sorted(notes_of(node)) == sorted(notes), path


@pytest.mark.parametrize("plural", sorted(CRDS))
def test_schema_is_structural(plural: str) -> None:
    for path, node in walk(schema(CRDS[plural][0]())):
        assert not FORBIDDEN_KEYS & node.keys(), path
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"]["required"]), path


def test_names_scope_status_and_printer_columns_are_pkos() -> None:
    workspace, update = generate_workspace_crd(), generate_update_crd()
    for crd, kind, plural in (
        (workspace, "Workspace", "workspaces"),
        (update, "Update", "updates"),
    ):
        assert crd["metadata"]["name"] == f"{plural}.auto.pulumi.com"
        assert crd["spec"]["group"] == "auto.pulumi.com"
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["names"] == {
            "categories": ["pulumi"],
            "kind": kind,
            "listKind": f"{kind}List",
            "plural": plural,
            "singular": kind.lower(),
        }
        (version,) = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}

    def columns(crd: dict[str, Any]) -> list[tuple[str, str, str, int]]:
        return [
            (c["name"], c["type"], c["jsonPath"], c.get("priority", 0))
            for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]
        ]

    ready = '.status.conditions[?(@.type=="Ready")].status'
    assert columns(workspace) == [
        ("Image", "string", ".spec.image", 0),
        ("Ready", "string", ready, 0),
        ("Address", "string", ".status.address", 0),
    ]
    assert columns(update) == [
        ("Workspace", "string", ".spec.workspaceName", 0),
        ("Type", "string", ".spec.type", 10),
        ("Start Time", "date", ".status.startTime", 10),
        ("End Time", "date", ".status.endTime", 10),
        *(
            (c, "string", f'.status.conditions[?(@.type=="{c}")].status', 0)
            for c in ("Progressing", "Failed", "Complete")
        ),
        ("URL", "string", ".status.permalink", 0),
    ]


def test_the_models_read_pko_shaped_manifests_and_refuse_unknown_fields() -> None:
    documents = {
        o["kind"]: o
        for o in yaml.safe_load_all((FIXTURES / "workspace-and-update.yaml").read_text())
    }
    workspace = WorkspaceSpec.model_validate(documents["Workspace"]["spec"])
    update = UpdateSpec.model_validate(documents["Update"]["spec"])

    assert workspace.to_manifest() == documents["Workspace"]["spec"]
    assert update.to_manifest() == documents["Update"]["spec"]
    with pytest.raises(ValidationError, match="notAField"):
        UpdateSpec.model_validate({**documents["Update"]["spec"], "notAField": True})


@pytest.mark.parametrize("plural", sorted(AUTO_CRD_FILES))
def test_crds_directory_holds_the_generated_crd_and_the_cli_prints_it(plural: str) -> None:
    text = render_auto_crd_yaml(plural)
    committed = FIXTURES.parents[2] / "crds" / AUTO_CRD_FILES[plural]
    assert committed.read_text() == text, (
        f"{committed.name} is stale: run `{regenerate_command(plural)}`"
    )
    assert yaml.safe_load(text) == CRDS[plural][0]()
    printed = CliRunner().invoke(crds_command, [plural])
    assert printed.exit_code == 0
    assert printed.output == text
