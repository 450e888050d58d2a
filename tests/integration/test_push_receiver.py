"""The push receiver against the real control plane and the tests' git server: a signed
GitHub push makes the controller run the Stack at the new commit although its branch is
polled only hourly; a bad signature, a repository no Stack follows and a request over the
receiver's rate are refused with their status and change nothing (no ``ls-remote``, no
run). All traffic stays on loopback."""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    create_secret,
    last_update,
    secret,
    stack_jobs,
    wait_stack,
)

from pkobatch.dev.processes import free_port, wait_until
from pkobatch.kube.client import STACKS, Kube

SECRET = "integration-receiver-secret"
LS_REMOTE = "pkobatch_git_ls_remote_total"


def push_body(repo_url: str) -> bytes:
    return json.dumps(
        {"ref": "refs/heads/main", "after": "0" * 40, "repository": {"clone_url": repo_url}}
    ).encode()


def send(port: int, body: bytes, secret: str = SECRET) -> tuple[int, str]:
    """POST a GitHub push signed with ``secret``; (status, reply text)."""
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/hooks/github",
        data=body,
        headers={"X-GitHub-Event": "push", "X-Hub-Signature-256": f"sha256={signature}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def listening(port: int) -> bool:
    """The receiver answers (it starts once the controller's caches are synced)."""
    try:
        send(port, b"{}", secret="")
    except OSError:
        return False
    return True


def test_a_signed_push_runs_the_stack_now_and_refused_requests_change_nothing(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    bind_runner(kube, namespace)
    secrets_dir = tmp_path / "receiver-secrets"
    secrets_dir.mkdir()
    (secrets_dir / "github").write_text(SECRET)
    port = free_port()
    process = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={
            # Polls an hour apart, failed runs retried an hour later: only a push runs it.
            "PKOBATCH_POLL_INTERVAL": "1h",
            "PKOBATCH_RETRY__BASE": "1h",
            "PKOBATCH_RECEIVER__ADDR": f"127.0.0.1:{port}",
            "PKOBATCH_RECEIVER__RECEIVERS": "github=github",
            "PKOBATCH_RECEIVER__SECRETS_DIR": str(secrets_dir),
            # Four requests (the probe included), then one token every 1000 s.
            "PKOBATCH_RECEIVER__BURST": "4",
            "PKOBATCH_RECEIVER__RATE": "0.001",
        },
    )
    process.start()
    try:
        repo = git_repo()
        credentials = {"username": git_server.username, "password": git_server.password}
        create_secret(kube, namespace, "git", credentials)
        spec = {
            "stack": "dev",
            "projectRepo": repo.http_url,
            "branch": "main",
            "gitAuth": {
                "basicAuth": {
                    "userName": secret("git", "username"),
                    "password": secret("git", "password"),
                }
            },
            # Fails at pod creation: nothing needs Pulumi, only the commit each run was for.
            "serviceAccountName": "missing",
        }
        apply_stack(kube, namespace, "pushed", spec)
        first = repo.commit
        wait_stack(
            kube,
            namespace,
            "pushed",
            lambda s: last_update(s).get("lastAttemptedCommit") == first,
            timeout=120,
        )
        wait_until(lambda: listening(port), timeout=60, what="the push receiver")
        process.caught_up()
        polls = process.metric(LS_REMOTE)
        jobs = len(stack_jobs(kube, namespace, "pushed"))
        second = repo.update({"NOTES.md": "second\n"}, "second commit")

        status, text = send(port, push_body(repo.http_url), secret="a guess")
        assert status == 401 and "does not match" in text, text
        status, text = send(port, push_body("http://127.0.0.1:1/nobody.git"))
        assert status == 404 and "no Stack follows" in text, text
        process.caught_up()
        assert process.metric(LS_REMOTE) == polls
        assert len(stack_jobs(kube, namespace, "pushed")) == jobs

        status, text = send(port, push_body(repo.http_url))
        assert status == 202, text
        stack = wait_stack(
            kube,
            namespace,
            "pushed",
            lambda s: last_update(s).get("lastAttemptedCommit") == second,
            timeout=120,
        )
        assert last_update(stack)["lastAttemptedCommit"] == second
        assert process.metric(LS_REMOTE) == polls + 1
        jobs = len(stack_jobs(kube, namespace, "pushed"))
        assert process.metric("pkobatch_receiver_requests_total", code="202") == 1

        repo.update({"NOTES.md": "third\n"}, "third commit")
        status, text = send(port, push_body(repo.http_url))
        assert status == 429 and "retry later" in text, text
        process.caught_up()
        assert process.metric(LS_REMOTE) == polls + 1
        assert len(stack_jobs(kube, namespace, "pushed")) == jobs
        stack = kube.get(STACKS, "pushed", namespace)
        assert last_update(stack)["lastAttemptedCommit"] == second
        assert SECRET not in process.log_text()
    finally:
        process.stop()
