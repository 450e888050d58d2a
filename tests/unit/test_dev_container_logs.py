"""The node agent's container-log endpoint: request parsing and tailing (pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkobatch.dev.container_logs import BadLogRequest, LogRequest, parse_log_request, tail_offset


def test_requests_are_read_as_the_kubelet_reads_them() -> None:
    assert parse_log_request("/containerLogs/ns/pod-1/main?follow=true&tailLines=5") == (
        LogRequest("ns", "pod-1", "main", follow=True, tail_lines=5)
    )
    assert parse_log_request("/containerLogs/ns/pod-1/main?limitBytes=10") == (
        LogRequest("ns", "pod-1", "main", limit_bytes=10)
    )
    assert parse_log_request("/containerLogs/ns/pod-1") is None
    assert parse_log_request("/exec/ns/pod-1/main") is None


@pytest.mark.parametrize(
    "query", ["timestamps=true", "sinceSeconds=10", "previous=true", "tailLines=x", "tailLines=-1"]
)
def test_what_is_not_supported_is_refused_not_ignored(query: str) -> None:
    with pytest.raises(BadLogRequest):
        parse_log_request(f"/containerLogs/ns/pod/main?{query}")


@pytest.mark.parametrize(
    ("text", "lines", "expected"),
    [
        ("a\nb\nc\n", 2, "b\nc\n"),
        ("a\nb\nc", 2, "b\nc"),
        ("a\nb\nc\n", 5, "a\nb\nc\n"),
        ("a\nb\nc\n", 0, ""),
        ("", 3, ""),
    ],
)
def test_tail_offset_starts_the_last_lines(
    tmp_path: Path, text: str, lines: int, expected: str
) -> None:
    path = tmp_path / "log"
    path.write_text(text)

    assert path.read_text()[tail_offset(path, lines) :] == expected
