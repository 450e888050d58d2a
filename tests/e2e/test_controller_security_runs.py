"""Security end to end: real control plane, controller under its own RBAC, real runner and
Pulumi CLI, test programs served by the loopback http git server of tests/fixture_plugins/git.py.

- git credentials never go over plain http:// without the operator's opt-in
  (``PKOBATCH_INSECURE_HTTP_GIT_HOSTS``): the server records every request and whether it
  carried an ``Authorization`` header; with the opt-in the same Stack runs;
- at Pod Security level ``restricted``, a Stack whose templates stay within it still runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.controller_harness import (
    INSECURE_HTTP_GIT_HOSTS,
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    last_update,
    ready,
    stack_jobs,
    stack_spec,
    wait_stack,
)

from pkobatch.kube.client import Kube


def start_controller(cluster: Any, namespace: str, work_dir: Path, **env: str) -> ControllerProcess:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, work_dir, env=env)
    process.start()
    return process


def authorized_requests(git_server: Any, repo: Any) -> list[Any]:
    return [r for r in git_server.requests if r.path.startswith(f"/{repo.bare.name}/")]


def test_git_credentials_need_the_http_opt_in_and_then_the_stack_runs(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    git_server: Any,
    pulumi_env: Any,
    pulumi_bin: Path,
) -> None:
    repo = git_repo()
    host = f"127.0.0.1:{git_server.port}"
    strict = start_controller(
        cluster, namespace, tmp_path / "strict", **{INSECURE_HTTP_GIT_HOSTS: ""}
    )
    try:
        apply_stack(kube, namespace, "plain-http", stack_spec(repo, pulumi_env))
        stack = wait_stack(
            kube,
            namespace,
            "plain-http",
            lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
            timeout=120,
        )
        message = condition(stack, "Stalled")["message"]
        assert f"{INSECURE_HTTP_GIT_HOSTS}={host}" in message, message
        assert git_server.password not in message
        time.sleep(6)  # three poll intervals (2 s) of a controller that must not poll
    finally:
        strict.stop()
    assert [r for r in authorized_requests(git_server, repo) if r.authorization] == []
    assert stack_jobs(kube, namespace, "plain-http") == []

    opted_in = start_controller(
        cluster, namespace, tmp_path / "opted-in", **{INSECURE_HTTP_GIT_HOSTS: "127.0.0.1"}
    )
    try:
        stack = wait_stack(kube, namespace, "plain-http", ready, timeout=600)
    finally:
        opted_in.stop()
    assert last_update(stack)["state"] == "succeeded"
    assert last_update(stack)["lastSuccessfulCommit"] == repo.commit
    assert any(r.authorization for r in authorized_requests(git_server, repo))


def test_a_compliant_stack_runs_at_the_restricted_level(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    secrets: dict[str, Any],
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    pulumi_bin: Path,
) -> None:
    process = start_controller(
        cluster, namespace, tmp_path / "controller", PKOBATCH_JOB__POD_SECURITY_LEVEL="restricted"
    )
    try:
        templates = {
            "jobTemplate": {
                "metadata": {"labels": {"team": "infra"}},
                "spec": {"volumes": [{"name": "scratch", "emptyDir": {}}]},
            },
            "workspaceTemplate": {
                "spec": {
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "securityContext": {"readOnlyRootFilesystem": False},
                                }
                            ]
                        }
                    }
                }
            },
        }
        apply_stack(kube, namespace, "hardened", stack_spec(git_repo(), pulumi_env, **templates))
        stack = wait_stack(kube, namespace, "hardened", ready, timeout=600)
        assert last_update(stack)["state"] == "succeeded"
        job = stack_jobs(kube, namespace, "hardened")[0]
        assert job["spec"]["template"]["metadata"]["labels"]["team"] == "infra"
    finally:
        process.stop()
