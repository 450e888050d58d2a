"""Kubernetes timestamps (RFC 3339, whole seconds, UTC) to and from ``datetime``, and the
``MicroTime`` of Leases and Events (microseconds)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
MICRO_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(TIME_FORMAT)


def format_micro_time(moment: datetime) -> str:
    """A ``MicroTime`` (``Lease.spec.renewTime``, ``Event.eventTime``)."""
    return moment.astimezone(UTC).strftime(MICRO_TIME_FORMAT)


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (None when absent or unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
