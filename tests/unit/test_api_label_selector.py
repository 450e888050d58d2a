"""Label selectors (``PKOBATCH_NAMESPACE_SELECTOR``): parsing, the start-up check of the
setting, and which labels match."""

from __future__ import annotations

import pytest

from pkobatch.api.label_selector import InvalidSelector, parse_selector
from pkobatch.config import SettingsInvalid, load_settings

TEAM_INFRA = {"team": "infra", "env": "prod"}


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("", {}, True),
        ("team=infra", TEAM_INFRA, True),
        ("team==infra", TEAM_INFRA, True),
        ("team=data", TEAM_INFRA, False),
        ("team=infra", {}, False),
        ("team!=data", TEAM_INFRA, True),
        ("team!=data", {}, True),
        ("team!=infra", TEAM_INFRA, False),
        ("team", TEAM_INFRA, True),
        ("owner", TEAM_INFRA, False),
        ("!owner", TEAM_INFRA, True),
        ("!team", TEAM_INFRA, False),
        ("env in (prod, staging)", TEAM_INFRA, True),
        ("env in (dev,staging)", TEAM_INFRA, False),
        ("env in (prod)", {}, False),
        ("env notin (dev,staging)", TEAM_INFRA, True),
        ("env notin (dev)", {}, True),
        ("env notin (prod)", TEAM_INFRA, False),
        ("team=infra,env in (prod,staging),!legacy", TEAM_INFRA, True),
        ("team=infra, env=dev", TEAM_INFRA, False),
        ("example.com/tier=gold", {"example.com/tier": "gold"}, True),
        ("tier=", {"tier": ""}, True),
        ("tier=", {"tier": "gold"}, False),
        ("replicas>2", {"replicas": "3"}, True),
        ("replicas>2", {"replicas": "2"}, False),
        ("replicas<2", {"replicas": "x"}, False),
        ("replicas<2", {}, False),
    ],
)
def test_a_selector_matches_the_labels_kubernetes_would(
    selector: str, labels: dict[str, str], matches: bool
) -> None:
    assert parse_selector(selector).matches(labels) is matches


@pytest.mark.parametrize(
    ("selector", "complaint"),
    [
        ("team=infra=prod", "is not a label value"),
        ("team in (a,b", "unbalanced parentheses"),
        ("team in a,b)", "unbalanced parentheses"),
        ("team=in fra", "is not a requirement"),
        ("-team=infra", "is not a requirement"),
        ("team=infra,", "is not a requirement"),
        ("env in (prod,-x)", "'-x' is not a label value"),
        ("replicas>two", "> compares with an integer"),
        (f"team={'x' * 64}", "is not a label value"),
    ],
)
def test_a_wrong_selector_is_refused_naming_the_wrong_part(selector: str, complaint: str) -> None:
    with pytest.raises(InvalidSelector, match=complaint):
        parse_selector(selector)


def test_a_wrong_namespace_selector_stops_the_controller_at_start_up() -> None:
    with pytest.raises(SettingsInvalid) as error:
        load_settings(namespace_selector="team in (a,b")
    message = str(error.value)
    assert "PKOBATCH_NAMESPACE_SELECTOR: Value error, not a label selector" in message
    assert "unbalanced parentheses" in message


def test_the_namespace_selector_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PKOBATCH_NAMESPACE_SELECTOR", "pulumi=enabled")
    monkeypatch.setenv("PKOBATCH_NAMESPACES", "team-a,team-b")
    settings = load_settings()
    selector = settings.namespace_filter
    assert selector is not None
    assert selector.matches({"pulumi": "enabled"})
    assert not selector.matches({"pulumi": "disabled"})
    assert settings.namespaces == ["team-a", "team-b"]


def test_no_namespace_selector_selects_no_namespace_by_label() -> None:
    assert load_settings().namespace_filter is None
    assert load_settings(namespace_selector="  ").namespace_filter is None
