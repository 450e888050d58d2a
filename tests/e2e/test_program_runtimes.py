"""Programs of every runtime the runner can run here, through the real controller: YAML (the
CLI's ``pulumi-language-yaml``), Python (the inline fallback: ``pulumi-language-python`` is not
buildable here), programs that manage real Kubernetes objects through the Kubernetes provider
(``pulumi-resource-kubernetes`` on PATH) under the run's own RBAC, and a Node.js program on a
machine without ``pulumi-language-nodejs``.

Git repositories are served over HTTP with basic auth; the controller runs as its own
ServiceAccount (tests/helpers/controller_harness.py) and the runs as ``pkobatch-runner`` with the
runner ClusterRole plus, for the Kubernetes programs, a Role naming exactly the objects they
manage.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    grant_role,
    last_update,
    ready,
    request_reconcile,
    stack_jobs,
    stack_spec,
    wait_stack,
)

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    DEPLOYMENTS,
    STACKS,
    Kube,
    NotFound,
)

JSON = dict[str, Any]
# Above the sum of a test's own waits (600 s to Ready, 300 s each to drift and destruction,
# a refresh between), so that a slow run fails with the wait's message rather than being cut
# off by the suite's 600 s. In a cold run of the whole suite on 2 cores (the Python program's
# first install of its dependencies included) one reached its last wait after 600 s with every
# step before it passed.
pytestmark = pytest.mark.timeout(1800)
APP = "guestbook"  # no secret value of the test (e.g. git user "pkobatch") in it
PROGRAM_LABEL = "pkobatch.io/test-program"

# What the Kubernetes programs' objects need, and nothing more: the provider applies them
# server-side (create, patch), reads them (get), deletes them and, for the ConfigMap, watches
# until it is gone (list, watch; the Deployment skips await). The runner ClusterRole already
# lets the run create, get and update ConfigMaps (its result).
PROGRAM_RULES: list[JSON] = [
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch", "delete", "list", "watch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "create", "patch", "delete"],
    },
]


def grant_program_rules(kube: Kube, namespace: str, rules: list[JSON]) -> None:
    """A Role with ``rules`` bound to the runner ServiceAccount of ``namespace``."""
    grant_role(kube, namespace, "program-objects", rules, "pkobatch-runner")


def kubernetes_spec(repo: Any, pulumi_env: Any, namespace: str, **extra: Any) -> JSON:
    spec = stack_spec(repo, pulumi_env, **extra)
    spec["config"] = {"namespace": namespace, "app": APP}
    spec.pop("secretsRef")
    return spec


def run_ended(stack: JSON) -> bool:
    """The Stack's latest run has ended (no run in progress)."""
    status = stack.get("status") or {}
    return bool(last_update(stack).get("state")) and not status.get("currentUpdate")


# -- YAML and Python programs ---------------------------------------------------------------


def test_yaml_and_python_stacks_reach_ready_and_take_refresh_preview_destroy(
    controller: ControllerProcess,
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    yaml_host: Path,
) -> None:
    apply_stack(kube, namespace, "yaml", stack_spec(git_repo("yaml"), pulumi_env))
    apply_stack(kube, namespace, "python", stack_spec(git_repo("files"), pulumi_env))

    yaml_stack = wait_stack(kube, namespace, "yaml", ready)
    python_stack = wait_stack(kube, namespace, "python", ready)

    assert yaml_stack["status"]["projectInfo"]["runtime"] == "yaml"
    assert yaml_stack["status"]["outputs"] == {
        "message": "hello from YAML",
        "count": 2,
        "greetings": ["hello 1", "hello 2"],
        "token": "[secret]",
    }
    assert python_stack["status"]["projectInfo"]["runtime"] == "python"
    assert python_stack["status"]["outputs"]["token"] == "[secret]"
    assert len(python_stack["status"]["outputs"]["paths"]) == 2

    for name in ("yaml", "python"):
        for args in (["refresh", name, "--wait"], ["preview", name, "--wait"]):
            done = cli(*args, "-o", "json")
            assert done.exit_code == 0, done.output
            outcome = json.loads(done.stdout)
            assert (outcome["operation"], outcome["result"]) == (args[0], "succeeded"), outcome
        destroyed = cli("destroy", name, "--yes", "--wait", "-o", "json")
        assert destroyed.exit_code == 0, destroyed.output
        outcome = json.loads(destroyed.stdout)
        assert (outcome["operation"], outcome["result"]) == ("destroy", "succeeded"), outcome
    assert list(pulumi_env.files_dir.iterdir()) == []


# -- Kubernetes objects through the Kubernetes provider --------------------------------------


