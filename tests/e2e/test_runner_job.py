"""The runner as a Job on the local control plane (real API server, Job controller, garbage
collector; the node agent runs the pod), under a ServiceAccount bound only to the
``pkobatch-runner`` ClusterRole of deploy/kustomize, with a real token, the real Pulumi CLI and
real git repositories served over HTTP with basic auth.

Each test plays the controller's Job builder: it writes the RunSnapshot and the Job (secret
values only through ``secretKeyRef``) and reads the result ConfigMap the runner writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.sentinels import plant

from pkobatch.api.constants import (
    MANAGED_BY_LABEL,
    OPERATION_LABEL,
    RESULT_KEY,
    RESULT_LABEL,
    STACK_LABEL,
)
from pkobatch.api.run import (
    TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_PATH_ENV,
    RunResult,
    RunSnapshot,
    result_digest_line,
)
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CLUSTERROLES,
    CONFIGMAPS,
    CORE_EVENTS,
    JOBS,
    PODS,
    ROLEBINDINGS,
    SECRETS,
    AlreadyExists,
    Kube,
)

REPO = Path(__file__).parents[2]
RUNNER_ROLE = REPO / "deploy" / "kustomize" / "base" / "runner-clusterrole.yaml"
RUNNER_BINDING = REPO / "deploy" / "kustomize" / "runner" / "rolebinding.yaml"
RUN_TIMEOUT = 300.0
TOKEN_ENV = "PKOBATCH_CONFIG_TOKEN"


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


class Runner:
    """Runs RunSnapshots as Jobs in one namespace and collects their results."""

    def __init__(self, cluster: Any, namespace: str, pulumi_env: Any, tmp_path: Path) -> None:
        self.cluster = cluster
        self.kube: Kube = cluster.kube
        self.namespace = namespace
        self.pulumi_env = pulumi_env
        self.tmp_path = tmp_path
        self.count = 0
        self.app_secrets: dict[str, str] = {}

    def snapshot(self, operation: str, repo: Any, **overrides: Any) -> dict[str, Any]:
        spec = {
            "stack": "dev",
            "projectRepo": repo.http_url,
            "branch": "main",
            "gitAuth": {
                "basicAuth": {
                    "userName": {"type": "Secret", "secret": {"name": "git", "key": "username"}},
                    "password": {"type": "Secret", "secret": {"name": "git", "key": "password"}},
                }
            },
            "config": {"directory": str(self.pulumi_env.files_dir)},
            "secretsRef": {"token": {"type": "Secret", "secret": {"name": "app", "key": "token"}}},
            **overrides.pop("spec", {}),
        }
        return {
            "operation": operation,
            "stack": {"name": "files", "namespace": self.namespace, "uid": "stack-uid-1"},
            "generation": 1,
            "spec": spec,
            "configFromEnv": {"token": {"env": TOKEN_ENV, "secret": True}},
            "gitAuth": {"usernameEnv": "GIT_USERNAME", "passwordEnv": "GIT_PASSWORD"},
            "secretEnv": ["APP_SECRET", "PULUMI_CONFIG_PASSPHRASE"],
            "projectInfo": {"name": "pkobatch-test-files", "runtime": "python"},
            # The tests' git server is plain http on loopback: the controller's opt-in.
            "insecureHttpGitHosts": ["127.0.0.1"],
            **overrides,
        }

    def start(
        self,
        snapshot: dict[str, Any],
        *,
        grace: int = 30,
        deadline: int | None = None,
    ) -> str:
        self.count += 1
        name = f"files-{snapshot['operation']}-{self.count}"
        snapshot = {**snapshot, "jobName": name, "resultConfigMap": name}
        RunSnapshot.model_validate(snapshot)  # what the Job builder guarantees
        env = [
            {"name": "PULUMI_BACKEND_URL", "value": self.pulumi_env.backend_url},
            {"name": "PULUMI_SKIP_UPDATE_CHECK", "value": "true"},
            {"name": "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "value": "true"},
            {"name": "PKOBATCH_CACHE_DIR", "value": str(self.tmp_path / "runner-cache")},
            {"name": "PKOBATCH_GRACE_PERIOD_SECONDS", "value": str(grace)},
            # As the Job builder sets it: where the runner vouches for its result.
            {"name": TERMINATION_MESSAGE_PATH_ENV, "value": TERMINATION_MESSAGE_PATH},
            secret_env("PULUMI_CONFIG_PASSPHRASE", "pulumi", "passphrase"),
            secret_env("GIT_USERNAME", "git", "username"),
            secret_env("GIT_PASSWORD", "git", "password"),
            secret_env(TOKEN_ENV, "app", "token"),
            secret_env("APP_SECRET", "app", "env-secret"),
        ]
        labels = {
            MANAGED_BY_LABEL: "pkobatch",
            STACK_LABEL: "files",
            OPERATION_LABEL: snapshot["operation"],
        }
        job: dict[str, Any] = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "serviceAccountName": "pkobatch-runner",
                        "terminationGracePeriodSeconds": grace,
                        "containers": [
                            {
                                "name": "pulumi",
                                "image": "pkobatch/runner:dev",
                                "command": [sys.executable, "-m", "pkobatch.main", "job", "run"],
                                "args": ["--snapshot", json.dumps(snapshot)],
                                "env": env,
                            }
                        ],
                    },
                },
            },
        }
        if deadline is not None:
            job["spec"]["activeDeadlineSeconds"] = deadline
        self.kube.create(JOBS, job, self.namespace)
        return name

    def result(self, name: str, timeout: float = RUN_TIMEOUT) -> tuple[RunResult, dict[str, Any]]:
        found: list[dict[str, Any]] = []

        def written() -> bool:
            config_map = self.kube.get_or_none(CONFIGMAPS, name, self.namespace)
            found[:] = [config_map] if config_map else []
            return config_map is not None

        wait_until(written, timeout=timeout, what=f"result ConfigMap {name}\n{self.log(name)}")
        config_map = found[0]
        return RunResult.model_validate_json(config_map["data"][RESULT_KEY]), config_map

    def run(self, snapshot: dict[str, Any], **job: Any) -> tuple[RunResult, dict[str, Any]]:
        return self.result(self.start(snapshot, **job))

    def pod(self, job_name: str) -> dict[str, Any] | None:
        pods, _ = self.kube.list_objects(
            PODS, self.namespace, label_selector=f"job-name={job_name}"
        )
        return pods[0] if pods else None

    def process_id(self, job_name: str) -> int:
        """The runner process of a Job's pod (the node agent runs it on this machine)."""
        marks = (f'"jobName": "{job_name}"'.encode(), self.namespace.encode())
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"pkobatch.main\0job\0run" in cmdline and all(m in cmdline for m in marks):
                return int(proc.name)
        raise AssertionError(f"no runner process for Job {job_name}")

    def log(self, job_name: str) -> str:
        return "\n".join(
            path.read_text(errors="replace")
            for path in sorted((self.cluster.log_dir / self.namespace).glob(f"{job_name}-*.log"))
        )

    def job_finished(self, name: str) -> str:
        found: list[str] = []

        def finished() -> bool:
            job = self.kube.get(JOBS, name, self.namespace)
            for condition in (job.get("status") or {}).get("conditions") or []:
                if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
                    found.append(condition["type"])
                    return True
            return False

        wait_until(finished, timeout=RUN_TIMEOUT, what=f"Job {name} to finish")
        return found[0]


