"""Git: credentials from the run's environment, helper files, fetch plans, real checkouts.

The checkouts use the real ``git`` CLI on local repositories; HTTP with authentication is
covered end to end in tests/e2e/test_runner_job.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.git_transport import refused_credentials
from pkobatch.api.run import GitAuthEnv
from pkobatch.api.stack.spec import GitAuthConfig
from pkobatch.runner import git
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.redact import Redactor


def run_local(argv: list[str], env: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=dict(env), cwd=cwd, capture_output=True, text=True, check=False)


def make_repo(path: Path) -> tuple[str, str]:
    """A repository with two commits on main; (first sha, second sha)."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }

    def g(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=path, env=env, check=True, capture_output=True, text=True
        ).stdout.strip()

    path.mkdir(parents=True)
    g("init", "-q", "-b", "main")
    (path / "prog").mkdir()
    (path / "prog" / "Pulumi.yaml").write_text("name: p\nruntime: python\n")
    g("add", "-A")
    g("commit", "-q", "-m", "one")
    first = g("rev-parse", "HEAD")
    (path / "prog" / "extra.txt").write_text("2")
    g("add", "-A")
    g("commit", "-q", "-m", "two")
    return first, g("rev-parse", "HEAD")


def test_credentials_come_from_the_named_variables() -> None:
    env = {"U": "alice", "P": "pw-1234", "T": "tok-5678", "K": "KEY", "KP": "phrase"}
    basic = git.resolve_git_credentials(GitAuthEnv(usernameEnv="U", passwordEnv="P"), None, env)
    assert basic == git.GitCredentials(username="alice", password="pw-1234")
    token = git.resolve_git_credentials(GitAuthEnv(tokenEnv="T"), None, env)
    assert token == git.GitCredentials(username="git", password="tok-5678")
    ssh = git.resolve_git_credentials(
        GitAuthEnv(sshPrivateKeyEnv="K", sshPassphraseEnv="KP"), None, env
    )
    assert ssh == git.GitCredentials(ssh_private_key="KEY", ssh_passphrase="phrase")
    assert set(ssh.secrets()) >= {"KEY", "phrase"}


def test_literal_refs_work_without_a_snapshot_mapping_but_secret_refs_do_not() -> None:
    literal = GitAuthConfig.model_validate(
        {"accessToken": {"type": "Literal", "literal": {"value": "lit-token"}}}
    )
    assert git.resolve_git_credentials(None, literal, {}) == git.GitCredentials("git", "lit-token")
    secret = GitAuthConfig.model_validate(
        {"accessToken": {"type": "Secret", "secret": {"name": "s", "key": "t"}}}
    )
    with pytest.raises(RunFailure) as raised:
        git.resolve_git_credentials(None, secret, {})
    assert raised.value.reason == "InvalidSpec"
    assert git.resolve_git_credentials(None, None, {}) is None


def test_unset_variables_mean_no_such_credential() -> None:
    # The Job builder's secretKeyRefs are optional: a key the Secret lacks leaves it unset.
    assert git.resolve_git_credentials(GitAuthEnv(tokenEnv="NOPE"), None, {}) is None


def test_deprecated_git_auth_secret_lets_the_secrets_keys_decide() -> None:
    names = GitAuthEnv(
        sshPrivateKeyEnv="KEY",
        sshPassphraseEnv="PW",
        tokenEnv="TOKEN",
        usernameEnv="USER",
        passwordEnv="PW",
    )
    assert git.resolve_git_credentials(names, None, {"TOKEN": "t0k3n"}) == git.GitCredentials(
        "git", "t0k3n"
    )
    assert git.resolve_git_credentials(names, None, {"USER": "u", "PW": "p4ss"}) == (
        git.GitCredentials("u", "p4ss")
    )
    assert git.resolve_git_credentials(
        names, None, {"KEY": "k", "PW": "phrase", "TOKEN": "t"}
    ) == git.GitCredentials(ssh_private_key="k", ssh_passphrase="phrase")


