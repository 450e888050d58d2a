"""Flux artifacts in the runner: digest verified, size bounded, nothing escapes on unpack."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pkobatch.api.run import FluxArtifact
from pkobatch.runner.artifact import MAX_ARTIFACT_BYTES_ENV, fetch
from pkobatch.runner.failures import RunFailure


def tarball(entries: dict[str, bytes], *, link: tuple[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type = tarfile.SYMTYPE
            info.linkname = link[1]
            tar.addfile(info)
    return buffer.getvalue()


@pytest.fixture
def served() -> Iterator[dict[str, bytes]]:
    """Files served over loopback HTTP, by path."""
    files: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def do_GET(self) -> None:
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    files["port"] = str(server.server_address[1]).encode()
    yield files
    server.shutdown()
    server.server_close()


def artifact(served: dict[str, bytes], body: bytes, digest: str | None = None) -> FluxArtifact:
    served["/a.tar.gz"] = body
    return FluxArtifact(
        kind="GitRepository",
        name="repo",
        url=f"http://127.0.0.1:{served['port'].decode()}/a.tar.gz",
        revision="main@sha1:abc",
        digest=digest if digest is not None else "sha256:" + hashlib.sha256(body).hexdigest(),
    )


def test_a_verified_artifact_is_unpacked(served: dict[str, bytes], tmp_path: Path) -> None:
    body = tarball({"app/Pulumi.yaml": b"name: x\nruntime: yaml\n"})
    unpacked = fetch(artifact(served, body), tmp_path, {})
    assert (unpacked / "app" / "Pulumi.yaml").read_text().startswith("name: x")


def test_a_wrong_digest_is_refused_with_both_digests(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    body = tarball({"Pulumi.yaml": b"x"})
    wrong = "sha256:" + "0" * 64
    with pytest.raises(RunFailure) as failure:
        fetch(artifact(served, body, wrong), tmp_path, {})
    assert failure.value.reason == "SourceUnavailable"
    assert wrong in failure.value.message
    assert hashlib.sha256(body).hexdigest() in failure.value.message
    assert not (tmp_path / "source").exists()


def test_an_artifact_without_a_verifiable_digest_is_not_run(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    with pytest.raises(RunFailure, match="unverified artifact is not run"):
        fetch(artifact(served, tarball({"a": b"x"}), ""), tmp_path, {})


@pytest.mark.parametrize(
    ("entries", "link"),
    [
        ({"../escape.txt": b"x"}, None),
        ({}, ("link", "/etc/passwd")),
        ({}, ("link", "../../outside")),
    ],
)
def test_entries_that_escape_are_refused(
    served: dict[str, bytes],
    tmp_path: Path,
    entries: dict[str, bytes],
    link: tuple[str, str] | None,
) -> None:
    with pytest.raises(RunFailure, match="would escape its directory"):
        fetch(artifact(served, tarball(entries, link=link)), tmp_path, {})
    assert not (tmp_path / "escape.txt").exists()


def test_absolute_paths_land_inside_the_destination(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    unpacked = fetch(artifact(served, tarball({"/pkobatch-abs/a.txt": b"x"})), tmp_path, {})
    assert (unpacked / "pkobatch-abs" / "a.txt").read_bytes() == b"x"
    assert not Path("/pkobatch-abs").exists()


def test_the_size_limit_applies_to_download_and_unpacked_size(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    big = tarball({"big": b"\0" * 100_000})
    assert len(big) < 2_000  # compresses well: only the unpacked size is over the limit
    with pytest.raises(RunFailure, match="unpacks to 100000 bytes"):
        fetch(artifact(served, big), tmp_path, {MAX_ARTIFACT_BYTES_ENV: "50000"})
    (tmp_path / "again").mkdir()
    with pytest.raises(RunFailure, match="larger than 100 bytes"):
        fetch(artifact(served, big), tmp_path / "again", {MAX_ARTIFACT_BYTES_ENV: "100"})
