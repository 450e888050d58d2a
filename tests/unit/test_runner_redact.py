"""Secret values never survive the runner's redaction: text, outputs, URL credentials."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pkobatch.api.run import SECRET_PLACEHOLDER
from pkobatch.runner.redact import (
    MIN_SECRET_LENGTH,
    Redactor,
    scrub_url_credentials,
    secret_output_keys,
)


def test_scrub_replaces_every_occurrence_of_every_secret() -> None:
    redactor = Redactor(["s3cr3t-token", "hunter22"])
    text = "token=s3cr3t-token pw=hunter22 again s3cr3t-token"
    assert redactor.scrub(text) == "token=[secret] pw=[secret] again [secret]"


def test_a_secret_containing_another_is_replaced_whole() -> None:
    redactor = Redactor(["abcd", "xxabcdxx"])
    assert redactor.scrub("<xxabcdxx>") == "<[secret]>"


def test_short_values_are_not_searched_for() -> None:
    redactor = Redactor(["no", "1", "a" * (MIN_SECRET_LENGTH - 1)])
    assert redactor.scrub("no 1 aaa") == "no 1 aaa"


def test_each_line_of_a_multiline_secret_is_a_secret() -> None:
    key = "-----BEGIN KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n-----END KEY-----\n"
    redactor = Redactor([key])
    assert "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY" not in redactor.scrub(
        "ssh said: QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    )


def test_secrets_can_be_added_later_and_from_the_environment() -> None:
    redactor = Redactor()
    assert redactor.scrub("value-one") == "value-one"
    redactor.add("value-one", None, "")
    redactor.add_env({"TOKEN": "env-secret-value", "OTHER": "visible"}, ["TOKEN", "MISSING"])
    assert redactor.scrub("value-one env-secret-value visible") == ("[secret] [secret] visible")


def test_url_credentials_are_scrubbed() -> None:
    text = "fatal: https://user:pa55@git.example.com/r.git and http://tok3n@h/x and ssh://git@h/x"
    assert scrub_url_credentials(text) == (
        "fatal: https://***@git.example.com/r.git and http://***@h/x and ssh://git@h/x"
    )


def test_mask_value_replaces_strings_holding_secrets_at_any_depth() -> None:
    redactor = Redactor(["topsecret"])
    value = {"a": "plain", "b": ["x", {"c": "prefix-topsecret"}], "n": 3, "t": True}
    assert redactor.mask_value(value) == {
        "a": "plain",
        "b": ["x", {"c": SECRET_PLACEHOLDER}],
        "n": 3,
        "t": True,
    }


def test_secret_output_keys_are_the_wholly_masked_outputs() -> None:
    masked = {"token": "[secret]", "nested": {"s": "[secret]"}, "plain": "x"}
    assert secret_output_keys(masked) == ["token"]


@given(
    secret=st.text(min_size=MIN_SECRET_LENGTH, max_size=30).filter(lambda s: s.strip() == s),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
)
def test_no_secret_survives_scrubbing(secret: str, before: str, after: str) -> None:
    redactor = Redactor([secret])
    assert secret not in redactor.scrub(before + secret + after).replace(SECRET_PLACEHOLDER, "\0")
