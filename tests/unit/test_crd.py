"""The generated CRD: fresh, structural, a superset of PKO v2.9's, and accepting every example."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from helpers.schema_paths import walk

from pkobatch.api.crd import (
    FLUX_SOURCE_REF_RULES,
    GIT_AUTH_RULES,
    NAME_LENGTH_RULE,
    PRINTER_COLUMNS,
    REGENERATE_COMMAND,
    SPEC_RULES,
    generate_crd,
    generate_program_crd,
    render_crd_yaml,
)
from pkobatch.cli.crds import crds_command

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = REPO_ROOT / "crds" / "pulumi.com_stacks.yaml"
# PKO v2.9 Stack schema: every property path with its type (copied from PKO's CRD).
REFERENCE = REPO_ROOT / "tests" / "fixtures" / "pko" / "stack-schema-paths.tsv"
MANIFESTS = sorted((REPO_ROOT / "tests" / "fixtures" / "manifests").glob("*.yaml"))
DOC_EXAMPLES = sorted((REPO_ROOT / "docs").rglob("*.yaml"))
FORBIDDEN_KEYS = {"$ref", "anyOf", "oneOf", "allOf", "not", "nullable", "definitions", "$defs"}
PRESERVE = "x-kubernetes-preserve-unknown-fields"
# Where pkobatch is deliberately narrower than PKO's schemaless node, and why that is safe.
NARROWED = {
    # PKO: schemaless; a non-object value already fails PKO's controller (map[string]JSON).
    "spec.config": "object",
}


def v1_schema() -> dict[str, Any]:
    version = generate_crd()["spec"]["versions"][0]
    assert version["name"] == "v1"
    schema = version["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def test_committed_crd_is_fresh() -> None:
    assert CRD_FILE.exists(), f"missing {CRD_FILE}: run `{REGENERATE_COMMAND}`"
    assert CRD_FILE.read_text() == render_crd_yaml(), (
        f"crds/pulumi.com_stacks.yaml is stale: run `{REGENERATE_COMMAND}`"
    )


def test_cli_prints_the_crd() -> None:
    result = CliRunner().invoke(crds_command, [])
    assert result.exit_code == 0, result.output
    assert result.output == render_crd_yaml()
    assert yaml.safe_load(result.output) == generate_crd()


# --- structural schema ---------------------------------------------------------------


def test_schema_is_structural() -> None:
    for path, node in walk(v1_schema()):
        assert not FORBIDDEN_KEYS & node.keys(), f"{path}: {FORBIDDEN_KEYS & node.keys()}"
        assert "default" not in node or node["default"] is not None, path
        if "type" not in node:
            assert node.get(PRESERVE) is True or node.get("x-kubernetes-int-or-string"), path
        else:
            assert node["type"] in {"object", "array", "string", "integer", "boolean"}, path
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), f"{path}: array without items"
        # Structural schemas forbid properties and additionalProperties together.
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-list-type") == "map":
            keys = node["x-kubernetes-list-map-keys"]
            assert set(keys) <= set(node["items"].get("required", [])), path


def test_metadata_root_is_only_typed() -> None:
    assert v1_schema()["properties"]["metadata"] == {"type": "object"}


def test_templates_are_free_form_objects() -> None:
    spec = v1_schema()["properties"]["spec"]["properties"]
    for name in ("workspaceTemplate", "updateTemplate"):
        assert spec[name]["type"] == "object"
        assert spec[name][PRESERVE] is True
        assert spec[name]["properties"]["spec"][PRESERVE] is True
    pod_template = spec["workspaceTemplate"]["properties"]["spec"]["properties"]["podTemplate"]
    # Free-form, except the pod-spec fields the ServiceAccount CEL rules read (CEL sees
    # declared properties only).
    identity = {"serviceAccountName", "serviceAccount", "automountServiceAccountToken"}
    assert pod_template["type"] == "object" and pod_template[PRESERVE] is True
    assert set(pod_template["properties"]) == {"spec"}
    assert pod_template["properties"]["spec"][PRESERVE] is True
    assert set(pod_template["properties"]["spec"]["properties"]) == identity
    job_pod_spec = spec["jobTemplate"]["properties"]["spec"]
    assert job_pod_spec[PRESERVE] is True
    assert set(job_pod_spec["properties"]) == identity
    assert spec["config"]["additionalProperties"] == {PRESERVE: True}


# --- CEL, names, versions, printer columns -------------------------------------------


def rules_use_only_cheap_functions(rules: list[dict[str, str]]) -> None:
    for rule in rules:
        calls = set(re.findall(r"([A-Za-z_]+)\(", rule["rule"]))
        assert calls <= {"has", "size"}, rule["rule"]
        assert rule["message"]


def test_cel_rules() -> None:
    schema = v1_schema()
    assert schema["x-kubernetes-validations"] == [
        {
            "rule": "size(self.metadata.name) <= 42",
            "message": "Stack name must be no more than 42 characters in length.",
        }
    ]
    assert NAME_LENGTH_RULE in schema["x-kubernetes-validations"]
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-validations"] == SPEC_RULES
    assert spec["properties"]["gitAuth"]["x-kubernetes-validations"] == GIT_AUTH_RULES
    rules_use_only_cheap_functions(SPEC_RULES + GIT_AUTH_RULES)
    messages = " ".join(r["message"] for r in SPEC_RULES + GIT_AUTH_RULES)
    for fragment in ("spec.branch and spec.commit", "spec.projectRepo needs", "sources"):
        assert fragment in messages
    for rule in SPEC_RULES:
        field_path = rule.get("fieldPath")
        if field_path is not None:
            node = spec
            for step in field_path.removeprefix(".").split("."):
                assert step in node.get("properties", {}), field_path
                node = node["properties"][step]


def test_flux_source_refs_name_a_kind_of_the_flux_source_group() -> None:
    """The rules on spec.fluxSource.sourceRef match regular expressions: they run only on
    strings of bounded length, so their cost stays bounded."""
    source_ref = v1_schema()["properties"]["spec"]["properties"]["fluxSource"]["properties"][
        "sourceRef"
    ]
    assert source_ref["x-kubernetes-validations"] == FLUX_SOURCE_REF_RULES
    assert source_ref["properties"]["apiVersion"]["maxLength"] == 253
    assert source_ref["properties"]["kind"]["maxLength"] == 63
    for rule in FLUX_SOURCE_REF_RULES:
        assert set(re.findall(r"([A-Za-z_]+)\(", rule["rule"])) == {"matches"}
    assert (
        "self.apiVersion.matches('^source[.]toolkit[.]fluxcd[.]io/[^/]+$')"
        in (FLUX_SOURCE_REF_RULES[0]["rule"])
    )


def test_names_versions_and_columns_match_pko() -> None:
    crd = generate_crd()
    assert crd["metadata"]["name"] == "stacks.pulumi.com"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "categories": ["pulumi"],
        "kind": "Stack",
        "listKind": "StackList",
        "plural": "stacks",
        "singular": "stack",
    }
    v1, v1alpha1 = crd["spec"]["versions"]
    assert (v1["name"], v1["served"], v1["storage"]) == ("v1", True, True)
    assert "deprecated" not in v1
    assert (v1alpha1["name"], v1alpha1["served"], v1alpha1["storage"]) == ("v1alpha1", True, False)
    assert v1alpha1["deprecated"] is True
    assert v1alpha1["schema"] == v1["schema"]
    for version in (v1, v1alpha1):
        assert version["subresources"] == {"status": {}}
        assert version["additionalPrinterColumns"] == PRINTER_COLUMNS
    assert [
        (c["name"], c["type"], c["jsonPath"], c.get("priority", 0)) for c in PRINTER_COLUMNS
    ] == [
        ("Stack", "string", ".spec.stack", 10),
        ("Last Update", "string", ".status.lastUpdate.state", 0),
        ("Age", "date", ".status.lastUpdate.lastResyncTime", 0),
        ("Last Commit", "string", ".status.lastUpdate.lastAttemptedCommit", 10),
        ("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', 0),
        ("Reconciling", "string", '.status.conditions[?(@.type=="Reconciling")].reason', 0),
        ("Stalled", "string", '.status.conditions[?(@.type=="Stalled")].reason', 0),
        ("Permalink", "string", ".status.lastUpdate.permalink", 0),
    ]


# --- superset of PKO v2.9 ------------------------------------------------------------


def reference_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in REFERENCE.read_text().splitlines():
        if line and not line.startswith("#"):
            path, kind, notes = line.split("\t")
            rows.append((path, kind, notes))
    assert len(rows) > 200, "the reference table could not be parsed"
    return rows


def resolve(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The schema node for a reference path, or None when it lies in a preserved subtree."""
    node = schema
    for segment in re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path):
        if segment == "[]":
            node = node["items"]
        elif segment == "{}":
            assert "additionalProperties" in node, f"{path}: not a map"
            node = node["additionalProperties"]
        elif segment in node.get("properties", {}):
            node = node["properties"][segment]
        else:
            assert node.get(PRESERVE) is True, f"{path}: {segment} would be pruned"
            return None
    return node


