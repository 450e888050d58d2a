"""PKO's Workspace and Update objects (auto.pulumi.com/v1alpha1) end to end: real control
plane, the controller under its own RBAC (deploy/kustomize/base), the real runner and Pulumi
CLI on the test's file:// backend.

A Workspace in PKO's shape (git source with credentials from a Secret, env with a
secretKeyRef, one stack with plain and secret config) becomes Ready; Updates of type up,
preview, refresh and destroy against it each run as one Job owned by the Update and end with
PKO's status (startTime, endTime, message, Progressing/Complete/Failed, the outputs Secret
``<update>-stack-outputs`` after the up); the destroy's ``ttlAfterCompleted`` deletes it.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from helpers.controller_harness import ControllerProcess, condition

from pkobatch.api.constants import RUN_CONTAINER_NAME
from pkobatch.kube.client import JOBS, SECRETS, UPDATES, WORKSPACES, Kube, Resource

JSON = dict[str, Any]
FIELD_MANAGER = "pkobatch-tests"


def _key(name: str, key: str) -> JSON:
    return {"secretKeyRef": {"name": name, "key": key}}


def workspace_manifest(repo: Any, pulumi_env: Any, files_dir: str) -> JSON:
    env = pulumi_env.env
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Workspace",
        "metadata": {"name": "files"},
        "spec": {
            "git": {
                "url": repo.http_url,
                "ref": "main",
                "auth": {
                    "username": {"name": "git", "key": "username"},
                    "password": {"name": "git", "key": "password"},
                },
            },
            "env": [
                {"name": "PULUMI_BACKEND_URL", "value": env["PULUMI_BACKEND_URL"]},
                {"name": "PULUMI_CONFIG_PASSPHRASE", "valueFrom": _key("pulumi", "passphrase")},
                {"name": "PULUMI_HOME", "value": env["PULUMI_HOME"]},
                {"name": "PULUMI_SKIP_UPDATE_CHECK", "value": "true"},
                {"name": "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "value": "true"},
                {"name": "PULUMI_PYTHON_CMD", "value": sys.executable},
            ],
            "stacks": [
                {
                    "name": "dev",
                    "create": True,
                    "config": [
                        {"key": "directory", "value": files_dir},
                        {"key": "files", "value": "2"},
                        {"key": "token", "secret": True, "value": "workspace-token"},
                    ],
                }
            ],
        },
    }


def update_manifest(name: str, operation: str, **spec: Any) -> JSON:
    return {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "metadata": {"name": name},
        "spec": {"workspaceName": "files", "stackName": "dev", "type": operation, **spec},
    }


def _apply(kube: Kube, resource: Resource, body: JSON, namespace: str) -> None:
    kube.apply(resource, body, field_manager=FIELD_MANAGER, namespace=namespace)


def _wait(
    read: Callable[[], JSON | None], done: Callable[[JSON | None], bool], timeout: float
) -> JSON | None:
    deadline = time.monotonic() + timeout
    seen: JSON | None = None
    while time.monotonic() < deadline:
        seen = read()
        if done(seen):
            return seen
        time.sleep(1)
    raise AssertionError(
        f"timed out after {timeout}s; last seen status: {(seen or {}).get('status')}"
    )


def _complete(obj: JSON | None) -> bool:
    return obj is not None and condition(obj, "Complete").get("status") == "True"


def run_update(kube: Kube, namespace: str, name: str, operation: str, **spec: Any) -> JSON:
    """Apply an Update and wait until it is Complete (a run takes some tens of seconds)."""
    _apply(kube, UPDATES, update_manifest(name, operation, **spec), namespace)
    done = _wait(lambda: kube.get_or_none(UPDATES, name, namespace), _complete, 600)
    assert done is not None
    return done


def assert_pko_status(update: JSON, operation: str) -> None:
    """What PKO's update controller writes for a successful Update."""
    status = update["status"]
    assert status["observedGeneration"] == update["metadata"]["generation"]
    assert status["startTime"] <= status["endTime"]
    assert condition(update, "Progressing")["status"] == "False"
    assert condition(update, "Complete")["status"] == "True"
    failed = condition(update, "Failed")
    assert (failed["status"], failed["reason"]) == ("False", "UpdateSucceeded"), status
    assert status["projectInfo"]["runtime"] == "python"
    assert status["message"]


