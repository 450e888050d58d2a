"""The loopback plugin server (bench/run_cache.py, the run cache's e2e tests): the archive
Pulumi asks for, and the download count."""

from __future__ import annotations

import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pkobatch.dev.plugin_server import (
    PluginServer,
    pack_plugin,
    plugin_archive_name,
    requested_file,
)

# What `pulumi plugin install resource kubernetes 4.25.0-alpha.1768448096+f47bc2d6 --server
# http://127.0.0.1:PORT/` (Pulumi 3.259.0) requested.
RECORDED_REQUEST = (
    "/pulumi-resource-kubernetes-v4.25.0-alpha.1768448096%2Bf47bc2d6-linux-amd64.tar.gz"
)
VERSION = "4.25.0-alpha.1768448096+f47bc2d6"


def test_the_archive_is_the_file_pulumi_requests() -> None:
    name = plugin_archive_name("kubernetes", VERSION)
    assert requested_file(RECORDED_REQUEST) == name
    assert requested_file(RECORDED_REQUEST + "?x=1") == name
    assert plugin_archive_name("kubernetes", "4.34.2", "darwin", "arm64") == (
        "pulumi-resource-kubernetes-v4.34.2-darwin-arm64.tar.gz"
    )


def test_the_archive_holds_the_binary_at_its_root(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "pulumi-resource-kubernetes"
    binary.parent.mkdir()
    binary.write_bytes(b"#!/bin/sh\n")
    binary.chmod(0o755)
    archive = pack_plugin(binary, tmp_path, VERSION)
    assert archive.name == plugin_archive_name("kubernetes", VERSION)
    with tarfile.open(archive) as packed:
        members = packed.getmembers()
    assert [(m.name, m.mode & 0o777) for m in members] == [("pulumi-resource-kubernetes", 0o755)]


def test_the_server_counts_downloads_of_the_archive_only(tmp_path: Path) -> None:
    archive = tmp_path / plugin_archive_name("kubernetes", VERSION)
    archive.write_bytes(b"archive bytes")
    with PluginServer(archive) as server:
        base = server.url.rstrip("/")
        for _ in range(2):
            with urllib.request.urlopen(base + RECORDED_REQUEST, timeout=10) as response:
                assert response.read() == b"archive bytes"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/pulumi-resource-other-v1.0.0.tar.gz", timeout=10)
        missing.value.close()
    assert missing.value.code == 404
    assert server.downloads == 2
    assert server.other_requests == ["/pulumi-resource-other-v1.0.0.tar.gz"]
