"""Which environment variables are secret, and which only the runner may see."""

from __future__ import annotations

from typing import Any

from pkobatch.api.run import RunSnapshot
from pkobatch.api.stack import StackSpec
from pkobatch.runner.execute import runner_only_env_names, secret_env_names


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
