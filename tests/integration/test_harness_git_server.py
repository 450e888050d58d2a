"""The test harness's git server (tests/fixture_plugins/git.py), which the git and controller
tests rely on: it serves clones only with its credentials or its token."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest


def git_env(user: str | None = None, password: str = "") -> dict[str, str]:
    """git's environment, sending ``user``'s credentials as a header: in a URL they would be
    on git's command line, which the sentinel scan reads."""
    env = {"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"}
    if user is not None:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        env |= {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        }
    return env


def test_git_server_serves_with_basic_auth(git_repo: Any, git_server: Any, tmp_path: Path) -> None:
    repo = git_repo()
    env = git_env(git_server.username, git_server.password)

    clone = subprocess.run(
        ["git", "clone", "-q", repo.http_url, str(tmp_path / "c")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert clone.returncode == 0, clone.stderr
    head = subprocess.run(
        ["git", "-C", str(tmp_path / "c"), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    assert head.stdout.strip() == repo.commit
    assert (tmp_path / "c" / "Pulumi.yaml").is_file()

    denied = subprocess.run(
        ["git", "clone", "-q", repo.http_url, str(tmp_path / "d")],
        env=git_env(),
        capture_output=True,
        text=True,
    )
    assert denied.returncode != 0
    denied = subprocess.run(
        ["git", "clone", "-q", repo.http_url, str(tmp_path / "e")],
        env=git_env(git_server.username, "wrong"),
        capture_output=True,
        text=True,
    )
    assert denied.returncode != 0

    new_commit = repo.update({"extra.txt": "more"}, "second")
    fetched = subprocess.run(
        ["git", "-C", str(tmp_path / "c"), "pull", "-q"], env=env, capture_output=True, text=True
    )
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "c" / "extra.txt").read_text() == "more"
    assert new_commit != head.stdout.strip()


@pytest.mark.parametrize("user", ["git", "anyone", "pkobatch"])
def test_git_server_accepts_its_token_as_any_users_password(
    git_repo: Any, git_server: Any, tmp_path: Path, user: str
) -> None:
    repo = git_repo()

    def clone(password: str, target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "clone", "-q", repo.http_url, str(tmp_path / target)],
            env=git_env(user, password),
            capture_output=True,
            text=True,
        )

    cloned = clone(git_server.token, "c")
    assert cloned.returncode == 0, cloned.stderr
    assert (tmp_path / "c" / "Pulumi.yaml").is_file()
    assert clone(git_server.token + "x", "d").returncode != 0
    # The password of user "pkobatch" is no token.
    if user != git_server.username:
        assert clone(git_server.password, "e").returncode != 0


def test_file_url_clone(git_repo: Any, tmp_path: Path) -> None:
    repo = git_repo("syntax-error")

    subprocess.run(["git", "clone", "-q", repo.file_url, str(tmp_path / "c")], check=True)

    assert (tmp_path / "c" / "__main__.py").read_text().startswith("# A program")