@pytest.fixture
def runner(
    cluster: Any, namespace: str, pulumi_env: Any, git_server: Any, tmp_path: Path
) -> Runner:
    kube: Kube = cluster.kube
    with contextlib.suppress(AlreadyExists):
        kube.create(CLUSTERROLES, yaml.safe_load(RUNNER_ROLE.read_text()))
    kube.create(ROLEBINDINGS, yaml.safe_load(RUNNER_BINDING.read_text()), namespace)
    secrets = {
        "pulumi": {"passphrase": pulumi_env.passphrase},
        "git": {"username": git_server.username, "password": git_server.password},
        "app": {"token": plant("app-token"), "env-secret": plant("app-env-secret")},
    }
    for name, data in secrets.items():
        kube.create(
            SECRETS,
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data},
            namespace,
        )
    runner = Runner(cluster, namespace, pulumi_env, tmp_path)
    runner.app_secrets = secrets["app"]
    return runner


def test_lifecycle_as_a_job_under_the_runner_role(
    runner: Runner, git_repo: Callable[..., Any], pulumi_env: Any
) -> None:
    repo = git_repo()
    files = pulumi_env.files_dir

    name = runner.start(runner.snapshot("up", repo))
    result, config_map = runner.result(name)
    assert result.state == "succeeded", result.message + runner.log(name)
    assert result.changes == {"create": 3}
    assert result.commit == repo.commit
    assert result.outputs["token"] == "[secret]"
    assert result.outputs["paths"] == [str(files / "file-0.txt"), str(files / "file-1.txt")]
    assert (files / "file-0.txt").read_text() == "hello 0"
    job = runner.kube.get(JOBS, name, runner.namespace)
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert config_map["metadata"]["labels"] == {
        MANAGED_BY_LABEL: "pkobatch",
        STACK_LABEL: "files",
        OPERATION_LABEL: "up",
        RESULT_LABEL: "succeeded",
    }
    assert runner.job_finished(name) == "Complete"
    # Immutable, and vouched for by the pod: its termination message is the digest of exactly
    # what the ConfigMap holds.
    assert config_map["immutable"] is True
    pod = runner.pod(name)
    assert pod is not None
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["message"] == result_digest_line(config_map["data"][RESULT_KEY])

    again, _ = runner.run(runner.snapshot("up", repo))
    assert (again.state, again.changes) == ("succeeded", {"same": 3})
    preview, _ = runner.run(runner.snapshot("preview", repo))
    assert (preview.state, preview.changes) == ("succeeded", {"same": 3})

    (files / "file-0.txt").write_text("changed behind Pulumi's back")
    drift, _ = runner.run(runner.snapshot("refresh", repo, driftCheck=True))
    assert (drift.state, drift.drift_check, drift.drifted_resources) == ("succeeded", True, 1)
    assert (files / "file-0.txt").read_text() == "changed behind Pulumi's back"
    refreshed, _ = runner.run(runner.snapshot("refresh", repo))
    assert refreshed.state == "succeeded", refreshed.message
    assert (refreshed.drifted_resources, refreshed.changes.get("update")) == (1, 1)

    destroyed, _ = runner.run(runner.snapshot("destroy", repo))
    assert (destroyed.state, destroyed.changes) == ("succeeded", {"delete": 3})
    assert list(files.iterdir()) == []

    recreated, _ = runner.run(runner.snapshot("up", repo))
    assert recreated.changes == {"create": 3}
    shutil.rmtree(repo.bare)
    name = runner.start(runner.snapshot("destroy", repo))
    from_state, _ = runner.result(name)
    assert (from_state.state, from_state.changes) == ("succeeded", {"delete": 3}), (
        from_state.message
    )
    assert "destroyed from the stack's state" in from_state.message
    assert list(files.iterdir()) == []
    assert runner.job_finished(name) == "Complete"