def test_every_pko_path_is_accepted_with_the_same_type() -> None:
    schema = v1_schema()
    checked = 0
    for path, pko_type, notes in reference_rows():
        if "…" in path:
            continue
        node = resolve(schema, path)
        if node is None:
            continue
        checked += 1
        if path in NARROWED:
            assert node["type"] == NARROWED[path], path
        elif not pko_type:
            assert "preserve-unknown-fields" in notes, path
            assert node.get(PRESERVE) is True and "type" not in node, path
        else:
            assert node.get("type", pko_type) == pko_type, f"{path}: {node.get('type')}"
        if "format: int64" in notes:
            assert node.get("format") == "int64", path
        enum = re.search(r"enum: ([^;]+)", notes)
        if enum:
            assert node["enum"] == [v.strip() for v in enum.group(1).split("|")], path
        list_type = re.search(r"list-type: (\w+)", notes)
        if list_type:
            assert node["x-kubernetes-list-type"] == list_type.group(1), path
    assert checked > 200


def test_required_fields_match_pko() -> None:
    schema = v1_schema()
    rows = reference_rows()
    required_by_pko = {path for path, _, notes in rows if "required" in notes}
    for path, _, _ in rows:
        node = resolve(schema, path) if "…" not in path else None
        if node is None or node.get("type") != "object" or "properties" not in node:
            continue
        ours = {f"{path}.{name}" for name in node.get("required", [])}
        pko = {
            p
            for p in required_by_pko
            if p.rsplit(".", 1)[0] == path and p.count(".") == path.count(".") + 1
        }
        assert ours == pko, path


