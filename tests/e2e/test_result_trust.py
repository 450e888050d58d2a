"""Run results the controller trusts (docs/security.md#run-results-what-the-controller-trusts),
attacked on the real control plane: the controller under its own RBAC, real runs (runner,
Pulumi CLI, test programs over the loopback git server), and the forger a client with
exactly a namespace user's rights — Stacks, Programs, ConfigMaps and Secrets read-write;
Jobs, pods and Events read-only — or another Stack's program under the runner's
ServiceAccount.

- a success forged while a run is in progress is never folded; the real result is;
- a destroy success forged during a destroy on deletion whose real destroy fails, still in
  place when the controller folds the run: rejected with a Warning Event, the finalizer and
  the resources stay; a real destroy later releases the Stack;
- a second Stack's program forging the first Stack's result: never folded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    grant_role,
    last_update,
    ready,
    request_reconcile,
    set_passphrase,
    stack_spec,
    wait_events,
    wait_stack,
)

from pkobatch.api.constants import FINALIZER
from pkobatch.api.objects import job_finished
from pkobatch.api.run import RunResult, StackRef
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    EVENTS,
    JOBS,
    PODS,
    SERVICEACCOUNTS,
    STACKS,
    AlreadyExists,
    Forbidden,
    Invalid,
    Kube,
)

pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
NAMESPACE_USER = "namespace-user"
READ = ["get", "list", "watch"]
FORGED_OUTPUT = "forged"
FORGED_PERMALINK = "https://forged.example/run"


def namespace_user(cluster: Any, namespace: str) -> Kube:
    """A client holding exactly the rights of the issue's namespace user."""
    rules = [
        {"apiGroups": ["pulumi.com"], "resources": ["stacks", "programs"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["*"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": READ},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": READ},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": READ},
    ]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAMESPACE_USER}}
    cluster.kube.create(SERVICEACCOUNTS, account, namespace)
    grant_role(cluster.kube, namespace, NAMESPACE_USER, rules, NAMESPACE_USER)
    client: Kube = cluster.service_account_kube(namespace, NAMESPACE_USER)
    return client


def forged_result(stack: JSON, job: str, operation: str) -> JSON:
    """A ConfigMap named after run ``job`` of ``stack``, with the result labels and a
    succeeded ``result.json`` naming the Job and the Stack's UID (no owner reference)."""
    meta = stack["metadata"]
    result = RunResult(
        operation=operation,
        state="succeeded",
        reason="Succeeded",
        stack=StackRef(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
        job_name=job,
        outputs={FORGED_OUTPUT: "yes"},
        permalink=FORGED_PERMALINK,
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": job,
            "labels": {
                "app.kubernetes.io/managed-by": "pkobatch",
                "pkobatch.io/stack": meta["name"],
                "pkobatch.io/operation": operation,
                "pkobatch.io/result": "succeeded",
            },
        },
        "data": {"result.json": result.to_json()},
    }


def forge(client: Kube, stack: JSON, job: str, operation: str) -> None:
    """``forged_result``, in place of whatever ConfigMap of that name is there."""
    namespace = stack["metadata"]["namespace"]
    body = forged_result(stack, job, operation)
    try:
        client.create(CONFIGMAPS, body, namespace)
    except AlreadyExists:
        client.delete(CONFIGMAPS, job, namespace)
        client.create(CONFIGMAPS, body, namespace)


def current_run(stack: JSON) -> str:
    return str(((stack.get("status") or {}).get("currentUpdate") or {}).get("name") or "")


def held_spec(repo: Any, pulumi_env: Any, hold: Path, **extra: Any) -> JSON:
    """The test program, its update held until ``hold`` exists."""
    spec = stack_spec(repo, pulumi_env, **extra)
    spec["config"]["holdUntil"] = str(hold)
    return spec


def assert_not_folded(kube: Kube, namespace: str, name: str, run: str) -> JSON:
    """Stack ``name`` still shows ``run`` in progress and nothing of a forgery."""
    stack = kube.get(STACKS, name, namespace)
    status = stack.get("status") or {}
    assert current_run(stack) == run, status
    assert condition(stack, "Ready").get("status") != "True", status
    assert FORGED_OUTPUT not in (status.get("outputs") or {}), status
    assert last_update(stack).get("permalink") != FORGED_PERMALINK, status
    return stack


