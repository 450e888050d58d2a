"""PKO's other sources end to end: real control plane, controller under its own RBAC, real
runner and Pulumi CLI.

- ``fluxSource``: Flux's real source-controller (tests/helpers/flux_source_controller.py) reconciles
  a ``GitRepository`` of a loopback git repository; the Stack waits while it has no
  artifact, runs each new artifact revision once, and refuses an artifact whose bytes do not
  match the recorded digest.
- ``gitAuth.githubApp``: the loopback GitHub API of tests/helpers/github_app_server.py (HTTPS, a
  test CA) exchanges the app's JWT for an installation token, and its ``git http-backend``
  accepts only such tokens; the branch poller and the run both go through the exchange. A
  wrong key is ``SourceUnavailable``; no key, JWT or token appears anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    create_secret,
    last_update,
    literal,
    ready,
    stack_spec,
    wait_stack,
)

from pkobatch.api.constants import STACK_LABEL
from pkobatch.api.run import Run
from pkobatch.controller.stores import flux_source_resource
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    EVENTS,
    JOBS,
    PODS,
    PROGRAMS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    STACKS,
    Kube,
)

JSON = dict[str, Any]


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
        assert result["failedStep"] == "gitAuthentication"
        seen = everything_in(kube, cluster, namespace, controller)
    finally:
        controller.stop()
    assert github_app.issued, "no installation token was issued"
    credentials = [*github_app.issued]
    for key in (github_app.private_key, github_app.wrong_private_key):
        credentials += [line for line in key.splitlines() if len(line) > 20]
    assert [c for c in credentials if c in seen] == []
    assert "eyJhbGciOiJSUzI1NiIs" not in seen  # the JWT's header


# -- spec.fluxSource with Flux's real source-controller -----------------------------------

GITREPOSITORIES = flux_source_resource("GitRepository")
FLUX_PROGRAM = """name: flux-app
runtime: yaml
config:
  greeting:
    type: string
    default: hello
variables:
  message: ${greeting} from flux
outputs:
  message: ${message}
"""


def git_repository(name: str, url: str, secret: str) -> JSON:
    return {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": name},
        "spec": {
            "url": url,
            "interval": "1h",
            "timeout": "30s",
            "ref": {"branch": "main"},
            "secretRef": {"name": secret},
        },
    }


def artifact_of(kube: Kube, namespace: str, name: str) -> JSON:
    source = kube.get(GITREPOSITORIES, name, namespace)
    return dict((source.get("status") or {}).get("artifact") or {})


def sync_runs(kube: Kube, namespace: str, stack: str) -> list[JSON]:
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}={stack}")
    runs = [Run.from_job(job) for job in jobs]
    return [job for job, run in zip(jobs, runs, strict=True) if run and run.kind == "sync"]


def test_flux_git_repository_drives_the_stack(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    secrets: JSON,
    git_repo: Callable[..., Any],
    git_server: Any,
    flux_source_controller: Any,
    pulumi_env: Any,
    pulumi_bin: Path,
    yaml_host: Path,
) -> None:
    """Not ready → Reconciling; ready → Ready with outputs; a new commit → a new artifact
    revision → exactly one new run; a tampered artifact → a failed run naming the digest."""
    repo = git_repo()
    first = repo.update({"infra/Pulumi.yaml": FLUX_PROGRAM}, "a YAML program in infra/")
    create_secret(kube, namespace, "flux-git", {"username": "nobody", "password": "wrong"})
    bind_runner(kube, namespace)
    controller = ControllerProcess(cluster, namespace, tmp_path / "controller")
    controller.start()
    try:
        spec = stack_spec(repo, pulumi_env)
        for git_field in ("projectRepo", "branch", "gitAuth"):
            del spec[git_field]
        spec["fluxSource"] = {
            "sourceRef": {
                "apiVersion": "source.toolkit.fluxcd.io/v1",
                "kind": "GitRepository",
                "name": "app-source",
            },
            "dir": "infra",
        }
        apply_stack(kube, namespace, "from-flux", spec)
        kube.create(
            GITREPOSITORIES, git_repository("app-source", repo.http_url, "flux-git"), namespace
        )
        stack = wait_stack(
            kube,
            namespace,
            "from-flux",
            lambda s: (
                condition(s, "Reconciling").get("reason") == "WaitingForSource"
                and "no artifact yet" in condition(s, "Reconciling").get("message", "")
            ),
            timeout=120,
        )
        assert "lastUpdate" not in stack["status"] and not condition(stack, "Stalled")

        # Fix the credentials: the source becomes ready, the Stack runs its artifact.
        kube.merge_patch(
            SECRETS,
            "flux-git",
            {"stringData": {"username": git_server.username, "password": git_server.password}},
            namespace,
        )
        kube.merge_patch(
            GITREPOSITORIES,
            "app-source",
            {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "fixed"}}},
            namespace,
        )
        stack = wait_stack(kube, namespace, "from-flux", ready, timeout=300)
        revision = artifact_of(kube, namespace, "app-source")["revision"]
        assert revision == f"main@sha1:{first}"
        assert last_update(stack)["lastSuccessfulCommit"] == revision
        assert stack["status"]["outputs"]["message"] == "hello from flux"
        assert len(sync_runs(kube, namespace, "from-flux")) == 1

        # A new commit, reconciled by Flux: one new run at the new revision.
        second = repo.update({"infra/NOTES.md": "second\n"}, "second commit")
        kube.merge_patch(
            GITREPOSITORIES,
            "app-source",
            {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "second"}}},
            namespace,
        )
        stack = wait_stack(
            kube,
            namespace,
            "from-flux",
            lambda s: ready(s) and last_update(s)["lastSuccessfulCommit"] == f"main@sha1:{second}",
            timeout=300,
        )
        assert len(sync_runs(kube, namespace, "from-flux")) == 2

        # The stored artifact no longer matches the digest Flux recorded: the run refuses it.
        artifact = artifact_of(kube, namespace, "app-source")
        stored = flux_source_controller.storage / artifact["path"]
        stored.write_bytes(stored.read_bytes() + b"tampered")
        kube.merge_patch(
            STACKS,
            "from-flux",
            {"metadata": {"annotations": {"pulumi.com/reconciliation-request": "tampered"}}},
            namespace,
        )
        stack = wait_stack(
            kube,
            namespace,
            "from-flux",
            lambda s: (
                last_update(s).get("reconcileRequest") == "tampered"
                and last_update(s).get("state") == "failed"
            ),
            timeout=300,
        )
        message = last_update(stack)["message"]
        assert "does not match its digest" in message and artifact["digest"] in message
    finally:
        controller.stop()


# -- spec.programRef: a Program with resources of the Kubernetes provider ------------------

PROGRAM_RULES: list[JSON] = [
    # The provider applies the ConfigMap server-side, reads it, deletes it and watches it go;
    # the runner ClusterRole already grants create, get and update on ConfigMaps.
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch", "delete", "list", "watch"]},
]


def program_body(namespace: str, message: str) -> JSON:
    """PKO's example shape (configuration, resources, outputs), with a Kubernetes object."""
    return {
        "configuration": {"message": {"type": "String", "default": message}},
        "variables": {"label": "pkobatch-program"},
        "resources": {
            "settings": {
                "type": "kubernetes:core/v1:ConfigMap",
                "properties": {
                    "metadata": {
                        "name": "program-settings",
                        "namespace": namespace,
                        "labels": {"app.kubernetes.io/name": "${label}"},
                    },
                    "data": {"message": "${message}"},
                },
            }
        },
        "outputs": {"configMap": "${settings.metadata.name}", "message": "${message}"},
    }


