"""PKO's other sources end to end: real control plane, controller under its own RBAC, real
runner and Pulumi CLI.

- ``gitAuth.githubApp``: the loopback GitHub API of tests/github_app_server.py (HTTPS, a
  test CA) exchanges the app's JWT for an installation token, and its ``git http-backend``
  accepts only such tokens; the branch poller and the run both go through the exchange. A
  wrong key is ``SourceUnavailable``; no key, JWT or token appears anywhere.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    last_update,
    literal,
    ready,
    stack_spec,
    wait_stack,
)

from pkobatch.kube.client import CONFIGMAPS, EVENTS, JOBS, PODS, SECRETS, STACKS, Kube

pytestmark = pytest.mark.e2e
JSON = dict[str, Any]


def create_secret(kube: Kube, namespace: str, name: str, data: dict[str, str]) -> None:
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
        namespace,
    )


def github_app_auth(secret: str) -> JSON:
    def ref(key: str) -> JSON:
        return {"type": "Secret", "secret": {"name": secret, "key": key}}

    return {
        "githubApp": {
            "appID": ref("appID"),
            "installationID": ref("installationID"),
            "privateKey": ref("privateKey"),
        }
    }


def everything_in(kube: Kube, cluster: Any, namespace: str, controller: ControllerProcess) -> str:
    """Every object and log a credential could leak into."""
    parts = [controller.log_text()]
    for resource in (STACKS, JOBS, CONFIGMAPS, EVENTS, PODS):
        objects, _ = kube.list_objects(resource, namespace)
        parts.append(json.dumps(objects))
    pods, _ = kube.list_objects(PODS, namespace)
    for pod in pods:
        for container in pod["spec"]["containers"]:
            parts.append(
                cluster.pod_logs.read(
                    namespace, pod["metadata"]["name"], container=container["name"]
                )
            )
    return "\n".join(parts)


def test_github_app_clones_through_the_token_exchange_and_never_shows_a_credential(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    secrets: JSON,
    git_repo: Callable[..., Any],
    github_app: Any,
    pulumi_env: Any,
    pulumi_bin: Path,
) -> None:
    repo = git_repo()
    url = github_app.repo_url(repo.bare)
    ca = str(github_app.ca_file)
    trust = {"SSL_CERT_FILE": ca, "GIT_SSL_CAINFO": ca}
    for name, key in (("app", github_app.private_key), ("wrong", github_app.wrong_private_key)):
        create_secret(
            kube,
            namespace,
            name,
            {
                "appID": github_app.app_id,
                "installationID": github_app.installation_id,
                "privateKey": key,
            },
        )
    bind_runner(kube, namespace)
    controller = ControllerProcess(cluster, namespace, tmp_path / "controller", env=trust)
    controller.start()
    try:

        def spec(secret: str, **extra: Any) -> JSON:
            base = stack_spec(repo, pulumi_env, projectRepo=url, gitAuth=github_app_auth(secret))
            base["envRefs"].update({name: literal(value) for name, value in trust.items()})
            return {**base, **extra}

        apply_stack(kube, namespace, "via-app", spec("app"))
        stack = wait_stack(kube, namespace, "via-app", ready, timeout=300)
        update = last_update(stack)
        assert update["state"] == "succeeded"
        assert update["lastSuccessfulCommit"] == repo.commit
        assert len(list(pulumi_env.files_dir.iterdir())) == 2

        # A pinned commit: no branch poll, so the run itself meets the wrong key.
        pinned = spec("wrong", branch=None, commit=repo.commit)
        del pinned["branch"]
        apply_stack(kube, namespace, "wrong-key", pinned)
        stack = wait_stack(
            kube,
            namespace,
            "wrong-key",
            lambda s: last_update(s).get("state") == "failed",
            timeout=300,
        )
        message = last_update(stack)["message"]
        assert "HTTP 401" in message and "check appID, installationID and privateKey" in message
        result_name = last_update(stack)["name"]
        result = json.loads(kube.get(CONFIGMAPS, result_name, namespace)["data"]["result.json"])
        assert result["reason"] == "SourceUnavailable"
        seen = everything_in(kube, cluster, namespace, controller)
    finally:
        controller.stop()
    assert github_app.issued, "no installation token was issued"
    credentials = [*github_app.issued]
    for key in (github_app.private_key, github_app.wrong_private_key):
        credentials += [line for line in key.splitlines() if len(line) > 20]
    assert [c for c in credentials if c in seen] == []
    assert "eyJhbGciOiJSUzI1NiIs" not in seen  # the JWT's header
