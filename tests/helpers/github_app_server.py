"""A loopback HTTPS server with GitHub's installation-token endpoint in front of git.

``POST /api/v3/app/installations/<id>/access_tokens`` (GitHub Enterprise Server's layout,
which pkobatch uses for every host but github.com) checks the ``Authorization: Bearer`` JWT
the way GitHub does: RS256 signature verified with the app's **public** key, ``iss`` equal
to the app ID, ``iat`` not in the future, ``exp`` after now and at most 10 minutes after
``iat``; and the installation ID. It answers 201 ``{"token": ..., "expires_at": ...}`` or
401 ``{"message": ...}`` as GitHub does.

Git requests go to ``git http-backend`` (the same CGI handling as the plain git server of
tests/fixture_plugins/git.py) only with HTTP basic auth whose password is a token this server
issued.
TLS uses a test CA (``ca_file``): clients trust it through ``SSL_CERT_FILE`` (Python) and
``GIT_SSL_CAINFO`` (git).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from fixture_plugins.git import GitHandler, GitHttpServer

from pkobatch.dev.pki import ensure_pki

TOKEN_PATH = re.compile(r"^/api/v3/app/installations/(\d+)/access_tokens$")


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@dataclass
class TokenRequest:
    installation_id: str
    accepted: bool
    reason: str


class _GitHubHandler(GitHandler):
    server: _GitHubServer

    def do_POST(self) -> None:
        match = TOKEN_PATH.match(self.path.partition("?")[0])
        if match is None:
            self._serve()
            return
        reason = self._jwt_problem(match.group(1))
        self.server.token_requests.append(TokenRequest(match.group(1), not reason, reason))
        if reason:
            self._json(HTTPStatus.UNAUTHORIZED, {"message": reason})
            return
        token = f"ghs_{secrets.token_urlsafe(27)}"
        self.server.issued.add(token)
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        self._json(HTTPStatus.CREATED, {"token": token, "expires_at": expires})

    def _jwt_problem(self, installation_id: str) -> str:
        scheme, _, jwt = (self.headers.get("Authorization") or "").partition(" ")
        if scheme != "Bearer" or jwt.count(".") != 2:
            return "A JSON web token could not be decoded"
        header_b64, claims_b64, signature_b64 = jwt.split(".")
        try:
            header = json.loads(_b64decode(header_b64))
            claims = json.loads(_b64decode(claims_b64))
            self.server.public_key.verify(
                _b64decode(signature_b64),
                f"{header_b64}.{claims_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except (ValueError, InvalidSignature):
            return "A JSON web token could not be decoded"
        now = time.time()
        if header.get("alg") != "RS256":
            return "'alg' must be RS256"
        if str(claims.get("iss")) != self.server.app_id:
            return "Integration not found"
        if not (claims.get("iat", now + 1) <= now + 5 and claims.get("exp", 0) > now):
            return "'Expiration time' claim ('exp') is too far in the future or expired"
        if claims["exp"] - claims["iat"] > 600:
            return "'Expiration time' claim ('exp') is too far in the future"
        if installation_id != self.server.installation_id:
            return "Not Found"
        return ""

    def _json(self, status: HTTPStatus, body: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _authenticated_user(self) -> str | None:
        credentials = self._basic_credentials()
        if credentials is None:
            return None
        username, password = credentials
        return username if password in self.server.issued else None


class _GitHubServer(GitHttpServer):
    def __init__(
        self, root: Path, app_id: str, installation_id: str, public_key: rsa.RSAPublicKey
    ) -> None:
        super().__init__(root, username="", password=secrets.token_urlsafe(24))
        self.RequestHandlerClass = _GitHubHandler
        self.app_id = app_id
        self.installation_id = installation_id
        self.public_key = public_key
        self.issued: set[str] = set()
        self.token_requests: list[TokenRequest] = []


@dataclass
class GitHubAppServer:
    port: int
    ca_file: Path
    app_id: str
    installation_id: str
    # The app's private key (PEM), what a user puts in the Secret.
    private_key: str = field(repr=False)
    # Another key: GitHub rejects JWTs it signs.
    wrong_private_key: str = field(repr=False)
    issued: set[str] = field(repr=False)
    token_requests: list[TokenRequest]

    def repo_url(self, bare: Path) -> str:
        return f"https://127.0.0.1:{self.port}/{bare.name}"


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


@contextmanager
def github_app_server(root: Path, state: Path) -> Iterator[GitHubAppServer]:
    """Serve the bare repositories under ``root`` as a GitHub App would see them."""
    pki = ensure_pki(state / "pki", ["127.0.0.1"])
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    wrong = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    app_id, installation_id = str(secrets.randbelow(10**6) + 1), str(secrets.randbelow(10**8) + 1)
    server = _GitHubServer(root, app_id, installation_id, key.public_key())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.serving_cert, pki.serving_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="github-app", daemon=True)
    thread.start()
    try:
        yield GitHubAppServer(
            port=int(server.server_address[1]),
            ca_file=pki.ca_cert,
            app_id=app_id,
            installation_id=installation_id,
            private_key=_pem(key),
            wrong_private_key=_pem(wrong),
            issued=server.issued,
            token_requests=server.token_requests,
        )
    finally:
        server.shutdown()
        server.server_close()
