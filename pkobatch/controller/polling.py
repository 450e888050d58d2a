"""Shared branch polling: one ``git ls-remote`` per repository, branch and credentials.

Every Stack that tracks a branch asks ``GitPoller.head()`` for the branch head during its
reconcile. The answer comes from a cache and never blocks: the first ask for a key (and
each ask after the entry went stale) only wakes the poller's own thread, which runs
``ls-remote`` on a small pool outside the reconcile workers. When the head (or the error)
of a key changes, every Stack subscribed to it is enqueued. So 200 Stacks on one
repository and branch cost one ``ls-remote`` per interval, and a slow git server never
holds a reconcile worker.

The cache key is (repository URL, ref, credentials identity). The identity names where
credentials come from (Secret name and key in the Stack's namespace, or a literal), never
their values; the values are read with one ``get`` per poll, the controller's only access
to Secrets. Credentials go to ``git`` through its environment (an HTTP header in
``GIT_CONFIG_*``, or a private key file in a private temporary directory), never its
arguments, and errors are scrubbed of URLs' user info before they reach status or logs. A
refusal of the credentials (``refused_credentials``) is flagged in the head
(``SourceHead.credentials_refused``), so the Stack names the credentials to fix.

Credentials never go over plain ``http://`` (``pkobatch.api.git_transport``) unless the
operator allowed the host (``Settings.insecure_http_git_hosts``). The observer asks for the
head of a Stack only when the Stack could run at all (valid spec, allowed pod), so a Stack
that never runs never makes the controller send its credentials anywhere; the check here
keeps that true for any other caller.

A verified push webhook (``controller.receiver``) calls ``refresh(repositories, ref)``: the
keys on that repository and ref are fetched at once, by the same ``ls-remote`` (a fetch
already running when the push came is followed by another), so a commit reaches its Stacks
in about a second instead of up to one interval later. The push's own commit is never used.

The interval of a key is ``Settings.poll_interval``, or longer when every Stack on it set a
longer ``spec.resyncFrequencySeconds``.

A cached head can be up to one interval old. That is fine for noticing new commits, but not
for a run caused by a change of the Stack itself (its first run, a new generation, a new
reconcile request): like PKO, which runs ``ls-remote`` in that reconcile, such a run must
use a head no older than the moment the controller saw the change. So ``head(...,
fresh_for=change)`` answers "not known yet" until a fetch that *started* after the Stack
first asked for that change has finished, and that fetch starts at once. Every Stack asking
before it starts shares it (one ``ls-remote``); a Stack asking while a fetch is already
running waits for the next one.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter

from pkobatch.api.git_transport import (
    credentials_allowed,
    has_url_credentials,
    refusal_message,
    refused_credentials,
)
from pkobatch.api.messages import bound_message
from pkobatch.controller.decision import SourceHead
from pkobatch.controller.push import branch_ref, repository_identity
from pkobatch.controller.stores import StackKey
from pkobatch.github_app import TOKEN_USERNAME as GITHUB_TOKEN_USERNAME
from pkobatch.github_app import GitHubAppError, TokenCache
from pkobatch.kube.client import SECRETS, Kube, KubeError, NotFound

log = logging.getLogger(__name__)

LS_REMOTE_TIMEOUT: Final = 30.0
MAX_PARALLEL_POLLS: Final = 4
MAX_ERROR_CHARS: Final = 300
_USERINFO: Final = re.compile(r"(?<=://)[^/@\s]+@")
# Which CAs git trusts (e.g. a GitHub Enterprise server's private CA): passed on from the
# controller's environment, like PATH; nothing else of it reaches git.
TLS_TRUST_ENV: Final = ("GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "SSL_CERT_FILE", "SSL_CERT_DIR")


@dataclass(frozen=True)
class CredentialRef:
    """Where one credential value comes from: a Secret key, or a literal from the spec."""

    secret: str = ""
    key: str = ""
    literal: str = field(default="", repr=False)


@dataclass(frozen=True)
class GitCredentials:
    """How to authenticate: ``method`` is token, basic, ssh, githubApp or legacy
    (gitAuthSecret)."""

    method: str
    namespace: str
    username: CredentialRef | None = None
    password: CredentialRef | None = None
    ssh_key: CredentialRef | None = None
    legacy_secret: str = ""
    app_id: CredentialRef | None = None
    installation_id: CredentialRef | None = None
    app_private_key: CredentialRef | None = None


@dataclass(frozen=True)
class PollKey:
    url: str
    ref: str
    credentials: GitCredentials | None


def _ref(raw: Any) -> CredentialRef | None:
    if not isinstance(raw, Mapping):
        return None
    if raw.get("type") == "Literal":
        return CredentialRef(literal=str((raw.get("literal") or {}).get("value") or ""))
    secret = raw.get("secret") or {}
    return CredentialRef(secret=str(secret.get("name") or ""), key=str(secret.get("key") or ""))


def poll_key(namespace: str, spec: Mapping[str, Any]) -> PollKey | None:
    """The polling key of a Stack that tracks a git branch (None: nothing to poll)."""
    url, branch = spec.get("projectRepo"), spec.get("branch")
    if not url or not branch or spec.get("commit"):
        return None
    auth = spec.get("gitAuth") or {}
    credentials: GitCredentials | None = None
    if auth.get("sshAuth"):
        credentials = GitCredentials(
            "ssh",
            namespace,
            ssh_key=_ref(auth["sshAuth"].get("sshPrivateKey")),
            password=_ref(auth["sshAuth"].get("password")),
        )
    elif auth.get("accessToken"):
        credentials = GitCredentials(
            "token",
            namespace,
            username=CredentialRef(literal="git"),
            password=_ref(auth["accessToken"]),
        )
    elif auth.get("githubApp"):
        app = auth["githubApp"]
        credentials = GitCredentials(
            "githubApp",
            namespace,
            app_id=_ref(app.get("appID")),
            installation_id=_ref(app.get("installationID")),
            app_private_key=_ref(app.get("privateKey")),
        )
    elif auth.get("basicAuth"):
        basic = auth["basicAuth"]
        credentials = GitCredentials(
            "basic",
            namespace,
            username=_ref(basic.get("userName")),
            password=_ref(basic.get("password")),
        )
    elif spec.get("gitAuthSecret"):
        credentials = GitCredentials("legacy", namespace, legacy_secret=str(spec["gitAuthSecret"]))
    return PollKey(str(url), branch_ref(str(branch)), credentials)


class PollError(Exception):
    """ls-remote failed; the message is safe to show (no credentials). ``credentials_refused``:
    the git server (or GitHub, for an app's token) refused the credentials."""

    def __init__(self, message: str, *, credentials_refused: bool = False) -> None:
        super().__init__(message)
        self.credentials_refused = credentials_refused


@dataclass
class _Resolved:
    username: str = ""
    password: str = field(default="", repr=False)
    ssh_key: str = field(default="", repr=False)
    ssh_passphrase: str = field(default="", repr=False)


def scrub(text: str) -> str:
    """A git error made safe and short for status, Events and logs."""
    return bound_message(_USERINFO.sub("", text).replace("\n", " "), MAX_ERROR_CHARS)


def ls_remote(url: str, ref: str, creds: _Resolved | None, timeout: float) -> str:
    """The commit ``ref`` points to in ``url``."""
    with tempfile.TemporaryDirectory(prefix="pkobatch-git-") as private:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": private,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_ASKPASS": "/bin/false",
            "SSH_ASKPASS_REQUIRE": "never",
            **{name: os.environ[name] for name in TLS_TRUST_ENV if os.environ.get(name)},
        }
        if creds is not None:
            env.update(_credential_env(creds, Path(private)))
        try:
            completed = subprocess.run(
                ["git", "ls-remote", "--", url, ref],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PollError(f"git ls-remote timed out after {timeout:.0f}s") from None
        except OSError as exc:
            raise PollError(f"cannot run git: {exc}") from None
    if completed.returncode != 0:
        raise PollError(
            scrub(completed.stderr) or f"git ls-remote exited {completed.returncode}",
            credentials_refused=refused_credentials(completed.stderr),
        )
    for line in completed.stdout.splitlines():
        sha, _, name = line.partition("\t")
        if name.strip() == ref:
            return sha.strip()
    raise PollError(f"{ref} does not exist in the repository")


def _credential_env(creds: _Resolved, private: Path) -> dict[str, str]:
    if creds.ssh_key:
        key_file = private / "id"
        key_file.write_text(creds.ssh_key if creds.ssh_key.endswith("\n") else creds.ssh_key + "\n")
        key_file.chmod(0o600)
        env = {
            "GIT_SSH_COMMAND": (
                f"ssh -i {key_file} -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new "
                f"-o UserKnownHostsFile={private}/known_hosts"
            )
        }
        if creds.ssh_passphrase:
            askpass = private / "askpass"
            askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$PKOBATCH_SSH_PASSPHRASE"\n')
            askpass.chmod(0o700)
            env.update(
                {
                    "SSH_ASKPASS": str(askpass),
                    "SSH_ASKPASS_REQUIRE": "force",
                    "DISPLAY": ":0",
                    "PKOBATCH_SSH_PASSPHRASE": creds.ssh_passphrase,
                }
            )
        return env
    basic = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


@dataclass
class _Entry:
    subscribers: dict[StackKey, float] = field(default_factory=dict)
    # The last fetch's answer (unknown until the first has finished).
    head: SourceHead = field(default_factory=SourceHead)
    fetched_at: float | None = None
    # When the fetch that produced ``head`` started (the age of the answer).
    started_at: float | None = None
    in_flight: bool = False
    in_flight_since: float = 0.0
    # Stacks waiting for a head fetched after the moment they asked (see fresh_for).
    fresh_waiters: dict[StackKey, float] = field(default_factory=dict)
    # When a verified push last named this key: it needs a fetch started after that.
    pushed_at: float | None = None


LsRemote = Callable[[str, str, "_Resolved | None", float], str]


class GitPoller:
    """The shared branch-head cache with its own polling thread (see the module docstring)."""

    def __init__(
        self,
        kube: Kube,
        interval: float,
        enqueue: Callable[[StackKey], None],
        *,
        registry: CollectorRegistry | None = None,
        fetch: LsRemote = ls_remote,
        clock: Callable[[], float] = time.monotonic,
        max_parallel: int = MAX_PARALLEL_POLLS,
        insecure_http_hosts: tuple[str, ...] = (),
    ) -> None:
        self._kube = kube
        self._insecure_http_hosts = insecure_http_hosts
        self._interval = interval
        self._enqueue = enqueue
        self._fetch = fetch
        # GitHub App installation tokens, reused across polls while fresh.
        self._github_tokens = TokenCache()
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[PollKey, _Entry] = {}
        self._key_of: dict[StackKey, PollKey] = {}
        # Stack -> (the change it needs a fresh head for, when it first asked).
        self._fresh: dict[StackKey, tuple[object, float]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_parallel, thread_name_prefix="pkobatch-git")
        self.calls = 0
        self._counter = Counter(
            "pkobatch_git_ls_remote",
            "git ls-remote calls made by the shared branch poller, by result",
            ["result"],
            registry=registry,
        )
        for result in ("ok", "error"):
            self._counter.labels(result)

    # -- used by reconciles ----------------------------------------------------------------

    def head(
        self,
        stack: StackKey,
        key: PollKey,
        resync_seconds: float | None = None,
        fresh_for: object | None = None,
    ) -> SourceHead:
        """The cached head for ``key``; subscribes ``stack`` to changes. Never blocks.

        ``fresh_for`` names a change of the Stack that will start a run (any hashable value,
        e.g. its generation and reconcile request): until a fetch started after the first
        ask for that change has finished, the answer is "unknown" (``SourceHead()``) and the
        Stack is enqueued when it has.
        """
        with self._lock:
            previous = self._key_of.get(stack)
            if previous is not None and previous != key:
                self._unsubscribe(stack, previous)
            self._key_of[stack] = key
            entry = self._entries.setdefault(key, _Entry())
            entry.subscribers[stack] = max(self._interval, resync_seconds or 0.0)
            if fresh_for is None:
                self._fresh.pop(stack, None)
            else:
                change = self._fresh.get(stack)
                if change is None or change[0] != fresh_for:
                    change = self._fresh[stack] = (fresh_for, self._clock())
                if entry.started_at is None or entry.started_at < change[1]:
                    entry.fresh_waiters[stack] = change[1]
                    self._wake.set()
                    return SourceHead()
            if entry.fetched_at is None and not entry.in_flight:
                self._wake.set()
            return entry.head

    def forget(self, stack: StackKey) -> None:
        """``stack`` is gone or tracks no branch any more."""
        with self._lock:
            self._fresh.pop(stack, None)
            previous = self._key_of.pop(stack, None)
            if previous is not None:
                self._unsubscribe(stack, previous)

    def _unsubscribe(self, stack: StackKey, key: PollKey) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.subscribers.pop(stack, None)
            entry.fresh_waiters.pop(stack, None)
            if not entry.subscribers and not entry.in_flight:
                del self._entries[key]

    # -- used by the push receiver ---------------------------------------------------------

    def refresh(self, repositories: frozenset[str], ref: str) -> tuple[int, int]:
        """A verified push named ``ref`` of ``repositories`` (``repository_identity``): fetch
        the head of every polled key on them and that ref now (one started after this call),
        as a poll would. Nothing of the push itself is used. Returns (the keys polled on
        those repositories, the keys of them on ``ref``)."""
        with self._lock:
            now = self._clock()
            on_repository = [
                (key, entry)
                for key, entry in self._entries.items()
                if entry.subscribers and repository_identity(key.url) in repositories
            ]
            pushed = [entry for key, entry in on_repository if key.ref == ref]
            for entry in pushed:
                entry.pushed_at = now
            if pushed:
                self._wake.set()
        return len(on_repository), len(pushed)

    # -- the polling thread ----------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pkobatch-git-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def poll_due(self) -> float:
        """Start the fetches that are due; the seconds until the next one is."""
        next_due = self._interval
        with self._lock:
            now = self._clock()
            for key, entry in self._entries.items():
                if entry.in_flight or not entry.subscribers:
                    continue
                period = min(entry.subscribers.values())
                due_at = now if entry.fetched_at is None else entry.fetched_at + period
                if due_at <= now or entry.fresh_waiters or entry.pushed_at is not None:
                    entry.in_flight = True
                    entry.in_flight_since = now
                    self._pool.submit(self._poll, key)
                else:
                    next_due = min(next_due, due_at - now)
        return next_due

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = self.poll_due()
            self._wake.wait(timeout=max(0.05, wait))
            self._wake.clear()

    def _poll(self, key: PollKey) -> None:
        commit: str | None = None
        error = ""
        refused = False
        try:
            self._check_transport(key)
            creds = self._resolve(key.credentials, key.url)
            with self._lock:
                self.calls += 1
            try:
                commit = self._fetch(key.url, key.ref, creds, LS_REMOTE_TIMEOUT)
            except PollError:
                if creds is not None and key.credentials and key.credentials.method == "githubApp":
                    self._github_tokens.discard(creds.password)
                raise
            self._counter.labels("ok").inc()
        except PollError as exc:
            error, refused = str(exc), exc.credentials_refused
            self._counter.labels("error").inc()
        except Exception as exc:  # a poller thread must survive anything
            log.exception("branch poll of %s failed", scrub(key.url))
            error = scrub(f"polling failed: {exc}")
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            head = SourceHead(commit, error, refused)
            changed, entry.head = entry.head != head, head
            entry.fetched_at = self._clock()
            entry.started_at = entry.in_flight_since
            entry.in_flight = False
            served = [s for s, asked in entry.fresh_waiters.items() if asked <= entry.started_at]
            for stack in served:
                del entry.fresh_waiters[stack]
            if entry.pushed_at is not None and entry.pushed_at <= entry.started_at:
                entry.pushed_at = None
            # They asked, or a push came, while this fetch ran: fetch again now.
            if entry.fresh_waiters or entry.pushed_at is not None:
                self._wake.set()
            subscribers = list(entry.subscribers)
            if not subscribers:
                del self._entries[key]
        if changed:
            log.info(
                "branch %s of %s is at %s",
                key.ref,
                scrub(key.url),
                commit or f"error: {error}",
            )
        for stack in subscribers if changed else served:
            self._enqueue(stack)

    # -- credentials -----------------------------------------------------------------------

    def _check_transport(self, key: PollKey) -> None:
        if credentials_allowed(key.url, self._insecure_http_hosts):
            return
        if key.credentials is not None:
            raise PollError(refusal_message(key.url, "the git credentials"))
        if has_url_credentials(key.url):
            raise PollError(refusal_message(key.url, "the user name and password in the URL"))

    def _resolve(self, creds: GitCredentials | None, url: str) -> _Resolved | None:
        if creds is None:
            return None
        cache: dict[str, Mapping[str, str]] = {}

        def value(ref: CredentialRef | None, what: str) -> str:
            if ref is None:
                return ""
            if not ref.secret:
                return ref.literal
            data = cache.get(ref.secret)
            if data is None:
                data = cache[ref.secret] = self._secret_data(creds.namespace, ref.secret)
            if ref.key not in data:
                raise PollError(f"Secret {ref.secret} has no key {ref.key!r} ({what})")
            return data[ref.key]

        if creds.method == "legacy":
            data = self._secret_data(creds.namespace, creds.legacy_secret)
            if data.get("sshPrivateKey"):
                return _Resolved(
                    ssh_key=data["sshPrivateKey"], ssh_passphrase=data.get("password", "")
                )
            if data.get("accessToken"):
                return _Resolved(username="git", password=data["accessToken"])
            if data.get("username") and data.get("password"):
                return _Resolved(username=data["username"], password=data["password"])
            raise PollError(
                f"Secret {creds.legacy_secret} (spec.gitAuthSecret) has none of sshPrivateKey, "
                "accessToken, or username and password"
            )
        if creds.method == "githubApp":
            try:
                token = self._github_tokens.token(
                    url,
                    value(creds.app_id, "GitHub App ID"),
                    value(creds.installation_id, "GitHub App installation ID"),
                    value(creds.app_private_key, "GitHub App private key"),
                )
            except GitHubAppError as exc:
                # As the runner counts it (gitAuthentication): the app's credentials failed.
                raise PollError(str(exc), credentials_refused=True) from None
            return _Resolved(username=GITHUB_TOKEN_USERNAME, password=token)
        if creds.method == "ssh":
            return _Resolved(
                ssh_key=value(creds.ssh_key, "ssh private key"),
                ssh_passphrase=value(creds.password, "ssh passphrase"),
            )
        return _Resolved(
            username=value(creds.username, "user name"), password=value(creds.password, "password")
        )

    def _secret_data(self, namespace: str, name: str) -> Mapping[str, str]:
        try:
            secret = self._kube.get(SECRETS, name, namespace)
        except NotFound:
            raise PollError(f"Secret {namespace}/{name} (git credentials) does not exist") from None
        except KubeError as exc:
            raise PollError(f"cannot read Secret {namespace}/{name}: {exc.reason}") from None
        decoded = {}
        for key, encoded in (secret.get("data") or {}).items():
            try:
                decoded[key] = base64.b64decode(encoded).decode()
            except (ValueError, UnicodeDecodeError):
                continue
        return decoded
