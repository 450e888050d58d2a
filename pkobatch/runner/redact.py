"""Keeping secret values out of everything a run writes: logs, messages and the result.

Three mechanisms work together:

- **Pulumi's own masking.** Outputs are read with ``pulumi stack output --json`` *without*
  ``--show-secrets``: Pulumi replaces every secret, at any depth, with ``"[secret]"``, so the
  result never holds a secret output's plaintext. Only ``spec.exportOutputs`` reads them in
  plaintext, and registers each with the redactor first (``pkobatch.runner.exports``).
- **Known values, in every form they are printed in.** Every secret value the run was given
  (secret config, git credentials, environment variables the snapshot names as secret,
  Pulumi's own credentials) is replaced wherever it shows up: in program output, git and
  Pulumi error text, and inside output values a program exported without marking them
  secret. Each value is looked for as it is, JSON string-escaped (Python's and Go's
  ``encoding/json`` rules), Go-quoted (``strconv.Quote`` and ``QuoteToASCII``, what ``%q``
  prints), Python-quoted (``repr``, what a program's traceback prints) and base64-encoded
  (standard and URL-safe alphabets, at each of the three alignments a value can have inside
  a longer encoded text); each line of a multi-line value counts as a value of its own.
- **Secrets Pulumi prints itself.** The engine formats a property value with Go's ``%v``
  in some errors (an update that violates its saved plan: ``properties changed:
  ++metadata[{map[annotations:{map[tag:{&{{VALUE}}}]}]}]``), and there a secret is a
  pointer to ``resource.Secret``: ``&{{VALUE}}``. Such a value may be one this run never
  received — the saved plan holds the stack's inputs as they were at the preview — so it
  is recognised by its shape, whatever it holds: everything from ``&{{`` to the braces that
  close it is replaced. A value that spans lines stays open from one line to the next of
  the same stream (``scrub_stream``).

Short values: a value of ``MIN_SECRET_LENGTH`` characters or more is replaced wherever it
appears, even inside a word. A value of 1 to 3 characters is replaced only where it stands
alone (no letter, digit or underscore right before or after it): replacing every ``"1"``
or ``"no"`` inside other words would garble the log without protecting anything. A short
value can still be guessed from its context (``Resources: [secret] unchanged``); it is no
secret worth the name.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pkobatch.api.run import SECRET_PLACEHOLDER

MIN_SECRET_LENGTH: Final = 4
# A base64 form shorter than this could match unrelated encoded text by chance.
MIN_ENCODED_LENGTH: Final = 8
# Credentials Pulumi itself reads from the environment; always treated as secret.
PULUMI_SECRET_ENV: Final = (
    "PULUMI_ACCESS_TOKEN",
    "PULUMI_CONFIG_PASSPHRASE",
)
# Where Pulumi reads the passphrase from instead; the file's content is secret too.
PASSPHRASE_FILE_ENV: Final = "PULUMI_CONFIG_PASSPHRASE_FILE"
# user:password@ (or token@) in http(s) URLs, e.g. a projectRepo with inline credentials.
_URL_USERINFO: Final = re.compile(r"(?i)\b(https?://)[^/\s@]+@")
# How Go's %v prints a *resource.Secret: a pointer (&) to a struct ({...}) whose only field
# is a PropertyValue, whose String() is {VALUE}.
_GO_SECRET_OPEN: Final = "&{{"
_GO_SECRET_CLOSE: Final = "}}"
_GO_ESCAPES: Final = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}
# What Go's encoding/json escapes beyond what Python's json module does (HTML-safe output).
_GO_JSON_ESCAPES: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
# Undecodable bytes of an environment variable (os.environ's surrogateescape).
_ESCAPED_BYTES: Final = range(0xDC80, 0xDD00)


def scrub_url_credentials(text: str) -> str:
    """Replace the user-info part of every http(s) URL in ``text`` with ``***``."""
    return _URL_USERINFO.sub(r"\1***@", text)


def go_quoted(value: str, *, ascii_only: bool = False) -> str:
    """``value`` as Go's ``strconv.Quote`` (``QuoteToASCII`` with ``ascii_only``) prints it,
    without the surrounding quotes."""
    out: list[str] = []
    for char in value:
        code = ord(char)
        if char in _GO_ESCAPES:
            out.append(_GO_ESCAPES[char])
        elif code in _ESCAPED_BYTES:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x80 or (not ascii_only and char.isprintable()):
            out.append(char)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


def _json_escaped(value: str) -> list[str]:
    """``value`` as JSON encoders print it inside a string, without the quotes."""
    escaped = json.dumps(value, ensure_ascii=False)[1:-1]
    go_json = escaped
    for char, escape in _GO_JSON_ESCAPES.items():
        go_json = go_json.replace(char, escape)
    return [json.dumps(value)[1:-1], escaped, go_json]


def _base64_forms(value: str) -> list[str]:
    """The base64 texts that show ``value``: its whole encoding, and at each alignment the
    part that does not depend on the bytes around it (the last four characters may hold
    padding or bits of what follows)."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate from JSON, not an undecodable byte
        raw = value.encode("utf-8", "surrogatepass")
    forms: list[str] = []
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode("ascii")
        forms += [whole, whole.rstrip("=")]
        for offset, skip in ((0, 0), (1, 2), (2, 3)):
            forms.append(encode(b"\0" * offset + raw).decode("ascii")[skip:-4])
    return [form for form in forms if len(form) >= MIN_ENCODED_LENGTH]


