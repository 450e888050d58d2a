"""gitAuth.githubApp's token exchange: the API URL, the app JWT, and safe errors."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from pkobatch import github_app
from pkobatch.github_app import (
    GitHubAppError,
    TokenCache,
    api_url,
    app_jwt,
    installation_token,
)


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


@pytest.mark.parametrize(
    ("repo", "api"),
    [
        ("https://github.com/acme/platform", "https://api.github.com"),
        ("https://GitHub.com/acme/platform.git", "https://api.github.com"),
        ("https://ghe.acme.example/acme/platform", "https://ghe.acme.example/api/v3"),
        ("https://127.0.0.1:8443/repo.git", "https://127.0.0.1:8443/api/v3"),
    ],
)
def test_the_api_follows_the_repository_host(repo: str, api: str) -> None:
    assert api_url(repo) == api


def test_ssh_urls_are_refused_with_a_fix() -> None:
    with pytest.raises(GitHubAppError, match="https:// repository URL"):
        api_url("git@github.com:acme/platform.git")


def test_the_jwt_is_rs256_signed_by_the_app_key_and_short_lived() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = app_jwt(" 12345 ", pem(key), now=1_000_000)
    header_b64, claims_b64, signature = token.split(".")
    assert json.loads(decode(header_b64)) == {"alg": "RS256", "typ": "JWT"}
    claims = json.loads(decode(claims_b64))
    assert claims == {"iat": 1_000_000 - 60, "exp": 1_000_000 - 60 + 540, "iss": "12345"}
    key.public_key().verify(
        decode(signature),
        f"{header_b64}.{claims_b64}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )


def test_a_key_that_is_not_rsa_pem_is_refused_without_echoing_it() -> None:
    with pytest.raises(GitHubAppError) as garbage:
        app_jwt("1", "not-a-key-sentinel-1234567890")
    assert "not-a-key-sentinel" not in str(garbage.value)
    assert "PEM private key" in str(garbage.value)
    with pytest.raises(GitHubAppError, match="not an RSA key"):
        app_jwt("1", pem(ec.generate_private_key(ec.SECP256R1())))


def test_ids_are_checked_before_any_request() -> None:
    with pytest.raises(GitHubAppError, match="must not be empty"):
        installation_token("https://github.com/a/b", "", "1", "x")
    with pytest.raises(GitHubAppError, match="must be a number"):
        installation_token("https://github.com/a/b", "1", "abc", "x")


def test_an_unreachable_api_names_it_and_nothing_secret() -> None:
    key = pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(GitHubAppError) as failure:
        installation_token("https://127.0.0.1:1/repo.git", "7", "9", key, timeout=5)
    message = str(failure.value)
    assert "cannot reach GitHub's API at https://127.0.0.1:1/api/v3" in message
    assert "BEGIN" not in message and "eyJ" not in message


def test_the_token_cache_reuses_a_fresh_token_and_forgets_a_refused_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    issued: list[str] = []

    def exchange(repo: str, app_id: str, installation_id: str, key: str) -> str:
        issued.append(f"token-{len(issued)}")
        return issued[-1]

    monkeypatch.setattr(github_app, "installation_token", exchange)
    now = [0.0]
    cache = TokenCache(reuse_seconds=100, clock=lambda: now[0])
    url = "https://github.com/acme/platform"
    assert cache.token(url, "1", "2", "key") == "token-0"
    assert cache.token(url, "1", "2", "key") == "token-0"
    assert cache.token(url, "1", "2", "other key") == "token-1"
    now[0] = 101
    assert cache.token(url, "1", "2", "key") == "token-2"
    cache.discard("token-2")
    assert cache.token(url, "1", "2", "key") == "token-3"