@pytest.mark.parametrize("program", ["k8s-yaml", "k8s-python"])
def test_kubernetes_objects_are_created_drift_is_seen_and_finalizer_destroys_them(
    program: str,
    controller: ControllerProcess,
    cli: Callable[..., Result],
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    kubernetes_provider: Path,
) -> None:
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    spec = kubernetes_spec(
        git_repo(program),
        pulumi_env,
        namespace,
        destroyOnFinalize=True,
        driftDetection={"schedule": "* * * * *"},
    )
    apply_stack(kube, namespace, "app", spec)

    stack = wait_stack(kube, namespace, "app", ready, timeout=600)
    assert stack["status"]["outputs"] == {
        "configMap": f"{APP}-settings",
        "deployment": APP,
        "message": "hello",
    }
    settings = kube.get(CONFIGMAPS, f"{APP}-settings", namespace)
    deployment = kube.get(DEPLOYMENTS, APP, namespace)
    for obj in (settings, deployment):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == APP
        assert labels[PROGRAM_LABEL] == program
    assert settings["data"] == {"message": "hello"}
    assert deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": f"{APP}-settings"}}
    ]

    # Edited by hand: the next scheduled drift check reports it, a refresh takes it in.
    kube.merge_patch(CONFIGMAPS, f"{APP}-settings", {"data": {"message": "edited"}}, namespace)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Drifted").get("reason") == "DriftDetected",
        timeout=300,
    )
    assert stack["status"]["lastDriftCheck"]["driftedResources"] >= 1
    refreshed = cli("refresh", "app", "--wait", "-o", "json")
    assert refreshed.exit_code == 0, refreshed.output
    outcome = json.loads(refreshed.stdout)
    assert outcome["result"] == "succeeded" and outcome["changes"].get("update", 0) >= 1, outcome

    kube.delete(STACKS, "app", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "app", namespace) is None,
        timeout=300,
        what="the Stack to be destroyed and deleted",
    )
    with pytest.raises(NotFound):
        kube.get(CONFIGMAPS, f"{APP}-settings", namespace)
    with pytest.raises(NotFound):
        kube.get(DEPLOYMENTS, APP, namespace)


def test_a_missing_rbac_rule_fails_the_run_with_the_api_servers_message(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    kubernetes_provider: Path,
) -> None:
    # Deployments are not granted.
    grant_program_rules(kube, namespace, PROGRAM_RULES[:1])
    apply_stack(
        kube, namespace, "app", kubernetes_spec(git_repo("k8s-yaml"), pulumi_env, namespace)
    )

    stack = wait_stack(kube, namespace, "app", run_ended, timeout=600)

    update = last_update(stack)
    assert update["state"] == "failed"
    message = update["message"]
    # The API server's own words. (The runner SA's name shows masked: the git user name,
    # "pkobatch", comes from a Secret here.)
    assert f'deployments.apps "{APP}" is forbidden' in message, message
    assert f'User "system:serviceaccount:{namespace}:' in message, message
    assert (
        f'cannot patch resource "deployments" in API group "apps" in the namespace "{namespace}"'
        in message
    ), message
    assert kube.get_or_none(DEPLOYMENTS, APP, namespace) is None


# -- a runtime without its language host -----------------------------------------------------


def test_a_nodejs_program_without_its_language_host_fails_once_and_other_stacks_run(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    yaml_host: Path,
) -> None:
    if shutil.which("pulumi-language-nodejs", path=pulumi_env.env["PATH"]):
        pytest.fail("this test needs a machine without pulumi-language-nodejs")
    apply_stack(kube, namespace, "node", stack_spec(git_repo("nodejs"), pulumi_env))
    apply_stack(kube, namespace, "yaml", stack_spec(git_repo("yaml"), pulumi_env))

    node = wait_stack(kube, namespace, "node", run_ended, timeout=300)
    wait_stack(kube, namespace, "yaml", ready, timeout=300)

    first = last_update(node)
    assert first["state"] == "failed"
    assert "pulumi-language-nodejs" in first["message"], first
    # A missing binary cannot be fixed by a retry: the Stack stalls at once with the message
    # (InvalidSpec) after exactly one run ...
    node = wait_stack(
        kube,
        namespace,
        "node",
        lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
        timeout=300,
    )
    assert "pulumi-language-nodejs" in condition(node, "Stalled")["message"]
    assert last_update(node)["reason"] == "InvalidSpec"
    assert len(stack_jobs(kube, namespace, "node")) == 1
    # ... and is not wedged: a user's reconcile request runs it again.
    request_reconcile(kube, namespace, "node", "retry")
    node = wait_stack(
        kube,
        namespace,
        "node",
        lambda s: run_ended(s) and last_update(s)["reconcileRequest"] == "retry",
        timeout=300,
    )
    assert len(stack_jobs(kube, namespace, "node")) == 2
    assert "pulumi-language-nodejs" in last_update(node)["message"]