def printed_forms(value: str) -> set[str]:
    """Every text that shows ``value`` when a program, git or Pulumi prints it."""
    forms = {value, go_quoted(value), go_quoted(value, ascii_only=True), repr(value)[1:-1]}
    forms.update(_json_escaped(value))
    forms.update(_base64_forms(value))
    return forms


def _close_go_secret(text: str, start: int, depth: int) -> tuple[int, int]:
    """Where the braces open at ``depth`` close in ``text`` from ``start``: the index after
    the closing brace and 0, or the end of ``text`` and the depth still open."""
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index + 1, 0
    return len(text), depth


def redact_go_secrets(text: str, depth: int = 0) -> tuple[str, int]:
    """``text`` with every Go-printed secret (``&{{...}}``) replaced; ``depth``: braces of
    one left open by the text before (0: none). Returns the depth left open at the end."""
    parts: list[str] = []
    position = 0
    if depth:
        position, depth = _close_go_secret(text, 0, depth)
        parts.append(SECRET_PLACEHOLDER + ("" if depth else _GO_SECRET_CLOSE))
    while not depth:
        start = text.find(_GO_SECRET_OPEN, position)
        if start < 0:
            break
        parts.append(text[position:start])
        # The braces counted from the struct's, one character after the "&".
        position, depth = _close_go_secret(text, start + 1, 0)
        parts.append(_GO_SECRET_OPEN + SECRET_PLACEHOLDER + ("" if depth else _GO_SECRET_CLOSE))
    parts.append(text[position:])
    return "".join(parts), depth


class Redactor:
    """Replaces secret values in text and in JSON-like values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._forms: set[str] = set()
        self._short_forms: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        for secret in secrets:
            if not secret:
                continue
            for value in {secret, secret.strip()} - {""}:
                known = self._forms if len(value) >= MIN_SECRET_LENGTH else self._short_forms
                known.update(printed_forms(value))
            lines = [line.strip() for line in secret.splitlines()]
            if len(lines) > 1:
                # Multi-line secrets (keys, certificates) also leak one line at a time.
                for line in lines:
                    if len(line) >= MIN_SECRET_LENGTH:
                        self._forms.update(printed_forms(line))
        alternatives = []
        if self._forms:
            # Longest first, so a secret that contains another is replaced whole.
            ordered = sorted(self._forms, key=len, reverse=True)
            alternatives.append("|".join(map(re.escape, ordered)))
        if self._short_forms:
            ordered = sorted(self._short_forms, key=len, reverse=True)
            alternatives.append(r"(?<!\w)(?:" + "|".join(map(re.escape, ordered)) + r")(?!\w)")
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

    def _known(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(SECRET_PLACEHOLDER, text)

    def scrub(self, text: str) -> str:
        """``text`` with every secret and every URL credential replaced."""
        return self.scrub_stream(text, 0)[0]

    def scrub_stream(self, text: str, open_depth: int) -> tuple[str, int]:
        """``scrub`` for the next lines of a stream: ``open_depth`` is what this returned for
        the stream's previous lines (0 at its start), so a Go-printed secret spanning lines
        is replaced on each of them; returns the depth its last line leaves open."""
        scrubbed, depth = redact_go_secrets(self._known(text), open_depth)
        return scrub_url_credentials(scrubbed), depth

    def contains_secret(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def mask_value(self, value: Any) -> Any:
        """A copy of a JSON-like value where every string holding a secret is ``[secret]``."""
        if isinstance(value, str):
            return SECRET_PLACEHOLDER if self.contains_secret(value) else value
        if isinstance(value, Mapping):
            return {key: self.mask_value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.mask_value(item) for item in value]
        return value


def secret_output_keys(masked_outputs: Mapping[str, Any]) -> list[str]:
    """Top-level outputs that are secret as a whole, from Pulumi's masked output JSON."""
    return sorted(key for key, value in masked_outputs.items() if value == SECRET_PLACEHOLDER)
