"""Kubernetes label selectors in their string form (``kubectl -l``): parsed, validated and
matched against an object's labels, as the API server's ``labels.Parse`` does.

The controller parses ``PKOBATCH_NAMESPACE_SELECTOR`` at start-up, so a typo stops it with
a message instead of leaving it running with no namespace selected, and matches each
Namespace's labels itself: a Namespace's labels can change, and the change decides whether
its Stacks are reconciled (``runtime.manager``).

Requirements are separated by commas and all must hold: ``key`` and ``!key`` (exists, does
not exist), ``key=value`` / ``key==value``, ``key!=value`` (also true without the label),
``key in (a,b)``, ``key notin (a,b)`` (also true without the label), ``key>N``, ``key<N``
(integers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

# A label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
_NAME: Final = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX: Final = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_KEY: Final = rf"(?:{_PREFIX}/)?{_NAME}"
_VALUE: Final = re.compile(rf"(?:{_NAME})?")
_EXISTS: Final = re.compile(rf"(!?)\s*({_KEY})")
_SET: Final = re.compile(rf"({_KEY})\s+(in|notin)\s*\(([^()]*)\)")
_COMPARE: Final = re.compile(rf"({_KEY})\s*(==|=|!=|>|<)\s*(\S*)")
EXAMPLE: Final = "e.g. team=infra,env in (prod,staging),!legacy"


class InvalidSelector(ValueError):
    """The selector's text is not a label selector; the message says which part and why."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # exists, !exists, =, !=, in, notin, >, <
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return value is not None
            case "!exists":
                return value is None
            case "=" | "in":
                return value in self.values
            case "!=" | "notin":
                return value not in self.values
        if value is None or not re.fullmatch(r"-?\d+", value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if self.operator == ">" else int(value) < bound


@dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold; the empty selector matches every object."""

    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)


def parse_selector(text: str) -> LabelSelector:
    """``text`` parsed; raises ``InvalidSelector`` naming the requirement that is wrong."""
    return LabelSelector(tuple(_requirement(part) for part in _split(text)))


def _split(text: str) -> list[str]:
    """The requirements: top-level comma-separated parts (a set's commas stay inside it)."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "()":
            depth += 1 if char == "(" else -1
            if depth not in (0, 1):
                raise InvalidSelector(f"{text!r}: unbalanced parentheses ({EXAMPLE})")
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise InvalidSelector(f"{text!r}: unbalanced parentheses ({EXAMPLE})")
    parts.append(text[start:])
    if len(parts) == 1 and not parts[0].strip():
        return []
    return [part.strip() for part in parts]


def _requirement(part: str) -> Requirement:
    if match := _SET.fullmatch(part):
        key, operator, listed = match.groups()
        values = tuple(value.strip() for value in listed.split(","))
        return Requirement(key, operator, _checked(part, values))
    if match := _COMPARE.fullmatch(part):
        key, operator, value = match.groups()
        if operator in (">", "<"):
            if not re.fullmatch(r"-?\d+", value):
                raise InvalidSelector(f"{part!r}: {operator} compares with an integer")
            return Requirement(key, operator, (value,))
        return Requirement(key, "=" if operator == "==" else operator, _checked(part, (value,)))
    if match := _EXISTS.fullmatch(part):
        negated, key = match.groups()
        return Requirement(key, "!exists" if negated else "exists")
    raise InvalidSelector(
        f"{part!r} is not a requirement: KEY, !KEY, KEY=VALUE, KEY!=VALUE, KEY in (V1,V2) or "
        f"KEY notin (V1,V2), where a KEY is [PREFIX/]NAME ({EXAMPLE})"
    )


def _checked(part: str, values: tuple[str, ...]) -> tuple[str, ...]:
    wrong = [value for value in values if not _VALUE.fullmatch(value)]
    if wrong:
        raise InvalidSelector(
            f"{part!r}: {', '.join(map(repr, wrong))} is not a label value (at most 63 "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )
    return values