def test_a_success_forged_while_the_run_is_in_progress_is_never_folded(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    user = namespace_user(cluster, namespace)
    hold = tmp_path / "hold"
    apply_stack(user, namespace, "app", held_spec(git_repo(), pulumi_env, hold))
    stack = wait_stack(kube, namespace, "app", lambda s: bool(current_run(s)))
    run = current_run(stack)

    forge(user, stack, run, "up")
    # The controller sees the ConfigMap at once (it was folded within 5 s before); give it
    # that and more, then let it catch up with everything.
    time.sleep(10)
    controller.caught_up()
    assert_not_folded(kube, namespace, "app", run)
    # What vouches for a result is the pod's status, which this user cannot write.
    pods, _ = user.list_objects(PODS, namespace, label_selector=f"job-name={run}")
    assert pods
    with pytest.raises(Forbidden):
        user.merge_patch(
            PODS,
            pods[0]["metadata"]["name"],
            {"status": {"message": "x"}},
            namespace,
            subresource="status",
        )

    hold.touch()
    stack = wait_stack(kube, namespace, "app", ready, timeout=600)
    assert last_update(stack)["name"] == run and last_update(stack)["state"] == "succeeded"
    assert FORGED_OUTPUT not in stack["status"]["outputs"]
    assert stack["status"]["outputs"]["directory"] == str(pulumi_env.files_dir)
    assert last_update(stack)["permalink"] != FORGED_PERMALINK
    # The runner put its own result in the forgery's place: immutable, owned by its Job.
    result = kube.get(CONFIGMAPS, run, namespace)
    job = kube.get(JOBS, run, namespace)
    assert result["immutable"] is True
    assert [o["uid"] for o in result["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]
    with pytest.raises(Invalid):
        user.merge_patch(CONFIGMAPS, run, {"data": {"result.json": "{}"}}, namespace)


def test_a_destroy_success_forged_during_a_failing_destroy_keeps_the_finalizer(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    user = namespace_user(cluster, namespace)
    repo = git_repo()
    apply_stack(user, namespace, "app", stack_spec(repo, pulumi_env, destroyOnFinalize=True))
    wait_stack(kube, namespace, "app", ready, timeout=600)
    assert len(list(pulumi_env.files_dir.iterdir())) == 2

    # The real destroy will fail: the backend's passphrase is wrong.
    set_passphrase(kube, namespace, "not-the-passphrase")
    user.delete(STACKS, "app", namespace)
    stack = wait_stack(kube, namespace, "app", lambda s: "-destroy-" in current_run(s), timeout=120)
    run = current_run(stack)
    # No controller folds anything while the forger works.
    controller.kill()
    assert not job_finished(kube.get(JOBS, run, namespace)), "the destroy ended too soon"
    forge(user, stack, run, "destroy")
    wait_until(
        lambda: job_finished(kube.get(JOBS, run, namespace)),
        timeout=600,
        what=f"the destroy {run} to fail",
    )
    # The runner replaced the forgery with its own (failed) result; forged again, in its place.
    assert '"state":"failed"' in kube.get(CONFIGMAPS, run, namespace)["data"]["result.json"]
    forge(user, stack, run, "destroy")
    controller.start()

    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == run)
    update = last_update(stack)
    assert (update["type"], update["state"]) == ("destroy", "failed"), update
    assert "is not the result the pod of run" in update["message"]
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert len(list(pulumi_env.files_dir.iterdir())) == 2
    wait_events(kube, namespace, lambda e: e["reason"] == "ResultRejected" and run in e["note"])
    assert not [
        e for e in kube.list_objects(EVENTS, namespace)[0] if e["reason"] == "StackDestroyed"
    ]

    # A real destroy still releases the Stack.
    set_passphrase(kube, namespace, secrets["pulumi"]["passphrase"])
    request_reconcile(user, namespace, "app", "retry")
    wait_until(
        lambda: kube.get_or_none(STACKS, "app", namespace) is None,
        timeout=600,
        what="the Stack to be destroyed and deleted",
    )
    assert list(pulumi_env.files_dir.iterdir()) == []


def test_a_second_stacks_program_cannot_forge_the_first_stacks_result(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    hold = tmp_path / "hold"
    apply_stack(kube, namespace, "victim", held_spec(git_repo(), pulumi_env, hold))
    victim = wait_stack(kube, namespace, "victim", lambda s: bool(current_run(s)))
    run = current_run(victim)

    forger = stack_spec(git_repo("forge-result"), pulumi_env)
    forged_configmap = json.dumps(forged_result(victim, run, "up"))
    forger["config"].update(configMap=forged_configmap, namespace=namespace)
    apply_stack(kube, namespace, "forger", forger)
    forged = wait_stack(kube, namespace, "forger", ready, timeout=600)
    assert forged["status"]["outputs"]["forged"] == run
    assert '"forged"' in kube.get(CONFIGMAPS, run, namespace)["data"]["result.json"]
    time.sleep(5)
    controller.caught_up()
    assert_not_folded(kube, namespace, "victim", run)

    hold.touch()
    victim = wait_stack(kube, namespace, "victim", ready, timeout=600)
    assert last_update(victim)["name"] == run
    assert FORGED_OUTPUT not in victim["status"]["outputs"]
    assert last_update(victim)["permalink"] != FORGED_PERMALINK
