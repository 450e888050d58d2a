"""Push webhooks, read and verified (pure): which repository and branch a push names.

The push receiver (``controller.receiver``) serves one URL per receiver,
``/hooks/<name>``, each with a kind and a secret of its own (``Settings.receiver``):

- ``github``: GitHub's ``X-Hub-Signature-256: sha256=<hex>``, the HMAC-SHA256 of the body
  with the secret; ``X-GitHub-Event: push`` (a ``ping`` is answered, nothing else acted on).
- ``gitlab``: GitLab's ``X-Gitlab-Token``, the secret itself (GitLab signs nothing); a body
  whose ``object_kind`` is ``push``.
- ``generic``: ``X-Signature: sha256=<hex>``, the HMAC-SHA256 of the body with the secret
  (Flux's ``generic-hmac`` header); the body ``{"repository": "<url>", "branch": "<name>"}``
  (or ``"ref": "refs/heads/<name>"``).

A verified push is trusted for one thing only: that the repository and branch it names
may have moved. Its commit, author and any other field are ignored; the receiver makes the
branch poller run the same ``git ls-remote`` it runs every interval, so what runs is
always what the git server says the branch is.

Repositories are compared by ``repository_identity``: host and path, lowercased, without
scheme, user, port, trailing ``/`` or ``.git``, so the HTTPS and SSH URLs a push lists
match a Stack's ``projectRepo`` in either form.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

# URL fields of a push that name the pushed repository (GitHub's repository, GitLab's
# project and repository objects).
GITHUB_URL_FIELDS: Final = ("clone_url", "html_url", "ssh_url", "git_url", "url")
GITLAB_URL_FIELDS: Final = ("git_http_url", "git_ssh_url", "web_url", "http_url", "ssh_url")
GITLAB_REPOSITORY_URL_FIELDS: Final = ("git_http_url", "git_ssh_url", "homepage", "url")
# scp-like ssh address: git@host:owner/repo.git
_SCP_LIKE: Final = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[^:/\s]+):(?P<path>[^/].*)$")


def branch_ref(branch: str) -> str:
    """The full ref of a branch name (a full ref stays as it is)."""
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


def repository_identity(url: str) -> str:
    """``host/path`` of a git URL, lowercased, without scheme, user info, port, trailing
    ``/`` and ``.git``; a local path (``file://``) keeps its path."""
    text = url.strip()
    if "://" in text:
        parts = urlsplit(text)
        host = (parts.hostname or "").lower()
        path = parts.path
    else:
        scp = _SCP_LIKE.match(text)
        host, path = (scp["host"].lower(), scp["path"]) if scp else ("", text)
    path = path.rstrip("/")
    path = path.removesuffix(".git").rstrip("/")
    return f"{host}/{path.lstrip('/')}".lower() if host else path.lower()


class Refused(Exception):
    """A request the receiver refuses: ``status`` is its HTTP status, the message says why
    and what to do (it never holds the secret)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Push:
    """A push: the identities of the repository (``repository_identity``) and the ref."""

    repositories: frozenset[str]
    ref: str


@dataclass(frozen=True)
class Ignored:
    """A verified request that names no branch push (a ping, a tag, another event)."""

    reason: str


def _hmac_sha256(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _check_signature(header: str, value: str, secret: bytes, body: bytes) -> None:
    if not value:
        raise Refused(401, f"missing {header} header: sign the body with the receiver's secret")
    scheme, _, digest = value.partition("=")
    if scheme != "sha256" or not digest:
        raise Refused(401, f"{header} must be sha256=<hex HMAC-SHA256 of the body>")
    if not hmac.compare_digest(digest.lower().encode(), _hmac_sha256(secret, body).encode()):
        raise Refused(401, f"{header} does not match the body: check the receiver's secret")


def verify(kind: str, secret: bytes, headers: Mapping[str, str], body: bytes) -> None:
    """Raise ``Refused(401)`` unless the request carries proof of ``secret`` for ``kind``.
    ``headers`` has lowercased names."""
    if kind == "github":
        _check_signature(
            "X-Hub-Signature-256", headers.get("x-hub-signature-256", ""), secret, body
        )
    elif kind == "gitlab":
        token = headers.get("x-gitlab-token", "")
        if not token:
            raise Refused(401, "missing X-Gitlab-Token header: set the webhook's secret token")
        if not hmac.compare_digest(token.encode(), secret):
            raise Refused(401, "X-Gitlab-Token does not match the receiver's secret")
    else:
        _check_signature("X-Signature", headers.get("x-signature", ""), secret, body)


def _urls(section: Any, fields: tuple[str, ...]) -> list[str]:
    if not isinstance(section, Mapping):
        return []
    return [str(section[name]) for name in fields if isinstance(section.get(name), str)]


def read_push(kind: str, headers: Mapping[str, str], body: bytes) -> Push | Ignored:
    """The repository and ref a verified request names; ``Refused(400)`` for a push that
    names neither."""
    if kind == "github":
        event = headers.get("x-github-event", "")
        if event != "push":
            return Ignored(f"GitHub event {event or '(none)'!r} is not a push")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(payload, Mapping):
        raise Refused(400, "the body is not a JSON object")
    if kind == "github":
        urls = _urls(payload.get("repository"), GITHUB_URL_FIELDS)
        ref = payload.get("ref")
    elif kind == "gitlab":
        if payload.get("object_kind") != "push":
            return Ignored(f"GitLab event {payload.get('object_kind')!r} is not a push")
        urls = _urls(payload.get("project"), GITLAB_URL_FIELDS) + _urls(
            payload.get("repository"), GITLAB_REPOSITORY_URL_FIELDS
        )
        ref = payload.get("ref")
    else:
        repository = payload.get("repository")
        urls = [repository] if isinstance(repository, str) else []
        name = payload.get("branch") or payload.get("ref")
        ref = branch_ref(name) if isinstance(name, str) else None
    if not urls:
        raise Refused(400, "the push names no repository URL")
    if not isinstance(ref, str) or not ref:
        raise Refused(400, "the push names no branch (ref)")
    if not ref.startswith("refs/heads/"):
        return Ignored(f"{ref} is not a branch")
    return Push(frozenset(repository_identity(url) for url in urls), ref)
