"""Keeping secret values out of everything a run writes: logs, messages and the result.

Two mechanisms work together:

- **Pulumi's own masking.** Outputs are read with ``pulumi stack output --json`` *without*
  ``--show-secrets``: Pulumi replaces every secret, at any depth, with ``"[secret]"``, so the
  result never holds a secret output's plaintext. Only ``spec.exportOutputs`` reads them in
  plaintext, and registers each with the redactor first (``pkobatch.runner.exports``).
- **Known values.** Every secret value the run was given (secret config, git credentials,
  environment variables the snapshot names as secret, Pulumi's own credentials) is replaced
  wherever it shows up: in program output, git and Pulumi error text, and inside output values
  a program exported without marking them secret.

Values shorter than ``MIN_SECRET_LENGTH`` are not searched for: replacing every ``"1"`` or
``"no"`` in a log would garble it without protecting anything worth protecting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pkobatch.api.run import SECRET_PLACEHOLDER

MIN_SECRET_LENGTH: Final = 4
# Credentials Pulumi itself reads from the environment; always treated as secret.
PULUMI_SECRET_ENV: Final = (
    "PULUMI_ACCESS_TOKEN",
    "PULUMI_CONFIG_PASSPHRASE",
)
# user:password@ (or token@) in http(s) URLs, e.g. a projectRepo with inline credentials.
_URL_USERINFO: Final = re.compile(r"(?i)\b(https?://)[^/\s@]+@")


def scrub_url_credentials(text: str) -> str:
    """Replace the user-info part of every http(s) URL in ``text`` with ``***``."""
    return _URL_USERINFO.sub(r"\1***@", text)


class Redactor:
    """Replaces known secret values in text and in JSON-like values."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._needles: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(*secrets)

    def add(self, *secrets: str | None) -> None:
        for secret in secrets:
            if not secret:
                continue
            candidates = {secret, secret.strip()}
            # Multi-line secrets (keys, certificates) also leak one line at a time.
            candidates.update(line.strip() for line in secret.splitlines())
            self._needles.update(c for c in candidates if len(c) >= MIN_SECRET_LENGTH)
        # Longest first, so a secret that contains another is replaced whole.
        ordered = sorted(self._needles, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def add_env(self, env: Mapping[str, str], names: Iterable[str]) -> None:
        """Treat the values of the environment variables ``names`` as secrets."""
        self.add(*(env.get(name) for name in names))

    def scrub(self, text: str) -> str:
        """``text`` with every known secret and every URL credential replaced."""
        if self._pattern is not None:
            text = self._pattern.sub(SECRET_PLACEHOLDER, text)
        return scrub_url_credentials(text)

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
