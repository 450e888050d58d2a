"""Checking out a Stack's git source with the real ``git`` CLI, without leaking credentials.

Credentials never go into a URL, a command line, a log or an error message:

- HTTPS (basic auth or a token): ``GIT_ASKPASS`` points at a small script in the run's private
  (0700) temp dir. The script holds no secret: it prints ``$PKOBATCH_ASKPASS_USERNAME`` or
  ``$PKOBATCH_ASKPASS_PASSWORD``, which exist only in the environment of the ``git`` process. A
  token is sent as the password of user ``git`` (PKO's convention), which GitHub, GitLab and
  Bitbucket accept.
- SSH: the private key is written to a 0600 file in the private temp dir (ssh reads keys
  only from files); a passphrase goes through ``SSH_ASKPASS`` the same way. Host keys are
  checked strictly against ``$GIT_SSH_KNOWN_HOSTS`` (known_hosts content) or the system's
  known_hosts; ``PKOBATCH_GIT_SSH_INSECURE_IGNORE_HOST_KEY=true`` turns checking off.
- All ``git`` output is passed through the run's ``Redactor`` before anyone sees it.
- Credentials never go over plain ``http://`` unless the snapshot's
  ``insecureHttpGitHosts`` (the operator's ``PKOBATCH_INSECURE_HTTP_GIT_HOSTS``) names the
  host: the same rule as the controller's branch poller (``pkobatch.api.git_transport``).

The fetch is ``git init`` + ``git fetch`` of exactly what the run needs (``--depth 1`` when
``shallow``), then a detached checkout; the SHA that ran is read back with ``rev-parse``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pkobatch.api.git_transport import (
    credentials_allowed,
    has_url_credentials,
    refusal_message,
    refused_credentials,
)
from pkobatch.api.messages import bound_message
from pkobatch.api.run import GitAuthEnv
from pkobatch.api.stack.spec import GitAuthConfig, ResourceRef
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.redact import Redactor, scrub_url_credentials

KNOWN_HOSTS_ENV: Final = "GIT_SSH_KNOWN_HOSTS"
INSECURE_HOST_KEY_ENV: Final = "PKOBATCH_GIT_SSH_INSECURE_IGNORE_HOST_KEY"
GIT_TIMEOUT_SECONDS: Final = 600.0
TOKEN_USERNAME: Final = "git"
# Where the fetched commit is kept (a private ref, so no branch is checked out).
RUN_REF: Final = "refs/pkobatch/run"

ASKPASS_SCRIPT: Final = """#!/bin/sh
case "$1" in
  [Uu]sername*) printf '%s\\n' "$PKOBATCH_ASKPASS_USERNAME" ;;
  *) printf '%s\\n' "$PKOBATCH_ASKPASS_PASSWORD" ;;
