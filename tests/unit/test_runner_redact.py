"""Secret values never survive the runner's redaction: text, outputs, URL credentials."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pkobatch.api.run import SECRET_PLACEHOLDER
from pkobatch.runner.redact import (
    MIN_SECRET_LENGTH,
    Redactor,
    scrub_url_credentials,
    secret_output_keys,
)
from pkobatch.runner.run_log import RunLog, ScrubbingWriter


def test_scrub_replaces_every_occurrence_of_every_secret() -> None:
    redactor = Redactor(["s3cr3t-token", "hunter22"])
    text = "token=s3cr3t-token pw=hunter22 again s3cr3t-token"
    assert redactor.scrub(text) == "token=[secret] pw=[secret] again [secret]"


def test_a_secret_containing_another_is_replaced_whole() -> None:
    redactor = Redactor(["abcd", "xxabcdxx"])
    assert redactor.scrub("<xxabcdxx>") == "<[secret]>"


def test_short_values_are_replaced_only_where_they_stand_alone() -> None:
    redactor = Redactor(["no", "1", "a" * (MIN_SECRET_LENGTH - 1)])
    assert redactor.scrub("no 1 aaa") == "[secret] [secret] [secret]"
    assert redactor.scrub('tag:{"no"} n=1,') == 'tag:{"[secret]"} n=[secret],'
    assert redactor.scrub("none 10 aaaa x1 _no") == "none 10 aaaa x1 _no"


def test_each_line_of_a_multiline_secret_is_a_secret() -> None:
    key = "-----BEGIN KEY-----\nQUJDREVGR0hJSktMTU5PUFFSU1RVVldY\n-----END KEY-----\n"
    redactor = Redactor([key])
    assert "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY" not in redactor.scrub(
        "ssh said: QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    )


def test_secrets_can_be_added_later() -> None:
    redactor = Redactor()
    assert redactor.scrub("value-one") == "value-one"
    redactor.add("value-one", None, "")
    redactor.add("value-two")
    assert redactor.scrub("value-one value-two visible") == "[secret] [secret] visible"


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


# A value with every kind of character the encoders treat differently: a quote, a
# backslash, non-ASCII, HTML characters, control characters, a line separator, an emoji.
AWKWARD = 'pa"ss\\wörd<&>\n\x01\u2028😀'


def base64_inside(value: str, offset: int) -> str:
    """``value`` base64-encoded inside a longer text, ``offset`` bytes from its start."""
    return base64.b64encode(b"x" * offset + value.encode() + b"tail").decode()


# As printed by Go 1.26 (encoding/json, strconv.Quote, strconv.QuoteToASCII), Python and
# base64: each form is written out here, not computed by the code under test.
@pytest.mark.parametrize(
    ("form", "printed"),
    [
        ("raw", AWKWARD),
        ("Python json.dumps", '"pa\\"ss\\\\w\\u00f6rd<&>\\n\\u0001\\u2028\\ud83d\\ude00"'),
        ("Go encoding/json", '"pa\\"ss\\\\wörd\\u003c\\u0026\\u003e\\n\\u0001\\u2028😀"'),
        ("Go %q, strconv.Quote", '"pa\\"ss\\\\wörd<&>\\n\\x01\u2028😀"'),
        ("Go %+q, strconv.QuoteToASCII", '"pa\\"ss\\\\w\\u00f6rd<&>\\n\\x01\\u2028\\U0001f600"'),
        ("Python repr", "'pa\"ss\\\\wörd<&>\\n\\x01\\u2028😀'"),
        ("base64", base64.b64encode(AWKWARD.encode()).decode()),
        ("base64, URL-safe", base64.urlsafe_b64encode(AWKWARD.encode()).decode()),
        ("base64 inside a text, offset 1", base64_inside(AWKWARD, 1)),
        ("base64 inside a text, offset 2", base64_inside(AWKWARD, 2)),
        ("base64 inside a text, offset 3", base64_inside(AWKWARD, 3)),
    ],
)
def test_a_secret_is_replaced_in_every_form_it_is_printed_in(form: str, printed: str) -> None:
    redactor = Redactor([AWKWARD])
    scrubbed = redactor.scrub(f"error: {printed} <- here")
    assert SECRET_PLACEHOLDER in scrubbed, form
    assert printed not in scrubbed
    assert scrubbed.startswith("error: ") and scrubbed.endswith(" <- here")


def test_base64_of_a_value_is_cut_out_of_a_longer_encoded_text() -> None:
    value = "a-long-enough-secret"
    redactor = Redactor([value])
    for offset in range(3):
        scrubbed = redactor.scrub(base64_inside(value, offset))
        # What is left cannot hold more than the two bytes at each end the encoding mixes.
        remainder = scrubbed.replace(SECRET_PLACEHOLDER, "")
        assert len(remainder) <= len(base64_inside("", offset)) + 8


def test_short_values_get_no_base64_forms_that_could_match_by_chance() -> None:
    redactor = Redactor(["abcd"])
    unrelated = base64.b64encode(b"xabcdefgh").decode()
    assert redactor.scrub(unrelated) == unrelated


# Go's %v of a resource.PropertyMap holding resource.Secret values, as the engine prints it
# when an update violates its saved plan (pkg/resource/deploy/plan.go, MakeError).
PLAN_VIOLATION = (
    "error: resource urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::settings violates plan: "
    "properties changed: ++metadata[{map[annotations:{map[bars.example/tag:{&{{OLD-VALUE}}}]}"
    " name:{app-settings}]}!={map[annotations:{map[bars.example/tag:{&{{NEW-VALUE}}}]} "
    "name:{app-settings}]}]"
)


def test_a_secret_pulumi_prints_with_go_v_is_replaced_even_when_the_run_never_had_it() -> None:
    scrubbed = Redactor().scrub(PLAN_VIOLATION)
    assert "OLD-VALUE" not in scrubbed and "NEW-VALUE" not in scrubbed
    assert scrubbed == (
        "error: resource urn:pulumi:dev::p::kubernetes:core/v1:ConfigMap::settings violates "
        "plan: properties changed: ++metadata[{map[annotations:{map[bars.example/tag:"
        "{&{{[secret]}}}]} name:{app-settings}]}!={map[annotations:{map[bars.example/tag:"
        "{&{{[secret]}}}]} name:{app-settings}]}]"
    )


def test_a_go_printed_secret_holding_an_object_is_replaced_whole() -> None:
    text = "~~data[{map[x:{&{{map[k:{v} j:{map[deep:{1}]}]}}}]}] after"
    assert Redactor().scrub(text) == "~~data[{map[x:{&{{[secret]}}}]}] after"


def test_a_go_printed_secret_left_open_is_replaced_to_the_end() -> None:
    assert Redactor().scrub("x:{&{{un{balanced}} tail") == "x:{&{{[secret]"


def test_a_go_printed_secret_spanning_lines_of_a_stream_is_replaced_on_each() -> None:
    redactor = Redactor()
    lines = ["    tag:{&{{-----BEGIN KEY-----", "    QUJDRA==", "    -----END KEY-----}}}]", "ok"]
    depth = 0
    scrubbed = []
    for line in lines:
        text, depth = redactor.scrub_stream(line, depth)
        scrubbed.append(text)
    assert scrubbed == ["    tag:{&{{[secret]", "[secret]", "[secret]}}}]", "ok"]
    assert depth == 0


def test_the_run_log_carries_an_open_secret_per_stream() -> None:
    out = io.StringIO()
    log = RunLog(out, Redactor())
    log.pulumi("a:{&{{first line")
    log.pulumi_error("stderr is its own stream")
    log.step("the runner's own lines too")
    log.pulumi("second line}}}")
    assert out.getvalue().splitlines() == [
        "a:{&{{[secret]",
        "stderr is its own stream",
        "[pkobatch] the runner's own lines too",
        "[secret]}}}",
    ]


def test_printed_program_output_is_scrubbed_across_writes() -> None:
    out = io.StringIO()
    writer = ScrubbingWriter(out, Redactor(["known-value"]))
    writer.write("x:{&{{unknown\n")
    writer.write("still secret}}} known-value\nvisible\n")
    writer.write("y:{&{{one\nwrite}}} z")
    writer.flush()
    assert out.getvalue() == (
        "x:{&{{[secret]\n[secret]}}} [secret]\nvisible\ny:{&{{[secret]\n[secret]}}} z"
    )


@given(
    secret=st.text(min_size=MIN_SECRET_LENGTH, max_size=30).filter(lambda s: s.strip() == s),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
    encode=st.sampled_from(
        [
            lambda s: s,
            lambda s: json.dumps(s)[1:-1],
            lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
            lambda s: repr(s)[1:-1],
            lambda s: base64.b64encode(s.encode("utf-8", "surrogatepass")).decode(),
        ]
    ),
)
def test_no_encoded_secret_survives_scrubbing(
    secret: str, before: str, after: str, encode: Callable[[str], str]
) -> None:
    printed = encode(secret)
    scrubbed = Redactor([secret]).scrub(before + printed + after)
    assert printed not in scrubbed.replace(SECRET_PLACEHOLDER, "\0")