def test_helper_files_are_private_and_hold_no_secret(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    creds = git.GitCredentials("alice", "pw-s3cr3t", "KEY-MATERIAL-XYZ", "pass-phrase-9")
    env = git.git_environment(
        {"PATH": "/bin", git.KNOWN_HOSTS_ENV: "host ssh-ed25519 AAAA"},
        creds,
        "git@example.com:org/repo.git",
        private,
    )
    askpass = Path(env["GIT_ASKPASS"])
    assert "pw-s3cr3t" not in askpass.read_text()
    assert stat.S_IMODE(askpass.stat().st_mode) == 0o700
    key = private / "ssh-key"
    assert key.read_text() == "KEY-MATERIAL-XYZ\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "pass-phrase-9" not in Path(env["SSH_ASKPASS"]).read_text()
    assert "StrictHostKeyChecking=yes" in env["GIT_SSH_COMMAND"]
    assert f"UserKnownHostsFile={private / 'known_hosts'}" in env["GIT_SSH_COMMAND"]
    for value in (env["GIT_SSH_COMMAND"], env["GIT_ASKPASS"]):
        assert "pw-s3cr3t" not in value and "KEY-MATERIAL" not in value
    answer = subprocess.run(
        [str(askpass), "Password for 'https://alice@host': "],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout == "pw-s3cr3t\n"


def test_host_key_checking_can_be_turned_off(tmp_path: Path) -> None:
    env = git.git_environment(
        {git.INSECURE_HOST_KEY_ENV: "true"}, None, "ssh://git@h/r.git", tmp_path
    )
    assert "StrictHostKeyChecking=no" in env["GIT_SSH_COMMAND"]
    assert "UserKnownHostsFile=/dev/null" in env["GIT_SSH_COMMAND"]


def test_https_without_credentials_never_prompts(tmp_path: Path) -> None:
    env = git.git_environment({"PKOBATCH_ASKPASS_PASSWORD": "stale"}, None, "https://h/r", tmp_path)
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert env["GIT_ASKPASS"] == "/bin/false"
    assert "PKOBATCH_ASKPASS_PASSWORD" not in env
    assert "GIT_SSH_COMMAND" not in env


@pytest.mark.parametrize(
    ("url", "ssh"),
    [
        ("git@github.com:org/repo.git", True),
        ("ssh://git@host:22/repo", True),
        ("https://github.com/org/repo.git", False),
        ("file:///tmp/repo", False),
        ("/srv/repos/r.git", False),
    ],
)
def test_ssh_urls(url: str, ssh: bool) -> None:
    assert git.is_ssh_url(url) is ssh


def test_fetch_plans() -> None:
    branch = git.fetch_plan(git.GitSource("u", branch="main", shallow=True))
    assert branch == [
        [
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "--depth",
            "1",
            "origin",
            f"+main:{git.RUN_REF}",
        ]
    ]
    pinned = git.fetch_plan(git.GitSource("u", commit="abc123"))
    assert pinned[0][-1] == f"+abc123:{git.RUN_REF}"
    assert pinned[1][-1] == "+refs/heads/*:refs/remotes/origin/*"


def test_checkout_of_a_branch_head_and_of_a_pinned_commit(tmp_path: Path) -> None:
    first, second = make_repo(tmp_path / "repo")
    url = (tmp_path / "repo").as_uri()
    redactor = Redactor()
    env = git.git_environment(dict(os.environ), None, url, tmp_path)
    head = git.checkout(
        git.GitSource(url, branch="main", shallow=True), tmp_path / "a", env, redactor, run_local
    )
    assert head == second
    assert (tmp_path / "a" / "prog" / "extra.txt").exists()
    pinned = git.checkout(
        git.GitSource(url, commit=first, shallow=True), tmp_path / "b", env, redactor, run_local
    )
    assert pinned == first
    assert not (tmp_path / "b" / "prog" / "extra.txt").exists()
    short = git.checkout(
        git.GitSource(url, branch="main", commit=first[:10]),
        tmp_path / "c",
        env,
        redactor,
        run_local,
    )
    assert short == first


def test_a_failed_fetch_is_source_unavailable_and_scrubbed(tmp_path: Path) -> None:
    url = "https://user:leaked-pw@127.0.0.1:9/nothing.git"
    redactor = Redactor(["leaked-pw"])
    env = git.git_environment(dict(os.environ), None, url, tmp_path)
    with pytest.raises(RunFailure) as raised:
        git.checkout(git.GitSource(url, branch="main"), tmp_path / "x", env, redactor, run_local)
    assert raised.value.reason == "SourceUnavailable"
    assert "leaked-pw" not in raised.value.message
    assert "git fetch of https://***@127.0.0.1:9/nothing.git at main failed" in raised.value.message
    # Nothing answered: not a refusal of the credentials.
    assert raised.value.step is None


@pytest.mark.parametrize(
    ("output", "refused"),
    [
        ("fatal: Authentication failed for 'http://127.0.0.1:8080/app.git/'", True),
        (
            "fatal: could not read Username for 'https://example.test': terminal prompts disabled",
            True,
        ),
        ("fatal: unable to access 'https://x/': The requested URL returned error: 403", True),
        ("git@127.0.0.1: Permission denied (publickey).\nfatal: Could not read from remote", True),
        ("fatal: unable to access 'https://x/': The requested URL returned error: 404", False),
        ("fatal: unable to access 'http://127.0.0.1:9/': Failed to connect", False),
        ("fatal: couldn't find remote ref refs/heads/nope", False),
    ],
)
def test_refused_credentials_are_told_from_other_fetch_failures(output: str, refused: bool) -> None:
    assert refused_credentials(output) is refused


def test_github_app_variables_become_app_credentials_and_the_key_is_secret() -> None:
    names = GitAuthEnv.model_validate(
        {
            "githubAppIDEnv": "ID",
            "githubAppInstallationIDEnv": "INST",
            "githubAppPrivateKeyEnv": "KEY",
        }
    )
    env = {"ID": "12", "INST": "34", "KEY": "-----BEGIN RSA PRIVATE KEY-----\nabc\n"}
    credentials = git.resolve_git_credentials(names, None, env)
    assert credentials is not None and credentials.github_app is not None
    assert (credentials.github_app.app_id, credentials.github_app.installation_id) == ("12", "34")
    assert env["KEY"] in credentials.secrets()
    assert env["KEY"] not in repr(credentials)
