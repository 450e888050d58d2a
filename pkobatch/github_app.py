"""``gitAuth.githubApp``: exchange a GitHub App's credentials for an installation token.

GitHub's protocol: the app signs a short JWT (RS256, ``iss`` = app ID, ``iat`` 60 s in the
past against clock skew, ``exp`` at most 10 minutes ahead) with its private key and POSTs it
as ``Authorization: Bearer`` to ``<api>/app/installations/<installation ID>/access_tokens``;
the answer (201) holds ``token``, valid for an hour, used for git over HTTPS as the password
of user ``x-access-token``.

The API is ``https://api.github.com`` for repositories on github.com, and
``<scheme>://<host>/api/v3`` for any other host (GitHub Enterprise Server's layout), so the
API endpoint always follows the repository's host: credentials go nowhere else.

Both the runner (the clone) and the controller's branch poller (``git ls-remote``) use this,
so it belongs to neither package: it may import only ``pkobatch.api``.
Nothing here writes the key, the JWT or the token anywhere; errors name the step and the
HTTP status, never a credential, and callers add the token to their redaction.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from pkobatch.api.messages import bound_message

TOKEN_USERNAME: Final = "x-access-token"
JWT_LIFETIME_SECONDS: Final = 540
CLOCK_SKEW_SECONDS: Final = 60
EXCHANGE_TIMEOUT_SECONDS: Final = 30.0
MAX_ERROR_CHARS: Final = 200
# GitHub's installation tokens are valid for an hour; reuse one for well under that.
TOKEN_REUSE_SECONDS: Final = 30 * 60


class GitHubAppError(Exception):
    """The exchange failed; the message is safe to show (no key, JWT or token)."""


def api_url(repo_url: str) -> str:
    """GitHub's REST API for the host of ``repo_url``."""
    parts = urlsplit(repo_url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise GitHubAppError(
            f"spec.gitAuth.githubApp needs an https:// repository URL, got {parts.scheme or '?'}"
            "://…: a GitHub App token is used for git over HTTPS only"
        )
    host = parts.hostname.lower()
    if host in ("github.com", "www.github.com"):
        return "https://api.github.com"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return f"{parts.scheme}://{netloc}/api/v3"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def app_jwt(app_id: str, private_key_pem: str, now: float | None = None) -> str:
    """The RS256 JWT GitHub expects from an app."""
    try:
        key = serialization.load_pem_private_key(private_key_pem.strip().encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise GitHubAppError(
            "spec.gitAuth.githubApp.privateKey is not an unencrypted PEM private key: use the "
            "key GitHub generated for the app (-----BEGIN RSA PRIVATE KEY-----)"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise GitHubAppError("spec.gitAuth.githubApp.privateKey is not an RSA key")
    issued = int(now if now is not None else time.time()) - CLOCK_SKEW_SECONDS
    header = {"alg": "RS256", "typ": "JWT"}
    claims = {"iat": issued, "exp": issued + JWT_LIFETIME_SECONDS, "iss": app_id.strip()}
    signing_input = ".".join(
        _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


def installation_token(
    repo_url: str,
    app_id: str,
    installation_id: str,
    private_key_pem: str,
    *,
    timeout: float = EXCHANGE_TIMEOUT_SECONDS,
) -> str:
    """An installation token for git over HTTPS to ``repo_url``.

    TLS is verified against the system's trust store (``SSL_CERT_FILE`` names another
    bundle, e.g. a GitHub Enterprise server's CA).
    """
    if not app_id.strip() or not installation_id.strip():
        raise GitHubAppError("spec.gitAuth.githubApp: appID and installationID must not be empty")
    if not installation_id.strip().isdigit():
        raise GitHubAppError("spec.gitAuth.githubApp.installationID must be a number")
    endpoint = f"{api_url(repo_url)}/app/installations/{installation_id.strip()}/access_tokens"
    request = urllib.request.Request(
        endpoint,
        method="POST",
        headers={
            "Authorization": f"Bearer {app_jwt(app_id, private_key_pem)}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "pkobatch",
        },
    )
    context = ssl.create_default_context()
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise GitHubAppError(
            f"GitHub refused the app's token request for installation "
            f"{installation_id.strip()} at {endpoint.split('/app/')[0]}: HTTP {exc.code} "
            f"({_github_message(exc)}); check appID, installationID and privateKey"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise GitHubAppError(
            bound_message(
                f"cannot reach GitHub's API at {endpoint.split('/app/')[0]}: {reason}",
                MAX_ERROR_CHARS,
            )
        ) from None
    try:
        token = json.loads(body)["token"]
    except (ValueError, KeyError, TypeError):
        raise GitHubAppError("GitHub's answer to the token request has no token") from None
    if not isinstance(token, str) or not token:
        raise GitHubAppError("GitHub's answer to the token request has no token")
    return token


@dataclass(frozen=True)
class _Cached:
    token: str = field(repr=False)
    until: float


class TokenCache:
    """Installation tokens reused while they are fresh (the branch poller asks every
    interval; GitHub's tokens live an hour). Keyed by repository host, app, installation
    and a hash of the key, so a changed Secret gets a new token at once. In memory only."""

    def __init__(
        self,
        reuse_seconds: float = TOKEN_REUSE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reuse = reuse_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, str, str, str], _Cached] = {}

    def token(self, repo_url: str, app_id: str, installation_id: str, private_key_pem: str) -> str:
        key = (
            api_url(repo_url),
            app_id.strip(),
            installation_id.strip(),
            hashlib.sha256(private_key_pem.strip().encode()).hexdigest(),
        )
        now = self._clock()
        with self._lock:
            cached = self._tokens.get(key)
            if cached is not None and now < cached.until:
                return cached.token
        fresh = installation_token(repo_url, app_id, installation_id, private_key_pem)
        with self._lock:
            self._tokens = {k: v for k, v in self._tokens.items() if now < v.until}
            self._tokens[key] = _Cached(fresh, now + self._reuse)
        return fresh

    def discard(self, token: str) -> None:
        """Forget ``token`` (git refused it: revoked, or the app lost access)."""
        with self._lock:
            self._tokens = {k: v for k, v in self._tokens.items() if v.token != token}


def _github_message(error: urllib.error.HTTPError) -> str:
    """GitHub's own error message (a fixed text such as 'Bad credentials'), bounded."""
    try:
        message = json.loads(error.read()).get("message", "")
    except (ValueError, AttributeError, OSError):
        message = ""
    return bound_message(str(message), MAX_ERROR_CHARS // 2) or error.reason or "no message"
