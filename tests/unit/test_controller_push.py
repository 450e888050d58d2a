"""Push webhooks, pure: signatures of each receiver kind, what a push names, and how
repository URLs are compared (``pkobatch.controller.push``)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from pkobatch.controller.push import (
    Ignored,
    Push,
    Refused,
    branch_ref,
    read_push,
    repository_identity,
    verify,
)

SECRET = b"receiver-secret"


def signed(body: bytes, secret: bytes = SECRET) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def github_push(ref: str = "refs/heads/main") -> bytes:
    return json.dumps(
        {
            "ref": ref,
            "after": "f" * 40,
            "repository": {
                "clone_url": "https://github.com/Example/Infra.git",
                "ssh_url": "git@github.com:Example/Infra.git",
                "html_url": "https://github.com/Example/Infra",
            },
        }
    ).encode()


def gitlab_push(object_kind: str = "push") -> bytes:
    return json.dumps(
        {
            "object_kind": object_kind,
            "ref": "refs/heads/main",
            "project": {
                "git_http_url": "https://gitlab.example/group/app.git",
                "git_ssh_url": "git@gitlab.example:group/app.git",
            },
        }
    ).encode()


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("https://github.com/Example/Infra.git", "github.com/example/infra"),
        ("https://github.com/example/infra", "github.com/example/infra"),
        ("https://bot:token@github.com/example/infra.git/", "github.com/example/infra"),
        ("git@github.com:example/infra.git", "github.com/example/infra"),
        ("ssh://git@github.com:22/example/infra.git", "github.com/example/infra"),
        ("http://127.0.0.1:8418/repo.git", "127.0.0.1/repo"),
        ("file:///tmp/git/repo.git", "/tmp/git/repo"),
    ],
)
def test_repository_urls_compare_by_host_and_path(url: str, identity: str) -> None:
    assert repository_identity(url) == identity


def test_different_repositories_have_different_identities() -> None:
    assert repository_identity("https://github.com/example/infra") != repository_identity(
        "https://github.com/example/infra-old"
    )
    assert repository_identity("https://github.com/example/infra") != repository_identity(
        "https://gitlab.com/example/infra"
    )


def test_branch_names_become_full_refs() -> None:
    assert branch_ref("main") == "refs/heads/main"
    assert branch_ref("refs/heads/x") == "refs/heads/x"


def test_a_github_push_signed_with_the_secret_names_its_repository_and_branch() -> None:
    body = github_push()
    headers = {"x-hub-signature-256": signed(body), "x-github-event": "push"}
    verify("github", SECRET, headers, body)
    assert read_push("github", headers, body) == Push(
        frozenset({"github.com/example/infra"}), "refs/heads/main"
    )


@pytest.mark.parametrize(
    ("signature", "says"),
    [
        (None, "missing X-Hub-Signature-256"),
        ("sha1=abc", "must be sha256="),
        ("sha256=", "must be sha256="),
        (signed(github_push(), b"another-secret"), "does not match"),
        (signed(github_push("refs/heads/other")), "does not match"),
    ],
)
def test_a_github_push_without_the_right_signature_is_refused_401(
    signature: str | None, says: str
) -> None:
    headers = {"x-github-event": "push"}
    if signature is not None:
        headers["x-hub-signature-256"] = signature
    with pytest.raises(Refused) as refused:
        verify("github", SECRET, headers, github_push())
    assert refused.value.status == 401
    assert says in str(refused.value)
    assert SECRET.decode() not in str(refused.value)


def test_github_events_other_than_push_and_tags_are_ignored() -> None:
    assert isinstance(read_push("github", {"x-github-event": "ping"}, b"{}"), Ignored)
    tag = github_push("refs/tags/v1")
    assert read_push("github", {"x-github-event": "push"}, tag) == Ignored(
        "refs/tags/v1 is not a branch"
    )


def test_a_gitlab_push_needs_the_secret_as_its_token() -> None:
    body = gitlab_push()
    verify("gitlab", SECRET, {"x-gitlab-token": SECRET.decode()}, body)
    for headers, says in (({}, "missing X-Gitlab-Token"), ({"x-gitlab-token": "x"}, "match")):
        with pytest.raises(Refused) as refused:
            verify("gitlab", SECRET, headers, body)
        assert refused.value.status == 401 and says in str(refused.value)
    assert read_push("gitlab", {}, body) == Push(
        frozenset({"gitlab.example/group/app"}), "refs/heads/main"
    )
    assert isinstance(read_push("gitlab", {}, gitlab_push("tag_push")), Ignored)


@pytest.mark.parametrize(
    "payload",
    [
        {"repository": "https://git.example/team/app.git", "branch": "main"},
        {"repository": "https://git.example/team/app.git", "ref": "refs/heads/main"},
        {"repository": "https://git.example/team/app.git", "ref": "main"},
    ],
)
def test_the_generic_form_is_signed_like_flux_generic_hmac(payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    verify("generic", SECRET, {"x-signature": signed(body)}, body)
    assert read_push("generic", {}, body) == Push(
        frozenset({"git.example/team/app"}), "refs/heads/main"
    )
    with pytest.raises(Refused) as refused:
        verify("generic", SECRET, {"x-signature": signed(body + b" ")}, body)
    assert refused.value.status == 401


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"branch": "main"}', "no repository"),
        (b'{"repository": "https://g/x"}', "no branch"),
    ],
)
def test_a_push_that_names_no_repository_or_branch_is_refused_400(body: bytes, says: str) -> None:
    with pytest.raises(Refused) as refused:
        read_push("generic", {}, body)
    assert refused.value.status == 400 and says in str(refused.value)