esac
"""
SSH_ASKPASS_SCRIPT: Final = """#!/bin/sh
printf '%s\\n' "$PKOBATCH_ASKPASS_PASSPHRASE"
"""


@dataclass(frozen=True)
class GitHubApp:
    """``gitAuth.githubApp``: exchanged for an installation token before the fetch."""

    app_id: str
    installation_id: str
    private_key: str = field(repr=False)


@dataclass(frozen=True)
class GitCredentials:
    username: str = ""
    password: str = field(default="", repr=False)
    ssh_private_key: str = field(default="", repr=False)
    ssh_passphrase: str = field(default="", repr=False)
    github_app: GitHubApp | None = None

    def secrets(self) -> list[str]:
        app_key = self.github_app.private_key if self.github_app else ""
        return [self.password, self.ssh_private_key, self.ssh_passphrase, app_key]

    def for_url(self, url: str, redactor: Redactor) -> GitCredentials:
        """Credentials ready for git: a GitHub App's are exchanged for an installation token
        (added to ``redactor`` before anything can print it)."""
        app = self.github_app
        if app is None:
            return self
        # cryptography is slow to import: only runs that use a GitHub App pay for it.
        from pkobatch.github_app import TOKEN_USERNAME, GitHubAppError, installation_token

        try:
            token = installation_token(url, app.app_id, app.installation_id, app.private_key)
        except GitHubAppError as exc:
            raise RunFailure(
                "SourceUnavailable", redactor.scrub(str(exc)), "gitAuthentication"
            ) from None
        redactor.add(token)
        return GitCredentials(username=TOKEN_USERNAME, password=token)


def _literal(ref: ResourceRef | None, path: str) -> str:
    if ref is None:
        return ""
    if ref.type == "Literal" and ref.literal is not None:
        return ref.literal.value
    raise RunFailure(
        "InvalidSpec",
        f"{path}: a {ref.type} ref has no value in the run's environment (snapshot.gitAuth "
        "names none); recreate the run",
    )


def resolve_git_credentials(
    auth_env: GitAuthEnv | None, spec_auth: GitAuthConfig | None, env: Mapping[str, str]
) -> GitCredentials | None:
    """The credentials for the fetch: from the variables ``snapshot.gitAuth`` names, else
    from ``Literal`` refs in ``spec.gitAuth``; None when there are none.

    The variables come from optional Secret keys, so any of them may be unset; as in PKO, an
    SSH key wins over a token, which wins over a user name and password (the deprecated
    ``gitAuthSecret`` names all of them and lets the Secret's keys decide).
    """
    if auth_env is not None:

        def value(name: str | None) -> str:
            return env.get(name, "") if name else ""

        key, token = value(auth_env.ssh_private_key_env), value(auth_env.token_env)
        username, password = value(auth_env.username_env), value(auth_env.password_env)
        app_id = value(auth_env.github_app_id_env)
        if app_id or value(auth_env.github_app_private_key_env):
            return GitCredentials(
                github_app=GitHubApp(
                    app_id=app_id,
                    installation_id=value(auth_env.github_app_installation_id_env),
                    private_key=value(auth_env.github_app_private_key_env),
                )
            )
        if key:
            return GitCredentials(
                ssh_private_key=key, ssh_passphrase=value(auth_env.ssh_passphrase_env)
            )
        if token:
            return GitCredentials(username=username or TOKEN_USERNAME, password=token)
        if username or password:
            return GitCredentials(username=username, password=password)
        return None
    if spec_auth is None:
        return None
    if spec_auth.ssh_auth is not None:
        return GitCredentials(
            ssh_private_key=_literal(
                spec_auth.ssh_auth.ssh_private_key, "spec.gitAuth.sshAuth.sshPrivateKey"
            ),
            ssh_passphrase=_literal(spec_auth.ssh_auth.password, "spec.gitAuth.sshAuth.password"),
        )
    if spec_auth.access_token is not None:
        return GitCredentials(
            username=TOKEN_USERNAME,
            password=_literal(spec_auth.access_token, "spec.gitAuth.accessToken"),
        )
    if spec_auth.basic_auth is not None:
        return GitCredentials(
            username=_literal(spec_auth.basic_auth.user_name, "spec.gitAuth.basicAuth.userName"),
            password=_literal(spec_auth.basic_auth.password, "spec.gitAuth.basicAuth.password"),
        )
    if spec_auth.github_app is not None:
        app = spec_auth.github_app
        return GitCredentials(
            github_app=GitHubApp(
                app_id=_literal(app.app_id, "spec.gitAuth.githubApp.appID"),
                installation_id=_literal(
                    app.installation_id, "spec.gitAuth.githubApp.installationID"
                ),
                private_key=_literal(app.private_key, "spec.gitAuth.githubApp.privateKey"),
            )
        )
    return None


def check_transport(
    url: str, credentials: GitCredentials | None, allowed_hosts: Sequence[str]
) -> None:
    """Refuse to send credentials to a plain ``http://`` host the operator did not allow."""
    if credentials_allowed(url, allowed_hosts):
        return
    if has_url_credentials(url):
        what = "the user name and password in spec.projectRepo"
    elif credentials is not None and (
        credentials.username or credentials.password or credentials.github_app
    ):
        what = "the git credentials of spec.gitAuth"
    else:
        return
    raise RunFailure("InvalidSpec", refusal_message(url, what))


def is_ssh_url(url: str) -> bool:
    """``ssh://...`` or scp-like ``user@host:path``."""
    if url.startswith("ssh://"):
        return True
    return "://" not in url and ":" in url.split("/", 1)[0]


def ssh_command(
    *, key_file: str | None, known_hosts_file: str | None, insecure: bool, passphrase: bool
) -> str:
    """The ``GIT_SSH_COMMAND`` for a fetch (no agent, no user config, strict host keys)."""
    args = ["ssh", "-F", "/dev/null", "-o", "IdentitiesOnly=yes"]
    if key_file:
        args += ["-i", key_file]
    if insecure:
        args += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    else:
        args += ["-o", "StrictHostKeyChecking=yes"]
        if known_hosts_file:
            args += ["-o", f"UserKnownHostsFile={known_hosts_file}"]
    if not passphrase:
        args += ["-o", "BatchMode=yes"]
    return shlex.join(args)


def _write_private(path: Path, content: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(content)


def git_environment(
    base_env: Mapping[str, str],
    credentials: GitCredentials | None,
    url: str,
    private_dir: Path,
) -> dict[str, str]:
    """The environment of every ``git`` call; writes helper files into ``private_dir``."""
    env = dict(base_env)
    env.update(
        {
            "GIT_TERMINAL_PROMPT": "0",
            # Without credentials, fail at once instead of asking anyone.
            "GIT_ASKPASS": "/bin/false",
        }
    )
    for name in (
        "PKOBATCH_ASKPASS_USERNAME",
        "PKOBATCH_ASKPASS_PASSWORD",
        "PKOBATCH_ASKPASS_PASSPHRASE",
    ):
        env.pop(name, None)
    creds = credentials or GitCredentials()
    if creds.username or creds.password:
        askpass = private_dir / "git-askpass.sh"
        _write_private(askpass, ASKPASS_SCRIPT, 0o700)
        env["GIT_ASKPASS"] = str(askpass)
        env["PKOBATCH_ASKPASS_USERNAME"] = creds.username
        env["PKOBATCH_ASKPASS_PASSWORD"] = creds.password
    if is_ssh_url(url):
        key_file = None
        if creds.ssh_private_key:
            key_path = private_dir / "ssh-key"
            key = creds.ssh_private_key.replace("\r\n", "\n").strip() + "\n"
            _write_private(key_path, key, 0o600)
            key_file = str(key_path)
        known_hosts_file = None
        if base_env.get(KNOWN_HOSTS_ENV):
            known_hosts_path = private_dir / "known_hosts"
            _write_private(known_hosts_path, base_env[KNOWN_HOSTS_ENV].strip() + "\n", 0o600)
            known_hosts_file = str(known_hosts_path)
        if creds.ssh_passphrase:
            ssh_askpass = private_dir / "ssh-askpass.sh"
            _write_private(ssh_askpass, SSH_ASKPASS_SCRIPT, 0o700)
            env.update(
                {
                    "SSH_ASKPASS": str(ssh_askpass),
                    "SSH_ASKPASS_REQUIRE": "force",
                    "DISPLAY": env.get("DISPLAY", ":0"),
                    "PKOBATCH_ASKPASS_PASSPHRASE": creds.ssh_passphrase,
                }
            )
        env["GIT_SSH_COMMAND"] = ssh_command(
            key_file=key_file,
            known_hosts_file=known_hosts_file,
            insecure=base_env.get(INSECURE_HOST_KEY_ENV, "").lower() in ("1", "true", "yes"),
            passphrase=bool(creds.ssh_passphrase),
        )
    return env


@dataclass(frozen=True)
class GitSource:
    url: str
    branch: str = ""  # a branch or any ref; "" = the remote's HEAD
    commit: str = ""  # a commit to check out; wins over branch
    shallow: bool = False

    def describe(self) -> str:
        what = self.commit or self.branch or "HEAD"
        return f"{scrub_url_credentials(self.url)} at {what}"


def fetch_plan(source: GitSource) -> list[list[str]]:
    """The ``git fetch`` attempts, first to last (a later one runs when the previous fails).

    A commit is fetched directly (servers that allow fetching by SHA, like GitHub, need only
    the one commit); if that is refused — or the commit is abbreviated — its branch (or every
    branch) is fetched in full and the commit found there.
    """
    depth = ["--depth", "1"] if source.shallow else []
    fetch = ["fetch", "--no-tags", "--no-write-fetch-head"]
    if not source.commit:
        return [[*fetch, *depth, "origin", f"+{source.branch or 'HEAD'}:{RUN_REF}"]]
    full = f"+{source.branch}:{RUN_REF}" if source.branch else "+refs/heads/*:refs/remotes/origin/*"
    return [[*fetch, *depth, "origin", f"+{source.commit}:{RUN_REF}"], [*fetch, "origin", full]]


Runner = Callable[[list[str], Mapping[str, str], Path], "subprocess.CompletedProcess[str]"]
"""Runs one command (argv, environment, working directory), e.g. ``Cancellation.run``."""


def git_argv(args: list[str]) -> list[str]:
    # An empty credential.helper list: no helper may store the credentials anywhere. No
    # automatic maintenance after the fetch: the checkout lives for one run.
    return ["git", "-c", "credential.helper=", "-c", "maintenance.auto=false", *args]


def checkout(
    source: GitSource,
    dest: Path,
    env: Mapping[str, str],
    redactor: Redactor,
    run: Runner,
) -> str:
    """Check ``source`` out into ``dest`` (created empty); returns the SHA checked out."""

    def git(args: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return run(git_argv(args), env, dest)
        except subprocess.TimeoutExpired:
            raise RunFailure(
                "SourceUnavailable",
                f"git {args[0]} of {source.describe()} timed out after {GIT_TIMEOUT_SECONDS:.0f}s",
            ) from None

    def failed(step: str, done: subprocess.CompletedProcess[str]) -> RunFailure:
        output = redactor.scrub((done.stderr or done.stdout or "").strip())
        return RunFailure(
            "SourceUnavailable",
            bound_message(f"git {step} of {source.describe()} failed: {output}"),
            "gitAuthentication" if refused_credentials(output) else None,
        )

    dest.mkdir(parents=True, exist_ok=True)
    for args in (["init", "--quiet"], ["remote", "add", "origin", source.url]):
        done = git(args)
        if done.returncode != 0:
            raise failed(args[0], done)
    attempts = fetch_plan(source)
    for index, args in enumerate(attempts):
        done = git(args)
        if done.returncode == 0:
            break
        if index == len(attempts) - 1:
            raise failed("fetch", done)
    target = source.commit or RUN_REF
    done = git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", target])
    if done.returncode != 0:
        raise failed("checkout", done)
    done = git(["rev-parse", "HEAD"])
    if done.returncode != 0:
        raise failed("rev-parse", done)
    return done.stdout.strip()
