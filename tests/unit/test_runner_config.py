"""Stack config from the spec and the run's environment, and the `config set-all` calls that set
it (plain where every value is a string, `--json` where one is structured)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pkobatch.api.run import ValueFromEnv
from pkobatch.api.stack.spec import StackSpec
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.stack_config import (
    MAX_CONFIG_ARGUMENT_BYTES,
    ConfigItem,
    check_cli_supports,
    collect_config,
    config_json,
    plan_config,
    secret_values,
    set_all_arguments,
    version_key,
)


def spec(**fields: Any) -> StackSpec:
    return StackSpec.model_validate({"stack": "dev", **fields})


def test_every_source_lands_with_the_right_secrecy() -> None:
    items = collect_config(
        spec(
            config={"region": "eu", "sizes": [1, 2], "nested": {"a": True}},
            configRef={
                "fromCm": {"name": "cm", "key": "k"},
                "jsonCm": {"name": "cm", "key": "j", "json": True},
            },
            secrets={"inline": "inline-secret"},
            secretsRef={
                "lit": {"type": "Literal", "literal": {"value": "literal-secret"}},
                "sec": {"type": "Secret", "secret": {"name": "s", "key": "k"}},
            },
        ),
        {
            "fromCm": ValueFromEnv(env="CM_K"),
            "jsonCm": ValueFromEnv(env="CM_J", json=True),
            "sec": ValueFromEnv(env="SEC_K", secret=True),
        },
        {"CM_K": "plain", "CM_J": '{"x": [1]}', "SEC_K": "from-secret"},
    )
    assert items == {
        "region": ConfigItem("eu", False),
        "sizes": ConfigItem([1, 2], False),
        "nested": ConfigItem({"a": True}, False),
        "fromCm": ConfigItem("plain", False),
        "jsonCm": ConfigItem({"x": [1]}, False),
        "inline": ConfigItem("inline-secret", True),
        "lit": ConfigItem("literal-secret", True),
        "sec": ConfigItem("from-secret", True),
    }


def test_a_secret_ref_is_secret_even_if_the_snapshot_forgot_to_say_so() -> None:
    items = collect_config(
        spec(secretsRef={"k": {"type": "Secret", "secret": {"name": "s", "key": "k"}}}),
        {"k": ValueFromEnv(env="V")},
        {"V": "value"},
    )
    assert items["k"].secret


def test_in_a_job_inline_secrets_come_from_the_runs_secret() -> None:
    # The Job's snapshot holds "[secret]" in place of inline values; the kubelet fills the
    # variables from the run's Secret.
    items = collect_config(
        spec(
            secrets={"inline": "[secret]"},
            secretsRef={"lit": {"type": "Literal", "literal": {"value": "[secret]"}}},
        ),
        {"lit": ValueFromEnv(env="PKOBATCH_SECRET_0")},
        {"PKOBATCH_INLINE_SECRET_0": "real-inline", "PKOBATCH_SECRET_0": "real-literal"},
        {"inline": "PKOBATCH_INLINE_SECRET_0"},
    )
    assert items == {
        "inline": ConfigItem("real-inline", True),
        "lit": ConfigItem("real-literal", True),
    }


def test_a_missing_runs_secret_is_named() -> None:
    with pytest.raises(RunFailure, match=r"spec\.secrets\.inline: the run's Secret does not exist"):
        collect_config(spec(secrets={"inline": "[secret]"}), {}, {}, {"inline": "V"})


def test_later_sources_win() -> None:
    items = collect_config(spec(config={"k": "plain"}, secrets={"k": "secret"}), {}, {})
    assert items == {"k": ConfigItem("secret", True)}


@pytest.mark.parametrize(
    ("fields", "from_env", "env", "expected"),
    [
        ({"configRef": {"k": {"name": "cm", "key": "k"}}}, {}, {}, "snapshot.configFromEnv"),
        (
            {"configRef": {"k": {"name": "cm", "key": "k"}}},
            {"k": ValueFromEnv(env="MISSING")},
            {},
            "key k of ConfigMap cm does not exist",
        ),
        (
            {"secretsRef": {"k": {"type": "Secret", "secret": {"name": "s", "key": "pw"}}}},
            {"k": ValueFromEnv(env="MISSING", secret=True)},
            {},
            "key pw of Secret s does not exist",
        ),
        (
            {"configRef": {"k": {"name": "cm", "key": "k", "json": True}}},
            {"k": ValueFromEnv(env="V", json=True)},
            {"V": "{not json"},
            "not valid JSON",
        ),
    ],
)
def test_problems_are_invalid_spec_and_say_what_to_fix(
    fields: dict[str, Any], from_env: dict[str, ValueFromEnv], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(RunFailure) as raised:
        collect_config(spec(**fields), from_env, env)
    assert raised.value.reason == "InvalidSpec"
    assert expected in raised.value.message


def test_config_json_is_the_set_all_format() -> None:
    document = json.loads(
        config_json(
            {
                "s": ConfigItem("text", False),
                "n": ConfigItem(3, False),
                "o": ConfigItem({"a": [1, "b"]}, True),
                "f": ConfigItem(False, False),
            }
        )
    )
    assert document == {
        "f": {"secret": False, "value": "false", "objectValue": False},
        "n": {"secret": False, "value": "3", "objectValue": 3},
        "o": {"secret": True, "value": '{"a":[1,"b"]}', "objectValue": {"a": [1, "b"]}},
        "s": {"secret": False, "value": "text"},
    }


def test_secret_values_cover_strings_inside_structured_secrets() -> None:
    values = secret_values(
        {
            "plain": ConfigItem("visible", False),
            "s": ConfigItem("hidden", True),
            "o": ConfigItem({"pw": "deep-secret", "n": 12345}, True),
        }
    )
    assert "visible" not in values
    assert {"hidden", "deep-secret", "12345"} <= set(values)


def test_no_secret_and_no_large_value_is_a_process_argument() -> None:
    big = "x" * (1024 * 1024)
    items = {
        "plain": ConfigItem("eu", False),
        "obj": ConfigItem({"a": [1, 2]}, False),
        "password": ConfigItem("s3cret-value", True),
        "big": ConfigItem(big, False),
        **{f"k{i:03}": ConfigItem("v" * 1000, False) for i in range(150)},
    }
    plan = plan_config(items)
    assert plan.from_stdin == [("big", items["big"]), ("password", items["password"])]
    assert len(plan.set_all) == 3  # 150 kB of small values in arguments of at most 64 KiB
    assert all(
        sum(len(a.encode()) for a in arguments) <= MAX_CONFIG_ARGUMENT_BYTES
        for arguments in plan.set_all
    )
    [with_json] = [arguments for arguments in plan.set_all if arguments[0] == "--json"]
    merged: dict[str, Any] = dict(json.loads(with_json[1]))
    for arguments in plan.set_all:
        if arguments is not with_json:
            assert arguments[0::2] == ["--plaintext"] * (len(arguments) // 2)
            merged.update(dict(a.split("=", 1) for a in arguments[1::2]))
    assert set(merged) == set(items) - {"big", "password"}
    assert merged["obj"]["objectValue"] == {"a": [1, 2]}
    every_argument = [a for arguments in plan.set_all for a in arguments]
    assert all("s3cret-value" not in a and big not in a for a in every_argument)


def test_string_config_is_set_without_json_and_structured_config_with_it() -> None:
    strings = {"region": ConfigItem("eu-west-1", False), "a.b": ConfigItem("x=y", False)}
    assert set_all_arguments(strings) == [
        "--plaintext",
        "a.b=x=y",
        "--plaintext",
        "region=eu-west-1",
    ]
    assert plan_config(strings).set_all == [set_all_arguments(strings)]
    mixed = {**strings, "sizes": ConfigItem([1, 2], False)}
    assert set_all_arguments(mixed) == ["--json", config_json(mixed)]


def version_failure(items: dict[str, ConfigItem], version: str, env: dict[str, str]) -> str:
    with pytest.raises(RunFailure) as raised:
        check_cli_supports(items, version, env)
    assert raised.value.reason == "PulumiVersionTooLow"
    return raised.value.message


def test_versions_compare_by_semantic_version_precedence() -> None:
    ordered = ["3.9.9", "3.197.0", "v3.201.12", "3.202.0-alpha.1", "3.202.0", "3.202.1", "4.0.0"]
    keys = [version_key(v) for v in ordered]
    assert None not in keys
    assert keys == sorted(keys)  # type: ignore[type-var]
    assert len(set(keys)) == len(keys)
    assert version_key("v3.202.0") == version_key("3.202.0+dirty") == version_key(" 3.202.0\n")
    assert version_key("3.202") is None and version_key("latest") is None


def test_structured_config_needs_a_cli_with_json_config() -> None:
    structured = {"sizes": ConfigItem([1, 2], False), "region": ConfigItem("eu", False)}
    message = version_failure(structured, "3.197.0\n", {})
    assert message.startswith(
        "Pulumi CLI version v3.197.0 does not support JSON configuration, require >= v3.202.0"
    )
    assert "spec.workspaceTemplate.spec.image" in message
    assert "require >= v3.202.0" in version_failure(structured, "v3.202.0-alpha.1", {})
    assert "cannot parse the Pulumi CLI version 'dev'" in version_failure(structured, "dev", {})
    check_cli_supports(structured, "3.202.0", {})
    check_cli_supports(structured, "v3.259.0", {})


def test_string_config_runs_on_any_cli() -> None:
    check_cli_supports({"region": ConfigItem("eu", False)}, "3.100.0", {})
    check_cli_supports({}, "3.100.0", {"PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION": "99.0.0"})


def test_the_minimum_can_be_raised_and_must_be_a_version() -> None:
    structured = {"sizes": ConfigItem([1], False)}
    raised = {"PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION": "v99.0.0"}
    assert "v3.259.0 does not support JSON configuration, require >= v99.0.0" in (
        version_failure(structured, "3.259.0", raised)
    )
    with pytest.raises(RunFailure) as invalid:
        check_cli_supports(structured, "3.259.0", {"PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION": "x"})
    assert invalid.value.reason == "InvalidSpec"
    assert "PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION is 'x'" in invalid.value.message


def test_a_structured_value_too_large_for_an_argument_is_set_as_its_json_text() -> None:
    value = {"data": "x" * (100 * 1024), "n": [1, 2]}
    plan = plan_config({"obj": ConfigItem(value, False)})
    assert plan.set_all == []
    [(key, item)] = plan.from_stdin
    assert key == "obj" and not item.secret and json.loads(item.value) == value
