"""PKO's workspace behaviours end to end (issue 27): real control plane, the controller under
its own RBAC, the real runner and Pulumi CLI.

- PKO's dynamic environment (PKO #937): an init container of
  ``spec.workspaceTemplate.spec.podTemplate``, as in PKO's own test manifest, appends
  ``PULUMI_CONFIG_PASSPHRASE=...`` to ``$PULUMI_ENV`` on the ``share`` volume; the run uses
  that passphrase, which appears nowhere (a sentinel);
- the CLI version check: structured config with a Pulumi CLI older than the minimum stalls
  the Stack as ``PulumiVersionTooLow`` after exactly one run, while string config runs. No
  old CLI is built here: the real CLI is made "too old" by raising the minimum
  (``PKOBATCH_JSON_CONFIG_MIN_PULUMI_VERSION``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

from controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    create_secret,
    last_update,
    literal,
    ready,
    stack_jobs,
    stack_spec,
    wait_stack,
)
from sentinels import plant

from pkobatch.kube.client import Kube
from pkobatch.runner.stack_config import JSON_CONFIG_MIN_VERSION_ENV


def _export_with(pulumi_env: Any, passphrase: str) -> subprocess.CompletedProcess[str]:
    """``pulumi stack export --show-secrets`` of the test program's stack: it decrypts the
    state's secrets, so it succeeds only with the passphrase the stack was created with."""
    env = {**os.environ, **pulumi_env.env, "PULUMI_CONFIG_PASSPHRASE": passphrase}
    return subprocess.run(
        [
            "pulumi",
            "stack",
            "export",
            "--show-secrets",
            "--stack",
            "organization/pkobatch-test-files/dev",
        ],
        env=env,
        cwd=pulumi_env.home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_init_container_writing_pulumi_env_gives_the_run_its_passphrase(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
) -> None:
    passphrase = plant("dynamic-env-passphrase")
    create_secret(kube, namespace, "vault", {"passphrase": passphrase})
    spec = stack_spec(git_repo(), pulumi_env)
    del spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]  # only the dynamic environment has it
    spec["workspaceTemplate"] = {
        "spec": {
            "podTemplate": {
                "spec": {
                    "initContainers": [
                        {
                            "name": "extra",
                            "image": "busybox",
                            "command": [
                                "sh",
                                "-c",
                                'echo "PULUMI_CONFIG_PASSPHRASE=$FROM_VAULT" >> $PULUMI_ENV\n'
                                "echo 'Wrote dynamic environment variables'",
                            ],
                            "env": [
                                {
                                    "name": "FROM_VAULT",
                                    "valueFrom": {
                                        "secretKeyRef": {"name": "vault", "key": "passphrase"}
                                    },
                                }
                            ],
                            "volumeMounts": [{"name": "share", "mountPath": "/share"}],
                        }
                    ]
                }
            }
        }
    }
    apply_stack(kube, namespace, "dynamic-env", spec)

    stack = wait_stack(kube, namespace, "dynamic-env", ready, timeout=600)

    assert last_update(stack)["state"] == "succeeded"
    [job] = stack_jobs(kube, namespace, "dynamic-env")
    pod = job["spec"]["template"]["spec"]
    assert {"name": "share", "emptyDir": {}} in pod["volumes"]
    exported = _export_with(pulumi_env, passphrase)
    assert exported.returncode == 0, exported.stderr[-2000:]
    wrong = _export_with(pulumi_env, pulumi_env.passphrase)
    assert wrong.returncode != 0
    assert "passphrase" in wrong.stderr.lower()


def test_structured_config_on_a_too_old_cli_stalls_after_one_run_string_config_runs(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
) -> None:
    too_old = {JSON_CONFIG_MIN_VERSION_ENV: literal("99.0.0")}
    strings = stack_spec(git_repo(), pulumi_env)
    strings["envRefs"].update(too_old)
    apply_stack(kube, namespace, "strings", strings)
    structured = stack_spec(git_repo(), pulumi_env)
    structured["envRefs"].update(too_old)
    structured["config"]["files"] = 1  # an integer: structured config
    apply_stack(kube, namespace, "structured", structured)

    stalled = wait_stack(
        kube,
        namespace,
        "structured",
        lambda s: condition(s, "Stalled").get("status") == "True",
        timeout=600,
    )
    assert condition(stalled, "Stalled")["reason"] == "PulumiVersionTooLow"
    message = condition(stalled, "Stalled")["message"]
    assert "does not support JSON configuration, require >= v99.0.0" in message, message
    assert last_update(stalled)["reason"] == "PulumiVersionTooLow"
    assert wait_stack(kube, namespace, "strings", ready, timeout=600)
    controller.caught_up()
    assert len(stack_jobs(kube, namespace, "structured")) == 1
