"""One bound for every human-readable message pkobatch stores or posts.

Messages reach result ConfigMaps, Stack status (conditions, ``lastUpdate``,
``operationRequest``, ``lastDriftCheck``) and Events. The API server refuses a condition
message over 32 KiB, and an unbounded message (a spec with thousands of problems, a long
Pulumi error) would make every status write fail, so the Stack would never get a status.
Every such message goes through ``bound_message``.
"""

from __future__ import annotations

from typing import Final

# Far below the API server's 32 KiB condition-message limit, even at 4 bytes a character.
MAX_MESSAGE_CHARS: Final = 4096


def bound_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, keeping its start and (mostly) its end, where
    Python tracebacks and Pulumi put the actual error."""
    text = text.strip()
    if len(text) <= limit:
        return text
    marker = "\n[... {} characters omitted ...]\n"
    room = limit - len(marker.format(len(text)))
    if room <= 0:
        return text[:limit]
    head = room // 4
    tail = room - head
    omitted = len(text) - head - tail
    return text[:head] + marker.format(omitted) + text[len(text) - tail :]