LEAKY_PROGRAM = """
import os
print("the program sees", os.environ["APP_SECRET"])
pulumi.log.info("diagnostic with " + os.environ["APP_SECRET"])
pulumi.export("leaked", os.environ["APP_SECRET"])
runner_only = ("GIT_PASSWORD", "PKOBATCH_CONFIG_TOKEN")
pulumi.export("runner_only_visible", [n for n in runner_only if n in os.environ])
if config.get_bool("fail"):
    raise RuntimeError("failing while holding " + os.environ["APP_SECRET"])
"""


def test_sentinel_secrets_never_leak(
    runner: Runner, git_repo: Callable[..., Any], cluster: Any
) -> None:
    sentinels = [*runner.app_secrets.values(), runner.pulumi_env.passphrase]
    repo = git_repo()
    main = (repo.worktree / "__main__.py").read_text()
    repo.update({"__main__.py": main + LEAKY_PROGRAM}, "a program that leaks")

    ok, _ = runner.run(runner.snapshot("up", repo))
    assert ok.state == "succeeded", ok.message
    assert ok.outputs["leaked"] == "[secret]"
    assert ok.outputs["token"] == "[secret]"
    assert ok.outputs["runner_only_visible"] == []  # git credentials, config values
    failed, _ = runner.run(
        runner.snapshot(
            "up",
            repo,
            spec={"config": {"directory": str(runner.pulumi_env.files_dir), "fail": "true"}},
        )
    )
    assert failed.reason == "ProgramError"
    assert "failing while holding [secret]" in failed.message

    logs = "\n".join(
        p.read_text(errors="replace") for p in (cluster.log_dir / runner.namespace).glob("*.log")
    )
    assert "the program sees [secret]" in logs and "diagnostic with [secret]" in logs
    config_maps, _ = runner.kube.list_objects(CONFIGMAPS, runner.namespace)
    jobs, _ = runner.kube.list_objects(JOBS, runner.namespace)
    pods, _ = runner.kube.list_objects(PODS, runner.namespace)
    events, _ = runner.kube.list_objects(CORE_EVENTS, runner.namespace)
    places = {
        "pod logs": logs,
        "config maps": json.dumps(config_maps),
        "jobs": json.dumps(jobs),
        "pods": json.dumps(pods),
        "events": json.dumps(events),
        "failure message": failed.message,
    }
    for sentinel in sentinels:
        assert [where for where, text in places.items() if sentinel in text] == []


