"""Fetching a Flux source's artifact: download, verify its integrity, unpack safely.

The artifact is the tarball (``.tar.gz``) Flux's source-controller serves at
``status.artifact.url``. The run trusts it only when the bytes downloaded have the digest
the controller recorded in the snapshot, so a tampered or replaced file is refused, not run:

- ``digest`` ``<algorithm>:<hex>`` (Flux's source API v1, RFC-0005); a digest without an
  algorithm is a sha256 hex digest, as Flux's own fetcher (``fluxcd/pkg/http/fetch``) reads it;
- else ``checksum``, the sha256 hex digest source-controller published before ``digest``
  (its v1beta2 API, which PKO ignores: it runs nothing without ``digest``);
- neither (a third-party source kind, ``PKOBATCH_EXTRA_FLUX_SOURCE_KINDS``): refused like
  PKO does, unless the run's environment has ``PKOBATCH_ALLOW_UNVERIFIED_ARTIFACTS=true``;
  then it runs, and the run log says the artifact was not verified.

Unpacking refuses what could escape the destination or exhaust the pod: absolute paths,
``..``, links pointing outside, device files (``tarfile``'s ``data`` filter), more than
``PKOBATCH_MAX_ARTIFACT_BYTES`` downloaded (default 512 MiB), and more than that unpacked —
or than ``FLUX_MAX_UNTAR_SIZE_BYTES`` when set, PKO's setting (-1: no bound on the unpacked
size), which the controller gives to runs (``PKOBATCH_JOB__FLUX_MAX_UNTAR_SIZE_BYTES``).
"""

from __future__ import annotations

import hashlib
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pkobatch.api.run import MAX_UNTAR_SIZE_ENV, FluxArtifact
from pkobatch.runner.failures import RunFailure

MAX_ARTIFACT_BYTES_ENV: Final = "PKOBATCH_MAX_ARTIFACT_BYTES"
ALLOW_UNVERIFIED_ENV: Final = "PKOBATCH_ALLOW_UNVERIFIED_ARTIFACTS"
DEFAULT_MAX_ARTIFACT_BYTES: Final = 512 * 1024 * 1024
DOWNLOAD_TIMEOUT_SECONDS: Final = 120.0
CHUNK: Final = 1024 * 1024
ALGORITHMS: Final = ("sha256", "sha384", "sha512")


@dataclass(frozen=True)
class Limits:
    download: int  # bytes downloaded
    unpacked: int | None  # bytes unpacked (None: no bound)
    unpacked_setting: str  # the variable that set ``unpacked``, for messages


def artifact_limits(env: Mapping[str, str]) -> Limits:
    """The bounds of a run's artifact, from the run's environment."""
    raw = env.get(MAX_ARTIFACT_BYTES_ENV, "").strip()
    download = DEFAULT_MAX_ARTIFACT_BYTES
    if raw:
        if not raw.isdigit() or int(raw) <= 0:
            raise RunFailure(
                "InvalidSpec",
                f"{MAX_ARTIFACT_BYTES_ENV}={raw!r} is not a positive number of bytes",
            )
        download = int(raw)
    untar = env.get(MAX_UNTAR_SIZE_ENV, "").strip()
    if not untar:
        return Limits(download, download, MAX_ARTIFACT_BYTES_ENV)
    if untar != "-1" and (not untar.isdigit() or int(untar) <= 0):
        raise RunFailure(
            "InvalidSpec",
            f"{MAX_UNTAR_SIZE_ENV}={untar!r} is not a positive number of bytes, or -1 (no bound)",
        )
    return Limits(download, None if untar == "-1" else int(untar), MAX_UNTAR_SIZE_ENV)


def _source(artifact: FluxArtifact) -> str:
    return f"the artifact of {artifact.kind} {artifact.name} (revision {artifact.revision})"


def expected_digest(artifact: FluxArtifact) -> tuple[str, str] | None:
    """(algorithm, lowercase hex) the artifact's bytes must have; None: it names none."""
    if artifact.digest:
        algorithm, sep, expected = artifact.digest.partition(":")
        if not sep:
            algorithm, expected = "sha256", artifact.digest
        if algorithm not in ALGORITHMS or not expected:
            raise RunFailure(
                "SourceUnavailable",
                f"{_source(artifact)} has digest {artifact.digest}: only "
                f"{', '.join(ALGORITHMS)} digests can be verified, and an unverified artifact "
                "is not run",
            )
        return algorithm, expected.lower()
    if artifact.checksum:
        return "sha256", artifact.checksum.lower()
    return None


def download(
    artifact: FluxArtifact,
    target: Path,
    limit: int,
    *,
    allow_unverified: bool = False,
    warn: Callable[[str], None] = lambda _: None,
) -> None:
    """Download ``artifact`` to ``target``, verifying its size bound and digest."""
    expected = expected_digest(artifact)
    if expected is None:
        if not allow_unverified:
            raise RunFailure(
                "SourceUnavailable",
                f"{_source(artifact)} has neither a digest nor a checksum, so it cannot be "
                "verified, and an unverified artifact is not run (as in PKO); have the source "
                f"publish status.artifact.digest, or set {ALLOW_UNVERIFIED_ENV}=true in the "
                "Stack's spec.workspaceTemplate.spec.env to run it unverified",
            )
        warn(
            f"WARNING: {_source(artifact)} has neither a digest nor a checksum: running it "
            f"UNVERIFIED ({ALLOW_UNVERIFIED_ENV}=true)"
        )
    algorithm, digest = expected or ("sha256", "")
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
    if expected is not None and hasher.hexdigest() != digest:
        field = "digest" if artifact.digest else "checksum"
        raise RunFailure(
            "SourceUnavailable",
            f"{_source(artifact)} does not match its {field}: the source reports {field} "
            f"{artifact.digest or artifact.checksum}, the {size} bytes downloaded from "
            f"{artifact.url} are "
            f"{algorithm}:{hasher.hexdigest()}; not running it",
        )


def unpack(archive: Path, destination: Path, limits: Limits, what: str) -> None:
    """Unpack a ``.tar.gz`` into ``destination``; nothing may land outside it."""
    destination.mkdir(mode=0o700)
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            members = tar.getmembers()
            total = sum(m.size for m in members if m.isfile())
            if limits.unpacked is not None and total > limits.unpacked:
                raise RunFailure(
                    "SourceUnavailable",
                    f"{what} unpacks to {total} bytes, more than {limits.unpacked} "
                    f"({limits.unpacked_setting})",
                )
            tar.extractall(destination, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise RunFailure(
            "SourceUnavailable", f"{what} holds an entry that would escape its directory: {exc}"
        ) from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RunFailure("SourceUnavailable", f"{what} is not a readable .tar.gz: {exc}") from None


def fetch(
    artifact: FluxArtifact,
    directory: Path,
    env: Mapping[str, str],
    warn: Callable[[str], None] = lambda _: None,
) -> Path:
    """``artifact`` downloaded, verified and unpacked into ``directory/source``; ``warn``
    gets the line that says an artifact runs unverified."""
    limits = artifact_limits(env)
    archive = directory / "artifact.tar.gz"
    allow = env.get(ALLOW_UNVERIFIED_ENV, "").strip().lower() == "true"
    download(artifact, archive, limits.download, allow_unverified=allow, warn=warn)
    unpacked = directory / "source"
    unpack(archive, unpacked, limits, _source(artifact))
    archive.unlink()
    return unpacked
