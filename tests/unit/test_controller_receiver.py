"""The push receiver over loopback HTTP, with a recording stand-in for the branch poller's
``refresh``: each refusal's status and words, that only a verified push reaches the poller,
the rate limit, and that the secret never shows in a reply or a log. (With the real
poller and control plane: tests/integration/test_push_receiver.py.)"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pkobatch.config import ReceiverSettings
from pkobatch.controller.receiver import MAX_BODY_BYTES, PushReceiver

SECRET = "s3cret-receiver-token"
REPO = "https://github.com/example/infra.git"


@dataclass
class Refreshes:
    """What the receiver asked the poller; ``answer`` is what the poller says back."""

    answer: tuple[int, int] = (1, 1)
    calls: list[tuple[frozenset[str], str]] = field(default_factory=list)

    def refresh(self, repositories: frozenset[str], ref: str) -> tuple[int, int]:
        self.calls.append((repositories, ref))
        return self.answer


@dataclass(frozen=True)
class Answer:
    status: int
    text: str
    retry_after: str | None


def start_receiver(
    tmp_path: Path, poller: Refreshes, rate: float = 100.0, burst: int = 100
) -> PushReceiver:
    (tmp_path / "gh").write_text(SECRET + "\n")  # a trailing newline is not part of it
    (tmp_path / "any").write_text(SECRET)
    settings = ReceiverSettings(
        addr="127.0.0.1:0",
        receivers=["gh=github", "gl=gitlab", "any=generic"],
        secrets_dir=str(tmp_path),
        rate=rate,
        burst=burst,
    )
    receiver = PushReceiver(settings, poller)  # type: ignore[arg-type]
    receiver.start()
    return receiver


@pytest.fixture
def poller() -> Refreshes:
    return Refreshes()


@pytest.fixture
def receiver(tmp_path: Path, poller: Refreshes) -> Iterator[PushReceiver]:
    receiver = start_receiver(tmp_path, poller)
    yield receiver
    receiver.stop()


def post(
    receiver: PushReceiver,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    length: int | None = None,
) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=30)
    try:
        connection.putrequest("POST", path)
        for name, value in headers.items():
            connection.putheader(name, value)
        if length is not None or body is not None:
            connection.putheader(
                "Content-Length", str(length if length is not None else len(body or b""))
            )
        connection.endheaders(body)
        response = connection.getresponse()
        return Answer(response.status, response.read().decode(), response.getheader("Retry-After"))
    finally:
        connection.close()


def github_push(repo: str = REPO, ref: str = "refs/heads/main") -> bytes:
    return json.dumps({"ref": ref, "after": "0" * 40, "repository": {"clone_url": repo}}).encode()


def github_headers(body: bytes, secret: str = SECRET, event: str = "push") -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-GitHub-Event": event, "X-Hub-Signature-256": f"sha256={digest}"}


def test_a_signed_push_makes_the_poller_fetch_that_branch(
    receiver: PushReceiver, poller: Refreshes
) -> None:
    body = github_push()
    answer = post(receiver, "/hooks/gh", body, github_headers(body))
    assert answer.status == 202, answer.text
    assert "refs/heads/main" in answer.text
    assert poller.calls == [(frozenset({"github.com/example/infra"}), "refs/heads/main")]


def test_a_generic_push_is_verified_with_its_receivers_secret(
    receiver: PushReceiver, poller: Refreshes
) -> None:
    body = json.dumps({"repository": REPO, "branch": "main"}).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    answer = post(receiver, "/hooks/any", body, {"X-Signature": f"sha256={signature}"})
    assert answer.status == 202, answer.text
    assert len(poller.calls) == 1


@pytest.mark.parametrize(
    ("path", "headers", "status", "says"),
    [
        ("/hooks/nobody", None, 404, "no receiver at /hooks/nobody"),
        ("/other", None, 404, "receivers are at /hooks/NAME"),
        ("/hooks/gh", {"X-GitHub-Event": "push"}, 401, "missing X-Hub-Signature-256"),
        ("/hooks/gh", github_headers(github_push(), "guessed"), 401, "does not match"),
        ("/hooks/gl", {"X-Gitlab-Token": SECRET}, 503, "has no secret yet"),
    ],
)
def test_refused_requests_say_why_and_never_reach_the_poller(
    receiver: PushReceiver,
    poller: Refreshes,
    path: str,
    headers: dict[str, str] | None,
    status: int,
    says: str,
) -> None:
    body = github_push()
    answer = post(receiver, path, body, headers if headers is not None else github_headers(body))
    assert (answer.status, says in answer.text) == (status, True), answer.text
    assert poller.calls == []


def test_bodies_without_a_length_or_too_large_are_refused_unread(
    receiver: PushReceiver, poller: Refreshes
) -> None:
    assert post(receiver, "/hooks/gh", None, {}).status == 411
    answer = post(receiver, "/hooks/gh", None, {}, length=MAX_BODY_BYTES + 1)
    assert answer.status == 413 and str(MAX_BODY_BYTES) in answer.text
    assert poller.calls == []


def test_a_ping_a_tag_and_a_branch_nobody_follows_do_nothing(
    receiver: PushReceiver, poller: Refreshes
) -> None:
    ping = b'{"zen": "hi"}'
    assert post(receiver, "/hooks/gh", ping, github_headers(ping, event="ping")).status == 200
    tag = github_push(ref="refs/tags/v1")
    answer = post(receiver, "/hooks/gh", tag, github_headers(tag))
    assert answer.status == 200 and "not a branch" in answer.text
    assert poller.calls == []
    poller.answer = (2, 0)
    other = github_push(ref="refs/heads/feature")
    answer = post(receiver, "/hooks/gh", other, github_headers(other))
    assert answer.status == 200 and "no Stack follows refs/heads/feature" in answer.text


def test_a_repository_no_stack_follows_is_refused_404(
    receiver: PushReceiver, poller: Refreshes
) -> None:
    poller.answer = (0, 0)
    body = github_push("https://github.com/example/unknown.git")
    answer = post(receiver, "/hooks/gh", body, github_headers(body))
    assert answer.status == 404 and "github.com/example/unknown" in answer.text


def test_requests_over_the_rate_are_refused_429_before_they_are_read(
    tmp_path: Path, poller: Refreshes
) -> None:
    receiver = start_receiver(tmp_path, poller, rate=0.01, burst=2)
    try:
        body = github_push()
        bad = github_headers(body, "guessed")
        assert post(receiver, "/hooks/gh", body, bad).status == 401  # a bad request counts too
        assert post(receiver, "/hooks/gh", body, github_headers(body)).status == 202
        answer = post(receiver, "/hooks/gh", body, github_headers(body))
        assert answer.status == 429 and "retry later" in answer.text
        assert answer.retry_after is not None and int(answer.retry_after) >= 1
        assert len(poller.calls) == 1
        # Each receiver has a bucket of its own.
        generic = json.dumps({"repository": REPO, "branch": "main"}).encode()
        assert post(receiver, "/hooks/any", generic, {"X-Signature": "sha256=0"}).status == 401
    finally:
        receiver.stop()


def test_the_secret_is_in_no_reply_and_no_log(
    receiver: PushReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = github_push()
    texts = [
        post(receiver, "/hooks/gh", body, github_headers(body)).text,
        post(receiver, "/hooks/gh", body, github_headers(body, SECRET + "x")).text,
        post(receiver, "/hooks/gl", body, {"X-Gitlab-Token": SECRET}).text,
        post(receiver, "/hooks/any", body, {"X-Signature": "sha256=00"}).text,
    ]
    assert caplog.records, "the receiver logged nothing"
    assert all(SECRET not in text for text in [*texts, caplog.text])