def test_sigterm_during_a_long_up_cancels_within_the_grace_period(
    runner: Runner, git_repo: Callable[..., Any], pulumi_env: Any
) -> None:
    repo = git_repo()
    config = {"directory": str(pulumi_env.files_dir), "files": "1", "sleepSeconds": "600"}
    grace = 20
    name = runner.start(runner.snapshot("up", repo, spec={"config": config}), grace=grace)
    wait_until(
        lambda: "creating" in runner.log(name) and "file-0" in runner.log(name),
        timeout=RUN_TIMEOUT,
        what="the up to start creating the sleeping resource",
    )
    # What the kubelet does when the pod is deleted or evicted. (Deleting the pod itself does
    # not work with the node agent: its pods are never bound to a node, so the API server
    # removes them at once, and with them the pod-bound token the result is written with.)
    pid = runner.process_id(name)
    signalled_at = time.monotonic()
    os.kill(pid, signal.SIGTERM)

    result, _ = runner.result(name, timeout=grace + 30)
    written_after = time.monotonic() - signalled_at
    assert result.reason == "Cancelled", result.message + runner.log(name)
    assert "state saved, lock released" in result.message
    assert written_after < grace, f"result written {written_after:.1f}s after SIGTERM"
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=grace, what="the runner's exit")
    assert runner.job_finished(name) == "Failed"

    config["sleepSeconds"] = "0"
    after, _ = runner.run(runner.snapshot("up", repo, spec={"config": config}))
    assert after.state == "succeeded", after.message
    assert (pulumi_env.files_dir / "file-0.txt").read_text() == "hello 0"


def test_a_run_past_its_deadline_is_deadline_exceeded(
    runner: Runner, git_repo: Callable[..., Any], pulumi_env: Any
) -> None:
    repo = git_repo()
    config = {"directory": str(pulumi_env.files_dir), "files": "1", "sleepSeconds": "600"}
    deadline, grace = 45, 15
    name = runner.start(
        runner.snapshot("up", repo, spec={"config": config}), grace=grace, deadline=deadline
    )

    result, _ = runner.result(name, timeout=deadline + 30)

    assert result.reason == "DeadlineExceeded", result.message + runner.log(name)
    assert "activeDeadlineSeconds" in result.message
    assert "state saved, lock released" in result.message
    assert result.end_time is not None and result.start_time is not None
    assert (result.end_time - result.start_time).total_seconds() < deadline
