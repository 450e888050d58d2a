"""The generated programs.pulumi.com CRD: fresh, and exactly PKO v2.9's schema."""

from __future__ import annotations

import copy
import hashlib
import io
import tarfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers.schema_paths import walk

from pkobatch.api.crd import (
    REGENERATE_PROGRAM_COMMAND,
    generate_program_crd,
    render_program_crd_yaml,
)
from pkobatch.api.program import ProgramBody, program_artifact, program_tarball, render_project
from pkobatch.cli.crds import crds_command

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = REPO_ROOT / "crds" / "pulumi.com_programs.yaml"
# PKO v2.9 Program schema: every property path with its type (copied from PKO's CRD).
REFERENCE = REPO_ROOT / "tests" / "fixtures" / "pko" / "program-schema-paths.tsv"
PRESERVE = "x-kubernetes-preserve-unknown-fields"


def reference() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in REFERENCE.read_text().splitlines():
        if line and not line.startswith("#"):
            path, kind, notes = line.split("\t")
            rows[path] = (kind, notes)
    assert len(rows) == 55, "the reference table could not be parsed"
    return rows


def paths(node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    return ((path, child) for path, child in walk(node, map_values=".<name>") if path)


def schema() -> dict[str, Any]:
    versions = generate_program_crd()["spec"]["versions"]
    assert [v["name"] for v in versions] == ["v1"]
    result: dict[str, Any] = versions[0]["schema"]["openAPIV3Schema"]
    return result


def test_committed_crd_is_fresh() -> None:
    assert CRD_FILE.read_text() == render_program_crd_yaml(), (
        f"crds/pulumi.com_programs.yaml is stale: run `{REGENERATE_PROGRAM_COMMAND}`"
    )


def test_cli_prints_the_program_crd() -> None:
    result = CliRunner().invoke(crds_command, ["programs"])
    assert result.exit_code == 0, result.output
    assert result.output == render_program_crd_yaml()


def test_paths_and_types_are_exactly_pkos() -> None:
    ours = dict(paths(schema()))
    expected = reference()
    assert set(ours) == set(expected)
    for path, (kind, notes) in expected.items():
        node = ours[path]
        if kind:
            assert node.get("type") == kind, path
        else:
            assert "preserve-unknown-fields" in notes, path
            assert node.get(PRESERVE) is True and "type" not in node, path
        if notes.startswith("enum "):
            assert node["enum"] == notes.removeprefix("enum ").split(", "), path


def test_required_fields_are_pkos() -> None:
    ours = dict(paths(schema()))
    for path, (_, notes) in reference().items():
        if notes.startswith("requires "):
            wanted = sorted(n.strip() for n in notes.removeprefix("requires ").split(","))
            assert sorted(ours[path].get("required", [])) == wanted, path
        elif ours[path].get("type") == "object":
            assert "required" not in ours[path], path


def test_names_scope_status_and_columns() -> None:
    crd = generate_program_crd()
    assert crd["metadata"]["name"] == "programs.pulumi.com"
    assert crd["spec"]["names"]["kind"] == "Program"
    assert crd["spec"]["names"]["plural"] == "programs"
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("Age", ".metadata.creationTimestamp"),
        ("URL", ".status.artifact.url"),
    ]


PKO_EXAMPLE = {
    "apiVersion": "pulumi.com/v1",
    "kind": "Program",
    "metadata": {"name": "random-yaml", "namespace": "default", "generation": 3},
    "program": {
        "configuration": {"length": {"type": "Number", "default": 16}},
        "resources": {
            "randomPassword": {
                "type": "random:RandomPassword",
                "properties": {"length": "${length}", "special": True},
                "options": {"import": "abc", "protect": False},
            }
        },
        "outputs": {"password": "${randomPassword.result}"},
    },
}


def test_render_project_is_a_yaml_project_named_after_the_program() -> None:
    project = yaml.safe_load(render_project("random-yaml", PKO_EXAMPLE["program"]))
    assert project["name"] == "random-yaml"
    assert project["runtime"] == "yaml"
    assert project["resources"]["randomPassword"]["options"] == {"import": "abc", "protect": False}
    assert project["configuration"] == {"length": {"type": "Number", "default": 16}}
    assert project["outputs"] == {"password": "${randomPassword.result}"}


def test_render_project_refuses_keys_outside_pkos_schema() -> None:
    with pytest.raises(ValueError, match="runtime"):
        render_project("x", {"runtime": "python", "resources": {}})
    ProgramBody.model_validate(PKO_EXAMPLE["program"])


def test_artifact_has_pkos_revision_path_and_url_forms_and_the_tarballs_digest() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    artifact = program_artifact(PKO_EXAMPLE, "http://pkobatch-controller.ops.svc:80/", now)
    tarball = program_tarball(PKO_EXAMPLE)
    assert artifact.revision == "3"
    assert artifact.size == len(tarball)
    assert artifact.digest == "sha256:" + hashlib.sha256(tarball).hexdigest()
    assert artifact.last_update_time == "2026-01-02T03:04:05Z"
    assert artifact.path == "programs/default/random-yaml/3.tar.gz"
    assert artifact.url == "http://pkobatch-controller.ops.svc:80/programs/default/random-yaml/3"
    edited = {**PKO_EXAMPLE, "program": {"outputs": {"a": 1}}}
    assert program_artifact(edited, "http://x", now).digest != artifact.digest


def test_the_tarball_holds_only_the_rendered_project_with_fixed_metadata() -> None:
    tarball = program_tarball(PKO_EXAMPLE)
    assert tarball[4:8] == b"\0\0\0\0", "the gzip header carries no timestamp"
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        (entry,) = tar.getmembers()
        project = tar.extractfile(entry)
        assert project is not None
        assert project.read().decode() == render_project("random-yaml", PKO_EXAMPLE["program"])
    assert (entry.name, entry.mtime, entry.uid, entry.gid, entry.uname, entry.gname) == (
        "Pulumi.yaml",
        0,
        0,
        0,
        "",
        "",
    )
    assert entry.isreg() and entry.mode == 0o644


def test_the_tarball_is_the_same_bytes_every_time_and_differs_with_the_body() -> None:
    first = program_tarball(PKO_EXAMPLE)
    time.sleep(1.1)  # a tar or gzip timestamp would change with the clock's second
    assert program_tarball(copy.deepcopy(PKO_EXAMPLE)) == first
    renamed = {**PKO_EXAMPLE, "metadata": {**PKO_EXAMPLE["metadata"], "name": "other"}}
    assert program_tarball(renamed) != first
    with pytest.raises(ValueError, match="runtime"):
        program_tarball({**PKO_EXAMPLE, "program": {"runtime": "python"}})
