"""PKO's dynamic environment file ($PULUMI_ENV): parsing and reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkobatch.runner.dynamic_env import parse_dynamic_env, read_dynamic_env
from pkobatch.runner.failures import RunFailure


def test_dotenv_lines_as_pkos_manifests_write_them() -> None:
    text = "\n".join(
        [
            "# written by the init container",
            "",
            "PULUMI_CONFIG_PASSPHRASE=test",
            "export AWS_REGION=eu-west-1",
            "  SPACED = value with spaces   # a comment",
            "SINGLE='kept # as $written\\n'",
            'DOUBLE="line\\none \\"quoted\\" \\\\ # not a comment"  # a comment',
            "EMPTY=",
            "HASH=a#b",
            "PULUMI_CONFIG_PASSPHRASE=later wins",
        ]
    )
    assert parse_dynamic_env(text, "/share/.env") == {
        "PULUMI_CONFIG_PASSPHRASE": "later wins",
        "AWS_REGION": "eu-west-1",
        "SPACED": "value with spaces",
        "SINGLE": "kept # as $written\\n",
        "DOUBLE": 'line\none "quoted" \\ # not a comment',
        "EMPTY": "",
        "HASH": "a#b",
    }


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("A=1\nnot a variable\n", 2),
        ("\n\n1A=x", 3),
        ("A='unterminated", 1),
        ('A="unterminated', 1),
        ("A='x' trailing", 1),
        ("=x", 1),
    ],
)
def test_an_invalid_line_names_the_file_and_line(text: str, line: int) -> None:
    with pytest.raises(RunFailure) as raised:
        parse_dynamic_env(text, "/share/.env")
    assert raised.value.reason == "InvalidSpec"
    assert raised.value.message.startswith(f"/share/.env line {line} ($PULUMI_ENV")
    assert "KEY=VALUE" in raised.value.message


def test_an_invalid_line_is_not_quoted_in_the_message() -> None:
    with pytest.raises(RunFailure) as raised:
        parse_dynamic_env("PASSWORD hunter2-secret", "/share/.env")
    assert "hunter2-secret" not in raised.value.message


def test_the_file_pulumi_env_names_is_read(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("PULUMI_CONFIG_PASSPHRASE=from-init\n")
    assert read_dynamic_env({"PULUMI_ENV": str(path)}) == {"PULUMI_CONFIG_PASSPHRASE": "from-init"}


def test_no_variable_and_no_file_mean_no_dynamic_environment(tmp_path: Path) -> None:
    assert read_dynamic_env({}) == {}
    assert read_dynamic_env({"PULUMI_ENV": str(tmp_path / "missing")}) == {}


def test_an_unreadable_file_fails_the_run_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RunFailure) as raised:
        read_dynamic_env({"PULUMI_ENV": str(tmp_path)})  # a directory
    assert raised.value.reason == "InvalidSpec"
    assert f"cannot read {tmp_path} ($PULUMI_ENV)" in raised.value.message
