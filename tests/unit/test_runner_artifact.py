"""Flux artifacts in the runner: digest (or legacy checksum) verified, an artifact with
neither run only when allowed, size bounded, nothing escapes on unpack."""

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
from pkobatch.runner.artifact import (
    ALLOW_UNVERIFIED_ENV,
    MAX_ARTIFACT_BYTES_ENV,
    MAX_UNTAR_SIZE_ENV,
    fetch,
)
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


def artifact(
    served: dict[str, bytes], body: bytes, digest: str | None = None, checksum: str = ""
) -> FluxArtifact:
    served["/a.tar.gz"] = body
    return FluxArtifact(
        kind="GitRepository",
        name="repo",
        url=f"http://127.0.0.1:{served['port'].decode()}/a.tar.gz",
        revision="main@sha1:abc",
        digest=digest if digest is not None else "sha256:" + hashlib.sha256(body).hexdigest(),
        checksum=checksum,
    )


PROGRAM = {"app/Pulumi.yaml": b"name: x\nruntime: yaml\n"}


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


def test_an_artifact_without_digest_or_checksum_is_not_run_by_default(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    warnings: list[str] = []
    with pytest.raises(RunFailure) as failure:
        fetch(artifact(served, tarball(PROGRAM), ""), tmp_path, {}, warnings.append)
    assert failure.value.reason == "SourceUnavailable"
    assert "has neither a digest nor a checksum" in failure.value.message
    assert f"{ALLOW_UNVERIFIED_ENV}=true" in failure.value.message  # says how to run it
    assert not (tmp_path / "source").exists() and warnings == []


def test_an_artifact_without_digest_or_checksum_runs_unverified_when_allowed_and_says_so(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    warnings: list[str] = []
    env = {ALLOW_UNVERIFIED_ENV: "true"}
    unpacked = fetch(artifact(served, tarball(PROGRAM), ""), tmp_path, env, warnings.append)
    assert (unpacked / "app" / "Pulumi.yaml").read_text().startswith("name: x")
    assert len(warnings) == 1
    assert "GitRepository repo" in warnings[0] and "UNVERIFIED" in warnings[0]


def test_a_legacy_checksum_is_verified_when_there_is_no_digest(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    body = tarball(PROGRAM)
    checksum = hashlib.sha256(body).hexdigest().upper()
    warnings: list[str] = []
    unpacked = fetch(artifact(served, body, "", checksum), tmp_path, {}, warnings.append)
    assert (unpacked / "app" / "Pulumi.yaml").exists()
    assert warnings == []


def test_a_mismatched_checksum_is_refused_even_when_unverified_artifacts_are_allowed(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    body = tarball(PROGRAM)
    with pytest.raises(RunFailure) as failure:
        fetch(artifact(served, body, "", "0" * 64), tmp_path, {ALLOW_UNVERIFIED_ENV: "true"})
    assert failure.value.reason == "SourceUnavailable"
    assert f"does not match its checksum: the source reports checksum {'0' * 64}" in (
        failure.value.message
    )
    assert hashlib.sha256(body).hexdigest() in failure.value.message
    assert not (tmp_path / "source").exists()


def test_a_digest_without_an_algorithm_is_a_sha256_digest(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    body = tarball(PROGRAM)
    fetch(artifact(served, body, hashlib.sha256(body).hexdigest()), tmp_path, {})
    (tmp_path / "again").mkdir()
    with pytest.raises(RunFailure, match="does not match its digest"):
        fetch(artifact(served, body, "f" * 64), tmp_path / "again", {})


def test_a_digest_of_an_algorithm_the_runner_lacks_is_refused(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    with pytest.raises(RunFailure, match="only sha256, sha384, sha512 digests"):
        fetch(artifact(served, tarball(PROGRAM), "blake3:" + "a" * 64), tmp_path, {})


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


def test_pkos_untar_limit_bounds_the_unpacked_size_and_minus_one_lifts_it(
    served: dict[str, bytes], tmp_path: Path
) -> None:
    big = tarball({"big": b"\0" * 100_000})
    with pytest.raises(RunFailure, match=rf"more than 50000 \({MAX_UNTAR_SIZE_ENV}\)"):
        fetch(artifact(served, big), tmp_path, {MAX_UNTAR_SIZE_ENV: "50000"})
    # It replaces PKOBATCH_MAX_ARTIFACT_BYTES for the unpacked size only.
    env = {MAX_ARTIFACT_BYTES_ENV: "50000", MAX_UNTAR_SIZE_ENV: "-1"}
    (tmp_path / "unbounded").mkdir()
    unpacked = fetch(artifact(served, big), tmp_path / "unbounded", env)
    assert (unpacked / "big").stat().st_size == 100_000
    (tmp_path / "raised").mkdir()
    raised = {MAX_ARTIFACT_BYTES_ENV: "50000", MAX_UNTAR_SIZE_ENV: "200000"}
    assert (fetch(artifact(served, big), tmp_path / "raised", raised) / "big").exists()


@pytest.mark.parametrize(
    ("env", "complaint"),
    [
        ({MAX_UNTAR_SIZE_ENV: "0"}, r"or -1 \(no bound\)"),
        ({MAX_UNTAR_SIZE_ENV: "-2"}, r"or -1 \(no bound\)"),
        ({MAX_UNTAR_SIZE_ENV: "100MB"}, r"or -1 \(no bound\)"),
        ({MAX_ARTIFACT_BYTES_ENV: "-1"}, "is not a positive number of bytes"),
    ],
)
def test_a_wrong_limit_fails_the_run_as_an_invalid_spec(
    served: dict[str, bytes], tmp_path: Path, env: dict[str, str], complaint: str
) -> None:
    with pytest.raises(RunFailure, match=complaint) as failure:
        fetch(artifact(served, tarball(PROGRAM)), tmp_path, env)
    assert failure.value.reason == "InvalidSpec"
