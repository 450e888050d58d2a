"""Go-style duration strings ("90s", "5m", "1h30m", "250ms"), as Kubernetes and Flux use them.

Used for settings, for ``prerequisites[].requirement.succeededWithinDuration`` and anywhere
a user writes a duration, so every place accepts the same syntax.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration; a bare number means seconds. Raises ValueError with the input."""
    value = text.strip()
    if not value:
        raise ValueError("empty duration; use e.g. '30s', '5m' or '1h30m'")
    sign = -1.0 if value.startswith("-") else 1.0
    body = value.lstrip("+-")
    if re.fullmatch(r"\d+(?:\.\d+)?", body):
        return _seconds(text, sign * float(body))
    position, seconds = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(body) or position == 0:
        raise ValueError(f"invalid duration {text!r}; use e.g. '30s', '5m' or '1h30m'")
    return _seconds(text, sign * seconds)


def _seconds(text: str, seconds: float) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long; use at most e.g. '8760h'") from None


def format_duration(delta: timedelta) -> str:
    """The shortest Go-style string for a duration, e.g. 5400s -> "1h30m"."""
    total = int(delta.total_seconds())
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    total = abs(total)
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{seconds}s" if seconds else "",
    ]
    return sign + "".join(parts)
