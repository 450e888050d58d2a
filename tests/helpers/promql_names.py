"""The metric names a PromQL expression reads, for tests that check every metric the alerts
and the dashboard name is one the controller exports.

A small scanner, not a parser: it drops string literals, label matchers, range selectors and
grouping clauses, then takes the identifiers that are neither functions (followed by ``(``)
nor keywords. ``promtool check rules`` separately proves each expression parses.
"""

from __future__ import annotations

import re
from typing import Final

_STRINGS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS: Final = re.compile(r"\{[^}]*\}")
_RANGES: Final = re.compile(r"\[[^\]]*\]")
_GROUPING: Final = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_IDENTIFIER: Final = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {
        match.group(1)
        for match in _IDENTIFIER.finditer(text)
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS
    }
