"""spec.exportOutputs: which output goes where, under which key, encoded how; what the run's
redactor must learn before the plaintext read is used (pkobatch.runner.exports)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from pkobatch.api.run import StackRef
from pkobatch.api.stack.spec import ExportOutputs
from pkobatch.api.stack.validation import load_stack_spec
from pkobatch.runner.exports import (
    encode_output,
    export_objects,
    hidden_values,
    plan_export,
)

STACK = StackRef(name="app", namespace="team-a", uid="uid-1")
MASKED = {
    "url": "https://app.example.com",
    "port": 8080,
    "zones": ["a", "b"],
    "password": "[secret]",
    "db": {"host": "db.internal", "password": "[secret]"},
}
VALUES = {
    "url": "https://app.example.com",
    "port": 8080,
    "zones": ["a", "b"],
    "password": "hunter2-very-secret",
    "db": {"host": "db.internal", "password": "db-pass-value"},
}


def export(**fields: Any) -> ExportOutputs:
    return ExportOutputs.model_validate(
        {"configMap": {"name": "out"}, "secret": {"name": "out-secret"}, **fields}
    )


def test_plain_outputs_go_to_the_config_map_and_secret_ones_to_the_secret_whole() -> None:
    plan = plan_export(export(), MASKED, VALUES)
    assert plan.config_map == {
        "url": "https://app.example.com",
        "port": "8080",
        "zones": '["a","b"]',
    }
    # An object holding a secret anywhere goes to the Secret, whole.
    assert plan.secret == {
        "password": "hunter2-very-secret",
        "db": '{"host":"db.internal","password":"db-pass-value"}',
    }
    assert plan.notes == []


def test_a_subset_with_renames() -> None:
    plan = plan_export(
        export(outputs=["url", "password"], keys={"password": "DB_PASSWORD", "url": "URL"}),
        MASKED,
        VALUES,
    )
    assert plan.config_map == {"URL": "https://app.example.com"}
    assert plan.secret == {"DB_PASSWORD": "hunter2-very-secret"}


def test_without_a_secret_target_secret_outputs_go_nowhere() -> None:
    spec = ExportOutputs.model_validate({"configMap": {"name": "out"}})
    plan = plan_export(spec, MASKED, VALUES)
    assert set(plan.config_map) == {"url", "port", "zones"}
    assert plan.secret == {}
    listed = ExportOutputs.model_validate({"configMap": {"name": "out"}, "outputs": ["password"]})
    plan = plan_export(listed, MASKED, VALUES)
    assert plan.config_map == {} and plan.secret == {}
    assert "'password' is secret and exportOutputs.secret is not set" in plan.notes[0]


def test_an_output_missing_from_the_masked_read_counts_as_secret() -> None:
    plan = plan_export(export(), {}, {"late": "value-x"})
    assert plan.secret == {"late": "value-x"} and plan.config_map == {}


def test_missing_outputs_invalid_keys_and_collisions_are_reported_and_skipped() -> None:
    plan = plan_export(
        export(outputs=["nope", "url", "port"], keys={"port": "url"}),
        MASKED,
        VALUES,
    )
    assert plan.config_map == {"url": "https://app.example.com"}
    assert any("has no output 'nope'" in note for note in plan.notes)
    assert any("'url' and 'port' both go to key 'url'" in note for note in plan.notes)
    plan = plan_export(export(), {"a b": "x"}, {"a b": "x"})
    assert plan.config_map == {}
    assert "rename it with exportOutputs.keys.a b" in plan.notes[0]


def test_encoding() -> None:
    assert encode_output("plain") == "plain"
    assert encode_output(True) == "true"
    assert encode_output(None) == "null"
    assert encode_output({"k": [1, 2.5]}) == '{"k":[1,2.5]}'


def test_hidden_values_are_exactly_what_the_masked_read_hides() -> None:
    found = set(hidden_values(MASKED, VALUES))
    assert {"hunter2-very-secret", "db-pass-value"} <= found
    assert found.isdisjoint({"https://app.example.com", "db.internal", "a", "b"})
    assert set(hidden_values({}, {"x": {"k": "v-secret"}})) >= {"v-secret"}
    assert "12345678" in hidden_values({"n": "[secret]"}, {"n": 12345678})


def test_objects_are_owned_by_the_stack_in_its_namespace() -> None:
    plan = plan_export(export(), MASKED, VALUES)
    config_map, secret = export_objects(export(), plan, STACK)
    for obj, name in ((config_map, "out"), (secret, "out-secret")):
        meta = obj["metadata"]
        assert (meta["name"], meta["namespace"]) == (name, "team-a")
        [owner] = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "name": "app",
            "uid": "uid-1",
            "controller": True,
        }
    assert config_map["kind"] == "ConfigMap" and config_map["data"] == plan.config_map
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == plan.secret
    # Only the named targets are written.
    only_secret = ExportOutputs.model_validate({"secret": {"name": "s"}})
    [alone] = export_objects(only_secret, plan_export(only_secret, MASKED, VALUES), STACK)
    assert alone["kind"] == "Secret"


@pytest.mark.parametrize(
    ("export_outputs", "problem"),
    [
        ({}, "set configMap, secret or both"),
        ({"secret": {"name": "s"}, "keys": {"a": "no spaces"}}, "not a valid ConfigMap/Secret key"),
        ({"configMap": {"name": ""}}, "configMap.name"),
    ],
)
def test_invalid_specs_say_what_to_fix(export_outputs: dict[str, Any], problem: str) -> None:
    check = load_stack_spec({"stack": "dev", "exportOutputs": export_outputs}, "team-a")
    assert not check.valid
    assert problem in "\n".join(check.problems)
