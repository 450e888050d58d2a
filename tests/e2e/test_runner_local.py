"""The runner as a local process (`pkobatch run -f stack.yaml -o json`), with the real Pulumi
CLI and real git repositories served over HTTP with authentication on loopback.

Every run is a separate `python -m pkobatch.main run` process, exactly as a user runs it;
its stdout is the RunResult JSON and its stderr the run's log.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.stale_lock import leave_stale_lock, lock_directory_files

from pkobatch.api.run import MAX_RESULT_BYTES, MAX_RESULT_OUTPUTS, RunResult
from pkobatch.dev.processes import wait_until
from pkobatch.runner.embedded import fallback_env_name

RUN_TIMEOUT = 300


class Runs:
    """Writes Stack manifests and runs them with `pkobatch run`."""

    def __init__(self, tmp_path: Path, env: dict[str, str], files_dir: Path) -> None:
        self.tmp_path = tmp_path
        self.env = env
        self.files_dir = files_dir
        self.count = 0

    def manifest(self, repo_url: str, **spec: Any) -> Path:
        self.count += 1
        config = {"directory": str(self.files_dir), **spec.pop("config", {})}
        body = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "files", "namespace": "e2e"},
            "spec": {"stack": "dev", "projectRepo": repo_url, "branch": "main", **spec},
        }
        body["spec"]["config"] = config
        path = self.tmp_path / f"stack-{self.count}.yaml"
        path.write_text(yaml.safe_dump(body))
        return path

    def start(
        self, manifest: Path, *args: str, secrets: Mapping[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """``secrets`` ("NAME/KEY" -> value) go through the environment, as a user keeps
        them out of the process list (``--secret`` in ``args`` puts them in it)."""
        env = dict(self.env)
        for ref, value in (secrets or {}).items():
            name, _, key = ref.partition("/")
            env[fallback_env_name("PKOBATCH_SECRET", name, key)] = value
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pkobatch.main",
                "run",
                "-f",
                str(manifest),
                "-o",
                "json",
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> tuple[RunResult, str, int]:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT)
        assert stdout.strip(), f"no result on stdout; log:\n{stderr}"
        return RunResult.model_validate_json(stdout), stderr, process.returncode

    def run(
        self, manifest: Path, *args: str, secrets: Mapping[str, str] | None = None
    ) -> tuple[RunResult, str, int]:
        return self.finish(self.start(manifest, *args, secrets=secrets))


@pytest.fixture
def runs(pulumi_env: Any, tmp_path: Path) -> Runs:
    env = {
        **pulumi_env.env,
        "HOME": str(tmp_path / "home"),
        "PKOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
        # The tests' git server is plain http on loopback: opt in, as an operator would.
        "PKOBATCH_INSECURE_HTTP_GIT_HOSTS": "127.0.0.1",
    }
    return Runs(tmp_path, env, pulumi_env.files_dir)


def basic_auth(server: Any) -> dict[str, Any]:
    return {
        "gitAuth": {
            "basicAuth": {
                "userName": {"type": "Literal", "literal": {"value": server.username}},
                "password": {"type": "Secret", "secret": {"name": "git", "key": "password"}},
            }
        }
    }


def test_up_over_http_basic_auth_then_no_changes(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo()
    manifest = runs.manifest(
        repo.http_url,
        **basic_auth(git_server),
        secretsRef={"token": {"type": "Secret", "secret": {"name": "app", "key": "token"}}},
    )
    flags = ["--secret", "app/token=tok-e2e-1"]
    password = {"git/password": git_server.password}

    result, log, code = runs.run(manifest, *flags, secrets=password)

    assert (code, result.state, result.reason) == (0, "succeeded", "Succeeded"), result.message
    assert result.commit == repo.commit
    assert result.changes == {"create": 3}
    assert result.outputs["token"] == "[secret]"
    assert result.secret_outputs == ["token"]
    assert result.outputs["paths"] == [str(runs.files_dir / f"file-{i}.txt") for i in range(2)]
    assert (runs.files_dir / "file-1.txt").read_text() == "hello 1"
    assert result.project_info is not None and result.project_info.runtime == "python"
    assert result.pulumi_version == "3.259.0"
    assert "tok-e2e-1" not in log and git_server.password not in log

    again, _, code = runs.run(manifest, *flags, secrets=password)
    assert (code, again.changes) == (0, {"same": 3})


def test_export_outputs_without_a_cluster_is_skipped_with_a_note(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo()
    manifest = runs.manifest(
        repo.http_url,
        **basic_auth(git_server),
        exportOutputs={"configMap": {"name": "out"}, "secret": {"name": "out-secret"}},
    )
    result, log, code = runs.run(manifest, secrets={"git/password": git_server.password})
    assert (code, result.state) == (0, "succeeded"), result.message
    note = "spec.exportOutputs skipped: `pkobatch run` has no cluster"
    assert note in log and note in result.message
    assert result.outputs["token"] == "[secret]"


def test_up_over_http_with_a_token(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo()
    manifest = runs.manifest(
        repo.http_url,
        gitAuth={"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}},
        config={"files": "1"},
    )

    result, log, code = runs.run(manifest, secrets={"git/token": git_server.token})

    assert (code, result.reason) == (0, "Succeeded"), result.message
    assert result.commit == repo.commit
    assert git_server.token not in log


def test_a_wrong_password_or_token_is_source_unavailable_and_never_shown(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo()
    wrong = "wrong-password-5ec7e7"
    basic = runs.manifest(repo.http_url, **basic_auth(git_server))
    result, log, code = runs.run(basic, "--secret", f"git/password={wrong}")
    assert (code, result.reason) == (1, "SourceUnavailable")
    assert "git fetch" in result.message
    for text in (result.to_json(), log):
        assert wrong not in text and git_server.password not in text

    wrong_token = "wrong-token-0badc0de"
    token = runs.manifest(
        repo.http_url,
        gitAuth={"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}},
    )
    result, log, code = runs.run(token, "--secret", f"git/token={wrong_token}")
    assert (code, result.reason) == (1, "SourceUnavailable")
    for text in (result.to_json(), log):
        assert wrong_token not in text and git_server.token not in text


def test_a_syntax_error_is_a_program_error_quoting_python(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo("syntax-error")
    manifest = runs.manifest(repo.http_url, **basic_auth(git_server))

    result, _, code = runs.run(manifest, secrets={"git/password": git_server.password})

    assert (code, result.reason) == (1, "ProgramError")
    assert "SyntaxError: invalid syntax" in result.message
    assert 'File "__main__.py", line 4' in result.message


def test_a_missing_stack_with_use_local_stack_only_is_stack_not_found(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo()
    manifest = runs.manifest(repo.http_url, **basic_auth(git_server), useLocalStackOnly=True)

    result, _, code = runs.run(manifest, secrets={"git/password": git_server.password})

    assert (code, result.reason) == (1, "StackNotFound")
    assert "useLocalStackOnly" in result.message


def test_two_concurrent_ups_one_succeeds_one_conflicts(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any, pulumi_env: Any
) -> None:
    repo = git_repo()
    password = {"git/password": git_server.password}
    release = runs.tmp_path / "release-the-first-up"
    held = runs.manifest(
        repo.http_url, **basic_auth(git_server), config={"holdUntil": str(release)}
    )
    first = runs.start(held, secrets=password)
    locks = Path(pulumi_env.backend_url.removeprefix("file://")) / ".pulumi" / "locks"

    def first_holds_the_lock() -> bool:
        assert first.poll() is None, "the first up ended before taking the stack lock"
        return any(p.is_file() for p in locks.rglob("*.json"))

    # The first up holds the lock until the second has ended, however long that takes.
    try:
        wait_until(first_holds_the_lock, timeout=300, what="the first up to take the stack lock")
        unheld = runs.manifest(repo.http_url, **basic_auth(git_server))
        second, _, second_code = runs.run(unheld, secrets=password)
    finally:
        release.touch()
    first_result, _, first_code = runs.finish(first)

    assert (first_code, first_result.reason) == (0, "Succeeded"), first_result.message
    assert (second_code, second.reason) == (1, "UpdateConflict")
    assert "locked" in second.message


def test_5000_outputs_give_a_bounded_truncated_result(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any
) -> None:
    repo = git_repo("many-outputs")
    manifest = runs.manifest(
        repo.http_url, **basic_auth(git_server), config={"outputCount": "5000"}
    )

    result, _, code = runs.run(manifest, secrets={"git/password": git_server.password})

    assert (code, result.reason) == (0, "Succeeded"), result.message
    assert result.truncated
    assert len(result.to_json().encode()) <= MAX_RESULT_BYTES
    assert len(result.outputs) == MAX_RESULT_OUTPUTS
    assert "of 5004 outputs" in result.message


def test_yaml_and_python_programs_run_without_a_cluster(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any, yaml_host: Path
) -> None:
    secret = {"git/password": git_server.password}
    yaml_program = runs.manifest(
        git_repo("yaml").http_url, **basic_auth(git_server), config={"greeting": "hi"}
    )
    python_program = runs.manifest(git_repo("files").http_url, **basic_auth(git_server))

    yaml_result, _, yaml_code = runs.run(yaml_program, secrets=secret)
    python_result, _, python_code = runs.run(python_program, secrets=secret)

    assert (yaml_code, yaml_result.reason) == (0, "Succeeded"), yaml_result.message
    assert yaml_result.project_info is not None and yaml_result.project_info.runtime == "yaml"
    assert yaml_result.outputs == {
        "message": "hi from YAML",
        "count": 2,
        "greetings": ["hi 1", "hi 2"],
        "token": "[secret]",
    }
    assert yaml_result.secret_outputs == ["token"]
    assert (python_code, python_result.reason) == (0, "Succeeded"), python_result.message
    assert python_result.changes == {"create": 3}


def test_unlock_removes_the_lock_a_killed_up_left(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any, pulumi_env: Any
) -> None:
    repo = git_repo()
    password = {"git/password": git_server.password}
    release = runs.tmp_path / "release-the-killed-up"
    held = runs.manifest(
        repo.http_url, **basic_auth(git_server), config={"holdUntil": str(release)}
    )
    env = {**runs.env, fallback_env_name("PKOBATCH_SECRET", "git", "password"): git_server.password}
    try:
        lock = leave_stale_lock(held, env, pulumi_env.backend_url)
        unheld = runs.manifest(repo.http_url, **basic_auth(git_server))

        refused, _, refused_code = runs.run(unheld, secrets=password)
        unlocked, log, unlocked_code = runs.run(unheld, "--op", "unlock", secrets=password)
        after_unlock = lock_directory_files(pulumi_env.backend_url)
        updated, _, updated_code = runs.run(unheld, secrets=password)
    finally:
        release.touch()  # ends any process of the killed update that outlived it

    # Nothing tells a dead holder from a live one: the next up refuses to touch the lock.
    assert (refused_code, refused.reason) == (1, "UpdateConflict")
    assert "locked" in refused.message and lock.name in refused.message
    assert (unlocked_code, unlocked.reason) == (0, "Succeeded"), unlocked.message
    assert unlocked.operation == "unlock" and unlocked.message.startswith("stack dev unlocked")
    assert "releasing the lock of stack dev (pulumi cancel)" in log
    assert after_unlock == []  # the lock and its .attrs companion
    assert (updated_code, updated.reason) == (0, "Succeeded"), updated.message


def test_unlock_of_a_stack_that_does_not_exist_creates_none(
    runs: Runs, git_repo: Callable[..., Any], git_server: Any, pulumi_env: Any
) -> None:
    repo = git_repo()
    manifest = runs.manifest(repo.http_url, **basic_auth(git_server))
    backend = Path(pulumi_env.backend_url.removeprefix("file://"))

    unlocked, _, code = runs.run(
        manifest, "--op", "unlock", secrets={"git/password": git_server.password}
    )

    assert (code, unlocked.reason) == (1, "StackNotFound")
    assert "stack dev does not exist in the backend and an unlock never creates it" in (
        unlocked.message
    )
    assert [p for p in backend.rglob("*") if p.is_file() and "stacks" in p.parts] == []
