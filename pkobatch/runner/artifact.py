"""Fetching a Flux source's artifact: download, verify its digest, unpack safely.

The artifact is the tarball (``.tar.gz``) Flux's source-controller serves at
``status.artifact.url``. The run trusts it only when the bytes downloaded have the digest
the controller recorded in the snapshot (``<algorithm>:<hex>``, as in Flux), so a
tampered or replaced file is refused, not run.

Unpacking refuses what could escape the destination or exhaust the pod: absolute paths,
``..``, links pointing outside, device files (``tarfile``'s ``data`` filter), and more than
``limit`` bytes downloaded or unpacked (``PKOBATCH_MAX_ARTIFACT_BYTES``, default 512 MiB).
"""

from __future__ import annotations

import hashlib
import tarfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pkobatch.api.run import FluxArtifact
from pkobatch.runner.failures import RunFailure

MAX_ARTIFACT_BYTES_ENV: Final = "PKOBATCH_MAX_ARTIFACT_BYTES"
DEFAULT_MAX_ARTIFACT_BYTES: Final = 512 * 1024 * 1024
DOWNLOAD_TIMEOUT_SECONDS: Final = 120.0
CHUNK: Final = 1024 * 1024
ALGORITHMS: Final = ("sha256", "sha384", "sha512")


def artifact_limit(env: Mapping[str, str]) -> int:
    raw = env.get(MAX_ARTIFACT_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ARTIFACT_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise RunFailure(
            "InvalidSpec", f"{MAX_ARTIFACT_BYTES_ENV}={raw!r} is not a positive number of bytes"
        )
    return int(raw)


def _source(artifact: FluxArtifact) -> str:
    return f"the artifact of {artifact.kind} {artifact.name} (revision {artifact.revision})"


def download(artifact: FluxArtifact, target: Path, limit: int) -> None:
    """Download ``artifact`` to ``target``, verifying its size bound and digest."""
    algorithm, _, expected = artifact.digest.partition(":")
    if algorithm not in ALGORITHMS or not expected:
        raise RunFailure(
            "SourceUnavailable",
            f"{_source(artifact)} has digest {artifact.digest or '(none)'}: only "
            f"{', '.join(ALGORITHMS)} digests can be verified, and an unverified artifact "
            "is not run",
        )
    hasher = hashlib.new(algorithm)
    size = 0
    try:
        with (
            urllib.request.urlopen(artifact.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response,
            target.open("wb") as out,
        ):
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise RunFailure(
                        "SourceUnavailable",
                        f"{_source(artifact)} is larger than {limit} bytes "
                        f"({MAX_ARTIFACT_BYTES_ENV})",
                    )
                hasher.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RunFailure(
            "SourceUnavailable",
            f"cannot download {_source(artifact)} from {artifact.url}: "
            f"{getattr(exc, 'reason', exc)}",
        ) from None
    if hasher.hexdigest() != expected.lower():
        raise RunFailure(
            "SourceUnavailable",
            f"{_source(artifact)} does not match its digest: the source reports "
            f"{artifact.digest}, the {size} bytes downloaded from {artifact.url} are "
            f"{algorithm}:{hasher.hexdigest()}; not running it",
        )


def unpack(archive: Path, destination: Path, limit: int, what: str) -> None:
    """Unpack a ``.tar.gz`` into ``destination``; nothing may land outside it."""
    destination.mkdir(mode=0o700)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = tar.getmembers()
            total = sum(m.size for m in members if m.isfile())
            if total > limit:
                raise RunFailure(
                    "SourceUnavailable",
                    f"{what} unpacks to {total} bytes, more than {limit} "
                    f"({MAX_ARTIFACT_BYTES_ENV})",
                )
            tar.extractall(destination, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise RunFailure(
            "SourceUnavailable", f"{what} holds an entry that would escape its directory: {exc}"
        ) from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RunFailure("SourceUnavailable", f"{what} is not a readable .tar.gz: {exc}") from None


def fetch(artifact: FluxArtifact, directory: Path, env: Mapping[str, str]) -> Path:
    """``artifact`` downloaded, verified and unpacked into ``directory/source``."""
    limit = artifact_limit(env)
    archive = directory / "artifact.tar.gz"
    download(artifact, archive, limit)
    unpacked = directory / "source"
    unpack(archive, unpacked, limit, _source(artifact))
    archive.unlink()
    return unpacked
