"""`pkobatch run -f`: a Stack manifest becomes a snapshot plus environment, like its Job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pkobatch.runner.embedded import (
    LocalRunError,
    load_stack_manifest,
    parse_ref_values,
    plan_local_run,
)

MANIFESTS = Path(__file__).parents[1] / "fixtures" / "manifests"


def manifest(name: str) -> dict[str, Any]:
    return load_stack_manifest((MANIFESTS / name).read_text())


def test_structured_config_refs_become_environment_variables() -> None:
    local = plan_local_run(
        manifest("structured-config.yaml"),
        None,
        parse_ref_values(
            ["app-db/password=db-pw", "pulumi-api-secret/accessToken=tok"], "--secret"
        ),
        parse_ref_values(["app-settings/motd=hi", "app-settings/limits.json={}"], "--configmap"),
        {"PATH": "/bin"},
    )
    snapshot = local.snapshot
    assert snapshot.operation == "up"
    assert snapshot.stack.name == "structured-config"
    assert snapshot.stack.namespace == "team-a"
    assert snapshot.result_config_map == ""
    motd = snapshot.config_from_env["app:motd"]
    assert (local.env[motd.env], motd.secret, motd.json_value) == ("hi", False, False)
    limits = snapshot.config_from_env["app:limits"]
    assert (local.env[limits.env], limits.json_value) == ("{}", True)
    password = snapshot.config_from_env["app:dbPassword"]
    assert (local.env[password.env], password.secret) == ("db-pw", True)
    assert "app:apiKey" not in snapshot.config_from_env  # a Literal: read from the spec
    assert local.env["PULUMI_ACCESS_TOKEN"] == "tok"
    assert snapshot.secret_env == ["PULUMI_ACCESS_TOKEN"]
    assert snapshot.spec["config"]["app:replicas"] == 3


def test_every_missing_value_is_reported_with_how_to_give_it() -> None:
    with pytest.raises(LocalRunError) as raised:
        plan_local_run(manifest("structured-config.yaml"), None, {}, {}, {})
    message = str(raised.value)
    assert "--secret app-db/password=" in message
    assert "$PKOBATCH_SECRET_APP_DB_PASSWORD" in message
    assert "--configmap app-settings/limits.json=" in message
    assert "$PKOBATCH_CONFIGMAP_APP_SETTINGS_LIMITS_JSON" in message
    assert "pulumi-api-secret/accessToken" in message
    assert "or $PULUMI_ACCESS_TOKEN" in message  # an envRefs variable may simply be set


def test_values_can_come_from_the_environment() -> None:
    env = {
        "PKOBATCH_SECRET_APP_DB_PASSWORD": "from-env",
        "PKOBATCH_CONFIGMAP_APP_SETTINGS_MOTD": "m",
        "PKOBATCH_CONFIGMAP_APP_SETTINGS_LIMITS_JSON": "[]",
        "PULUMI_ACCESS_TOKEN": "already-set",
    }
    local = plan_local_run(manifest("structured-config.yaml"), "preview", {}, {}, env)
    assert local.snapshot.operation == "preview"
    assert local.env[local.snapshot.config_from_env["app:dbPassword"].env] == "from-env"
    assert local.env["PULUMI_ACCESS_TOKEN"] == "already-set"


def test_git_basic_auth_mixes_literal_and_secret_refs() -> None:
    local = plan_local_run(
        manifest("git-basic-auth.yaml"), None, {("git-basic", "password"): "pw"}, {}, {}
    )
    auth = local.snapshot.git_auth
    assert auth is not None and auth.username_env and auth.password_env
    assert local.env[auth.username_env] == "deploy-bot"
    assert local.env[auth.password_env] == "pw"


def test_deprecated_git_auth_secret_uses_the_keys_given() -> None:
    doc = {
        "kind": "Stack",
        "metadata": {"name": "s"},
        "spec": {
            "stack": "dev",
            "projectRepo": "https://h/r",
            "branch": "main",
            "gitAuthSecret": "creds",
        },
    }
    local = plan_local_run(doc, None, {("creds", "accessToken"): "t0ken"}, {}, {})
    auth = local.snapshot.git_auth
    assert auth is not None and auth.token_env is not None
    assert local.env[auth.token_env] == "t0ken"
    assert local.snapshot.stack.namespace == "default"
    with pytest.raises(LocalRunError, match="creds/accessToken"):
        plan_local_run(doc, None, {}, {}, {})


def test_whole_object_env_sources_are_warned_about() -> None:
    doc = {
        "kind": "Stack",
        "metadata": {"name": "s"},
        "spec": {"stack": "dev", "envSecrets": ["aws-creds"], "envs": ["settings"]},
    }
    warnings = plan_local_run(doc, None, {}, {}, {}).warnings
    assert any("aws-creds" in w and "export" in w for w in warnings)
    assert any("settings" in w for w in warnings)


def test_invalid_specs_and_files_are_rejected() -> None:
    with pytest.raises(LocalRunError, match=r"spec\.projectRepo needs spec\.branch"):
        plan_local_run(
            {
                "kind": "Stack",
                "metadata": {"name": "s"},
                "spec": {"stack": "d", "projectRepo": "u"},
            },
            None,
            {},
            {},
            {},
        )
    with pytest.raises(LocalRunError, match="exactly one Stack"):
        load_stack_manifest(yaml.safe_dump_all([{"kind": "Stack"}, {"kind": "Stack"}]))
    with pytest.raises(LocalRunError, match="NAME/KEY=VALUE"):
        parse_ref_values(["no-slash=value"], "--secret")


def test_preview_stacks_preview_by_default() -> None:
    doc = {"kind": "Stack", "metadata": {"name": "s"}, "spec": {"stack": "d", "preview": True}}
    assert plan_local_run(doc, None, {}, {}, {}).snapshot.operation == "preview"
