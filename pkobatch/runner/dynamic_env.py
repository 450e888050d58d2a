"""PKO's dynamic environment: variables a template's init container writes, for Pulumi.

PKO sets ``$PULUMI_ENV`` to ``/share/.env`` in every container of a workspace pod; a
container may append dotenv lines to that file (``PULUMI_CONFIG_PASSPHRASE=...``), and PKO's
agent passes the variables to every Pulumi command (a missing file means none). The Job
builder sets the variable the same way (``pkobatch.controller.job_builder``); the runner reads the
file here, before Pulumi starts. Every value counts as secret: the file is where a template
puts what it fetched from a vault.

The format is the dotenv subset PKO's manifests use: ``KEY=VALUE`` lines, an optional
``export`` before the key, ``#`` comments (a whole line, or after an unquoted value and a
space), empty lines, values in single quotes (taken as written) or double quotes (with
``\\n``, ``\\"`` and ``\\\\`` escapes). A later line wins for the same key. Values are not
expanded (``$OTHER`` stays as written) and a quoted value ends on its own line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pkobatch.api.run import DYNAMIC_ENV_VAR
from pkobatch.runner.failures import RunFailure

_LINE: Final = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*")
_DOUBLE_QUOTED_ESCAPES: Final = {"n": "\n", '"': '"', "\\": "\\"}


def _unquote_double(body: str) -> str | None:
    """The value of a double-quoted ``body`` (after the opening quote, up to the line's end,
    trailing comment allowed); None when it has no closing quote."""
    value: list[str] = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == '"':
            rest = body[index + 1 :].strip()
            return "".join(value) if not rest or rest.startswith("#") else None
        if char == "\\" and index + 1 < len(body):
            following = body[index + 1]
            value.append(_DOUBLE_QUOTED_ESCAPES.get(following, "\\" + following))
            index += 2
            continue
        value.append(char)
        index += 1
    return None


def _value(raw: str) -> str | None:
    """The value of ``raw`` (what follows ``=``); None when it is malformed."""
    if raw.startswith("'"):
        closing = raw.find("'", 1)
        if closing < 0:
            return None
        rest = raw[closing + 1 :].strip()
        return raw[1:closing] if not rest or rest.startswith("#") else None
    if raw.startswith('"'):
        return _unquote_double(raw[1:])
    return re.split(r"\s+#", raw, maxsplit=1)[0].rstrip()


def parse_dynamic_env(text: str, path: str) -> dict[str, str]:
    """The variables of dotenv ``text``, read from ``path`` (named in errors)."""
    variables: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        value = _value(match.group(2)) if match else None
        if match is None or value is None:
            raise RunFailure(
                "InvalidSpec",
                f"{path} line {number} (${DYNAMIC_ENV_VAR}, written by the pod's containers) "
                "is not a dotenv line: write KEY=VALUE, quoting a value with spaces or # as "
                "KEY='VALUE'",
            )
        variables[match.group(1)] = value
    return variables


def read_dynamic_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of the file ``$PULUMI_ENV`` names; none when it is unset or missing."""
    path = env.get(DYNAMIC_ENV_VAR)
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as error:
        raise RunFailure(
            "InvalidSpec", f"cannot read {path} (${DYNAMIC_ENV_VAR}): {error}"
        ) from None
    return parse_dynamic_env(text, path)
