"""Which environment variables are secret, which only the runner may see, and which secret
values a run knows (and so redacts) before it starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.run import SECRET_PLACEHOLDER, RunSnapshot
from pkobatch.api.stack.spec import StackSpec
from pkobatch.runner.execute import known_secrets, runner_only_env_names, secret_env_names
from pkobatch.runner.git import resolve_git_credentials
from pkobatch.runner.redact import Redactor
from pkobatch.runner.stack_config import collect_config


def snapshot(**fields: Any) -> RunSnapshot:
    return RunSnapshot.model_validate(
        {
            "operation": "up",
            "stack": {"name": "s", "namespace": "ns"},
            "jobName": "s-up-1",
            "spec": {"stack": "dev"},
            **fields,
        }
    )


def test_secret_variables_come_from_the_snapshot_and_the_spec() -> None:
    spec = StackSpec.model_validate(
        {
            "stack": "dev",
            "envRefs": {
                "AWS_SECRET_ACCESS_KEY": {"type": "Secret", "secret": {"name": "a", "key": "k"}},
                "AWS_REGION": {"type": "Literal", "literal": {"value": "eu-west-1"}},
            },
            "workspaceTemplate": {
                "spec": {
                    "env": [
                        {
                            "name": "DB_PASSWORD",
                            "valueFrom": {"secretKeyRef": {"name": "d", "key": "p"}},
                        },
                        {"name": "LOG_LEVEL", "value": "debug"},
                    ]
                }
            },
        }
    )
    names = set(secret_env_names(snapshot(secretEnv=["EXTRA"]), spec))
    assert {"AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "EXTRA", "PULUMI_ACCESS_TOKEN"} <= names
    assert "PULUMI_CONFIG_PASSPHRASE" in names
    assert not {"AWS_REGION", "LOG_LEVEL"} & names


def test_git_credentials_and_config_values_are_for_the_runner_only() -> None:
    names = runner_only_env_names(
        snapshot(
            gitAuth={"tokenEnv": "PKOBATCH_GIT_TOKEN"},
            configFromEnv={"k": {"env": "PKOBATCH_CONFIG_0"}, "s": {"env": "PKOBATCH_SECRET_0"}},
        )
    )
    assert names == {"PKOBATCH_GIT_TOKEN", "PKOBATCH_CONFIG_0", "PKOBATCH_SECRET_0"}
    assert runner_only_env_names(snapshot()) == set()


SECRET_REF = {"type": "Secret", "secret": {"name": "s", "key": "k"}}


def known(
    fields: dict[str, Any],
    env: dict[str, str],
    dynamic_env: dict[str, str] | None = None,
    **snapshot_fields: Any,
) -> list[str]:
    """The secret values a run of the spec ``fields`` knows in environment ``env`` with the
    dynamic environment (``$PULUMI_ENV``) ``dynamic_env``."""
    spec = StackSpec.model_validate({"stack": "dev", **fields})
    run = snapshot(spec={"stack": "dev", **fields}, **snapshot_fields)
    config = collect_config(spec, run.config_from_env, env, run.secrets_from_env)
    credentials = (
        resolve_git_credentials(run.git_auth, spec.git_auth, env) if spec.project_repo else None
    )
    return [
        value
        for value in known_secrets(run, spec, env, config, credentials, dynamic_env or {})
        if value
    ]


# One case per kind of secret input: (spec fields, environment, snapshot fields); the
# secret value in each is "the-secret-value".
SECRET_INPUTS = {
    "envRefs of type Secret": ({"envRefs": {"API_KEY": SECRET_REF}}, {"API_KEY": "V"}, {}),
    "secretsRef of type Secret": (
        {"secretsRef": {"token": SECRET_REF}},
        {"PKOBATCH_SECRET_0": "V"},
        {"configFromEnv": {"token": {"env": "PKOBATCH_SECRET_0", "secret": True}}},
    ),
    "secretsRef of type Literal, from the run's Secret": (
        {"secretsRef": {"token": {"type": "Literal", "literal": {"value": "[secret]"}}}},
        {"PKOBATCH_SECRET_0": "V"},
        {"configFromEnv": {"token": {"env": "PKOBATCH_SECRET_0", "secret": True}}},
    ),
    "inline spec.secrets, from the run's Secret": (
        {"secrets": {"token": "[secret]"}},
        {"PKOBATCH_INLINE_SECRET_0": "V"},
        {"secretsFromEnv": {"token": "PKOBATCH_INLINE_SECRET_0"}},
    ),
    "inline spec.secrets (pkobatch run)": ({"secrets": {"token": "V"}}, {}, {}),
    "a structured secret config value": (
        {"secretsRef": {"token": SECRET_REF}},
        {"PKOBATCH_SECRET_0": json.dumps({"nested": ["V"]})},
        {"configFromEnv": {"token": {"env": "PKOBATCH_SECRET_0", "secret": True, "json": True}}},
    ),
    "workspaceTemplate env from a secretKeyRef": (
        {
            "workspaceTemplate": {
                "spec": {
                    "env": [
                        {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "d", "key": "p"}}}
                    ]
                }
            }
        },
        {"DB": "V"},
        {},
    ),
    "a variable the snapshot names secret": (
        {},
        {"FROM_ENV_SECRET": "V"},
        {"secretEnv": ["FROM_ENV_SECRET"]},
    ),
    "the passphrase": ({}, {"PULUMI_CONFIG_PASSPHRASE": "V"}, {}),
    "the access token": ({}, {"PULUMI_ACCESS_TOKEN": "V"}, {}),
    "a git token": (
        {"projectRepo": "https://git.example/r.git", "branch": "main"},
        {"PKOBATCH_GIT_TOKEN": "V"},
        {"gitAuth": {"tokenEnv": "PKOBATCH_GIT_TOKEN"}},
    ),
}


@pytest.mark.parametrize("kind", sorted(SECRET_INPUTS))
def test_every_kind_of_secret_input_is_known_and_redacted(kind: str) -> None:
    fields, env, snapshot_fields = SECRET_INPUTS[kind]
    value = "the-secret-value"
    env = {name: text.replace("V", value) for name, text in env.items()}
    fields = json.loads(json.dumps(fields).replace('"V"', json.dumps(value)))
    values = known(fields, env, **snapshot_fields)
    assert value in values
    redactor = Redactor(values)
    printed = f'tag:{{&{{{{{value}}}}}}} "{value}" {value}'
    assert value not in redactor.scrub(printed)
    assert redactor.scrub(printed).count(SECRET_PLACEHOLDER) == 3


def test_the_passphrase_file_is_known(tmp_path: Path) -> None:
    path = tmp_path / "passphrase"
    path.write_text("passphrase-from-a-file\n")
    values = known({}, {"PULUMI_CONFIG_PASSPHRASE_FILE": str(path)})
    assert Redactor(values).scrub("x passphrase-from-a-file y") == "x [secret] y"
    assert known({}, {"PULUMI_CONFIG_PASSPHRASE_FILE": str(tmp_path / "missing")}) == []


def test_every_value_of_the_dynamic_environment_is_known(tmp_path: Path) -> None:
    path = tmp_path / "passphrase"
    path.write_text("passphrase-from-a-file\n")
    dynamic_env = {"ANY_NAME": "value-from-pulumi-env", "PULUMI_CONFIG_PASSPHRASE_FILE": str(path)}
    redactor = Redactor(known({}, {}, dynamic_env))
    assert redactor.scrub("value-from-pulumi-env passphrase-from-a-file") == "[secret] [secret]"


def test_plain_values_are_not_secret() -> None:
    values = known(
        {
            "config": {"region": "plain-config-value"},
            "envRefs": {"REGION": {"type": "Literal", "literal": {"value": "plain-literal"}}},
        },
        {"REGION": "plain-literal", "OTHER": "plain-variable"},
    )
    assert values == []