def test_program_runs_reruns_once_per_edit_and_is_destroyed_on_delete(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    secrets: JSON,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    pulumi_bin: Path,
    yaml_host: Path,
    kubernetes_provider: Path,
) -> None:
    for rule_kind, body in (
        (
            ROLES,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "program-objects"},
                "rules": PROGRAM_RULES,
            },
        ),
        (
            ROLEBINDINGS,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "program-objects"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "program-objects",
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "pkobatch-runner", "namespace": namespace}
                ],
            },
        ),
    ):
        kube.apply(rule_kind, body, field_manager="pkobatch-tests", namespace=namespace)
    program = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": "settings-program"},
        "program": program_body(namespace, "hello"),
    }
    kube.create(PROGRAMS, program, namespace)
    spec = stack_spec(git_repo(), pulumi_env)
    for field in ("projectRepo", "branch", "gitAuth", "secretsRef"):
        del spec[field]
    spec.update(
        {"config": {}, "programRef": {"name": "settings-program"}, "destroyOnFinalize": True}
    )
    bind_runner(kube, namespace)
    controller = ControllerProcess(cluster, namespace, tmp_path / "controller")
    controller.start()
    try:
        apply_stack(kube, namespace, "uses-program", spec)
        stack = wait_stack(kube, namespace, "uses-program", ready, timeout=400)
        assert stack["status"]["outputs"] == {"configMap": "program-settings", "message": "hello"}
        assert last_update(stack)["lastSuccessfulCommit"] == "1"
        assert stack["status"]["projectInfo"] == {"name": "settings-program", "runtime": "yaml"}
        assert kube.get(CONFIGMAPS, "program-settings", namespace)["data"] == {"message": "hello"}
        stored = kube.get(PROGRAMS, "settings-program", namespace)
        assert stored["status"]["artifact"]["revision"] == "1"

        # An edit of the Program is a new revision: exactly one more run, with the edit.
        kube.merge_patch(
            PROGRAMS,
            "settings-program",
            {"program": program_body(namespace, "edited")},
            namespace,
        )
        stack = wait_stack(
            kube,
            namespace,
            "uses-program",
            lambda s: ready(s) and last_update(s)["lastSuccessfulCommit"] == "2",
            timeout=600,
        )
        assert stack["status"]["outputs"]["message"] == "edited"
        assert kube.get(CONFIGMAPS, "program-settings", namespace)["data"] == {"message": "edited"}
        assert len(sync_runs(kube, namespace, "uses-program")) == 2
        assert (
            kube.get(PROGRAMS, "settings-program", namespace)["status"]["artifact"]["revision"]
            == "2"
        )

        # destroyOnFinalize: deleting the Stack destroys the ConfigMap.
        kube.delete(STACKS, "uses-program", namespace)
        wait_until(
            lambda: kube.get_or_none(STACKS, "uses-program", namespace) is None,
            timeout=600,
            what="the Stack to be destroyed and deleted",
        )
        assert kube.get_or_none(CONFIGMAPS, "program-settings", namespace) is None
    finally:
        controller.stop()
