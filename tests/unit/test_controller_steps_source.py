"""steps.source: waiting for the branch head, and a branch that cannot be read."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from decision_world import (
    GIT_SPEC,
    SHA1,
    SHA2,
    World,
    deployed_world,
)

from pkobatch.api.stack.validation import load_stack_spec
from pkobatch.controller.decision import SourceHead
from pkobatch.controller.steps.source import credentials_to_fix


def test_waiting_for_the_first_branch_head() -> None:
    world = World(head=None)
    world.source = SourceHead()
    result = world.step()
    assert result.create_job is None
    assert "waiting for the head of branch main" in world.condition("Reconciling")["message"]


def test_a_known_stack_keeps_its_conditions_while_the_head_is_unknown() -> None:
    world = deployed_world()
    world.source = SourceHead()
    before = copy.deepcopy(world.stack)
    assert world.step().create_job is None
    assert world.stack == before


def test_a_spec_change_waiting_for_a_fresh_head_is_reconciling() -> None:
    world = deployed_world()
    world.edit_spec(config={"x": "1"})
    world.source = SourceHead()  # the poller has no head fetched after the change yet
    result = world.step()
    assert result.create_job is None
    assert world.condition("Ready")["status"] == "False"
    assert "waiting for the head of branch main" in world.condition("Reconciling")["message"]
    world.source = SourceHead(commit=SHA2)
    assert world.step().create_job is not None
    assert world.status["currentUpdate"]["commit"] == SHA2


def test_unreadable_branch_is_stalled_source_unavailable() -> None:
    world = World()
    world.source = SourceHead(error="repository not found")
    result = world.step()
    assert result.create_job is None
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SourceUnavailable"
    assert "repository not found" in stalled["message"]
    world.source = SourceHead(commit=SHA1)
    assert world.step().create_job is not None


REFUSED = "fatal: Authentication failed for 'https://git.example/app.git/'"


def secret(name: str, key: str) -> dict[str, Any]:
    return {"type": "Secret", "secret": {"name": name, "key": key}}


def test_refused_credentials_name_what_to_fix_in_one_event_per_change_of_the_error() -> None:
    world = deployed_world({**GIT_SPEC, "gitAuth": {"accessToken": secret("git-creds", "token")}})
    world.source = SourceHead(error=REFUSED, credentials_refused=True)
    [event] = world.step().events
    stalled = world.condition("Stalled")
    assert stalled["reason"] == "SourceUnavailable"
    assert (event.type, event.reason) == ("Warning", "StackGitAuthenticationFailure")
    assert event.message == stalled["message"]
    for words in (
        "cannot read branch main of https://git.example/app.git: fatal: Authentication failed",
        "the credentials were refused: fix spec.gitAuth.accessToken (key token of Secret "
        "team/git-creds)",
    ):
        assert words in stalled["message"]
    # Every later poll with the same error: no Event again (the condition already says it).
    world.advance(60)
    assert world.step().events == []
    # Another error is told again; the Stack recovers when the branch can be read.
    world.source = SourceHead(
        error="fatal: could not read Username for 'https://git.example': terminal prompts disabled",
        credentials_refused=True,
    )
    [again] = world.step().events
    assert again.reason == "StackGitAuthenticationFailure" and "Username" in again.message
    world.source = SourceHead(commit=SHA2)
    assert world.step().create_job is not None
    assert world.condition("Stalled") is None


def test_other_branch_errors_keep_the_source_unavailable_event() -> None:
    world = World()
    world.source = SourceHead(error="fatal: repository 'https://git.example/app.git/' not found")
    [event] = world.step().events
    assert event.reason == "SourceUnavailable" and "credentials" not in event.message


@pytest.mark.parametrize(
    ("auth", "words"),
    [
        (
            {
                "gitAuth": {
                    "basicAuth": {"userName": secret("b", "user"), "password": secret("b", "pw")}
                }
            },
            "spec.gitAuth.basicAuth: userName (key user of Secret team/b) and password (key pw "
            "of Secret team/b)",
        ),
        (
            {"gitAuth": {"sshAuth": {"sshPrivateKey": secret("ssh", "key")}}},
            "spec.gitAuth.sshAuth: sshPrivateKey (key key of Secret team/ssh), and give the key",
        ),
        (
            {"gitAuth": {"accessToken": {"type": "Literal", "literal": {"value": "x"}}}},
            "spec.gitAuth.accessToken (a literal value)",
        ),
        (
            {
                "gitAuth": {
                    "githubApp": {
                        "appID": secret("app", "id"),
                        "installationID": secret("app", "installation"),
                        "privateKey": secret("app", "pem"),
                    }
                }
            },
            "privateKey (key pem of Secret team/app), and install the app",
        ),
        ({"gitAuthSecret": "legacy"}, "Secret team/legacy of spec.gitAuthSecret"),
        ({}, "the repository needs credentials and the Stack gives none"),
    ],
)
def test_the_credentials_to_fix_are_named_for_every_method(auth: Any, words: str) -> None:
    spec = load_stack_spec({**GIT_SPEC, **auth}, "team").spec
    assert spec is not None
    assert words in credentials_to_fix(spec, "team")