def update_job(kube: Kube, namespace: str, update: JSON) -> JSON:
    """The one Job the Update ran as (controlled by the Update)."""
    jobs = [
        job
        for job in kube.list_objects(JOBS, namespace)[0]
        if any(
            ref.get("kind") == "Update"
            and ref.get("uid") == update["metadata"]["uid"]
            and ref.get("controller")
            for ref in job["metadata"].get("ownerReferences") or ()
        )
    ]
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    return jobs[0]


def test_updates_up_preview_refresh_destroy_run_against_a_workspace(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    secrets: JSON,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    tmp_path: Any,
) -> None:
    files_dir = tmp_path / "workspace-files"
    _apply(kube, WORKSPACES, workspace_manifest(git_repo(), pulumi_env, str(files_dir)), namespace)
    workspace = _wait(
        lambda: kube.get_or_none(WORKSPACES, "files", namespace),
        lambda w: w is not None and condition(w, "Ready").get("status") == "True",
        120,
    )
    assert workspace is not None
    assert workspace["status"]["observedGeneration"] == workspace["metadata"]["generation"]
    assert condition(workspace, "Ready")["reason"] == "Succeeded"

    up = run_update(kube, namespace, "files-up", "up", message="deployed by the test")
    assert_pko_status(up, "up")
    assert sorted(p.name for p in files_dir.iterdir()) == ["file-0.txt", "file-1.txt"]
    job = update_job(kube, namespace, up)
    assert job["metadata"]["labels"]["pkobatch.io/operation"] == "up"
    pod = job["spec"]["template"]["spec"]
    [run] = [c for c in pod["containers"] if c["name"] == RUN_CONTAINER_NAME]
    assert {"name": "PULUMI_CONFIG_PASSPHRASE", "valueFrom": _key("pulumi", "passphrase")} in run[
        "env"
    ]
    assert up["status"]["outputs"] == "files-up-stack-outputs"
    outputs = kube.get(SECRETS, "files-up-stack-outputs", namespace)
    assert outputs["immutable"] is True
    [owner] = outputs["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Update", up["metadata"]["uid"])
    assert json.loads(outputs["metadata"]["annotations"]["pulumi.com/secrets"]) == ["token"]
    values = {k: json.loads(base64.b64decode(v)) for k, v in outputs["data"].items()}
    assert values["directory"] == str(files_dir)
    assert values["paths"] == [str(files_dir / "file-0.txt"), str(files_dir / "file-1.txt")]
    # The controller never holds a secret value: secret outputs stay masked.
    assert values["token"] == "[secret]"

    preview = run_update(kube, namespace, "files-preview", "preview")
    assert_pko_status(preview, "preview")
    update_job(kube, namespace, preview)

    (files_dir / "file-0.txt").write_text("changed behind Pulumi's back")
    refresh = run_update(kube, namespace, "files-refresh", "refresh")
    assert_pko_status(refresh, "refresh")

    destroy = run_update(kube, namespace, "files-destroy", "destroy", ttlAfterCompleted="5s")
    assert_pko_status(destroy, "destroy")
    assert list(files_dir.iterdir()) == []
    # ttlAfterCompleted: the finished Update is deleted (its Job with it, by the garbage
    # collector); the Updates without a TTL stay.
    _wait(lambda: kube.get_or_none(UPDATES, "files-destroy", namespace), lambda u: u is None, 120)
    assert kube.get_or_none(UPDATES, "files-up", namespace) is not None


def test_an_update_that_cannot_run_fails_with_a_message(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    tmp_path: Any,
) -> None:
    manifest = workspace_manifest(git_repo(), pulumi_env, str(tmp_path))
    manifest["spec"]["stacks"][0]["config"].append(
        {"key": "apiToken", "valueFrom": {"env": "API_TOKEN"}}
    )
    _apply(kube, WORKSPACES, manifest, namespace)
    workspace = _wait(
        lambda: kube.get_or_none(WORKSPACES, "files", namespace),
        lambda w: w is not None and condition(w, "Stalled").get("status") == "True",
        120,
    )
    assert workspace is not None
    assert condition(workspace, "Ready")["status"] == "False"
    assert (
        "config[apiToken].valueFrom is not supported" in condition(workspace, "Stalled")["message"]
    )

    _apply(kube, UPDATES, update_manifest("files-bad", "deploy"), namespace)
    bad = _wait(lambda: kube.get_or_none(UPDATES, "files-bad", namespace), _complete, 120)
    assert bad is not None
    failed = condition(bad, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "SpecInvalid")
    assert "spec.type is 'deploy'" in bad["status"]["message"]
    assert kube.list_objects(JOBS, namespace)[0] == []