# --- every example manifest is accepted as written -----------------------------------


def matches_type(value: Any, expected: str) -> bool:
    python_types: dict[str, tuple[type, ...]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "boolean": (bool,),
    }
    if expected == "integer" and isinstance(value, bool):
        return False
    return isinstance(value, python_types[expected])


def conformance_errors(value: Any, node: dict[str, Any], path: str) -> Iterator[str]:
    """What the API server would reject or prune (types, required, enums, unknown fields)."""
    if node.get(PRESERVE) is True and "type" not in node:
        return
    if value is None:
        yield f"{path}: null"
        return
    expected = node["type"]
    if not matches_type(value, expected):
        yield f"{path}: expected {expected}, got {value!r}"
        return
    if "enum" in node and value not in node["enum"]:
        yield f"{path}: {value!r} not in {node['enum']}"
    if "minimum" in node and value < node["minimum"]:
        yield f"{path}: {value} < {node['minimum']}"
    if expected == "array":
        for index, item in enumerate(value):
            yield from conformance_errors(item, node["items"], f"{path}[{index}]")
    if expected == "object":
        for name in node.get("required", []):
            if name not in value:
                yield f"{path}.{name}: required"
        properties = node.get("properties", {})
        for name, item in value.items():
            if name in properties:
                yield from conformance_errors(item, properties[name], f"{path}.{name}")
            elif "additionalProperties" in node:
                yield from conformance_errors(item, node["additionalProperties"], f"{path}.{name}")
            elif node.get(PRESERVE) is not True and path != ".metadata":
                yield f"{path}.{name}: unknown field (would be pruned)"


@pytest.mark.parametrize("manifest", MANIFESTS + DOC_EXAMPLES, ids=lambda p: p.name)
def test_example_conforms_to_the_crd_schema(manifest: Path) -> None:
    """Every Stack (and Program) of an example; other kinds (Flux's) are checked by the
    server-side dry run of tests/integration/test_crd_server.py."""
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    stacks = [d for d in documents if d["kind"] == "Stack"]
    assert len(stacks) == 1, "each example has exactly one Stack"
    for document in documents:
        if document["kind"] == "Stack":
            assert document["apiVersion"] == "pulumi.com/v1"
            assert len(document["metadata"]["name"]) <= 42
            errors = list(conformance_errors(document, v1_schema(), ""))
        elif document["kind"] == "Program":
            program_schema = generate_program_crd()["spec"]["versions"][0]["schema"]
            errors = list(conformance_errors(document, program_schema["openAPIV3Schema"], ""))
        else:
            continue
        assert errors == [], errors


def test_doc_examples_exist() -> None:
    names = {p.name for p in DOC_EXAMPLES}
    assert {
        "alias-dialect.yaml",
        "pko-install-docs.yaml",
        "program-source.yaml",
        "flux-source.yaml",
        "github-app.yaml",
    } <= names


def integer_nodes(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from integer_nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from integer_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from integer_nodes(node["additionalProperties"], f"{path}.*")


def test_every_spec_integer_is_bounded_and_says_why() -> None:
    # Unbounded integers wedged Stacks (time arithmetic overflowing in the controller and
    # in the Job controller); every one has both bounds, named in its description.
    spec = v1_schema()["properties"]["spec"]
    found = dict(integer_nodes(spec, "spec"))
    assert {
        "spec.resyncFrequencySeconds",
        "spec.retryMaxBackoffDurationSeconds",
        "spec.timeoutSeconds",
        "spec.workspaceTemplate.spec.pulumiLogLevel",
        "spec.updateTemplate.spec.parallel",
    } <= set(found)
    for path, node in found.items():
        assert "minimum" in node and "maximum" in node, path
        assert node["maximum"] < 2**63 - 1, path
        description = node["description"]
        assert str(node["maximum"]) in description or "32-bit" in description, path
