"""Small container images written directly, for the real node (no registry is reachable):
OCI image archives of one layer, written byte for byte reproducibly and cached by their
inputs, which ``RealNode.import_image`` (``pkobatch.dev.node``) imports — the pod
sandbox's ``pause`` image, and the tests' images of a few files, some on a root filesystem
made elsewhere (``pkobatch.dev.images.debian_rootfs``) as a layer beneath.

``write_oci_archive`` writes an OCI image layout as a tar (``oci-layout``, ``index.json``,
``blobs/sha256/...``) whose manifest is annotated with the image's full name
(``io.containerd.image.name``), which ``ctr images import`` names the image by. Its own
layer is uncompressed and every entry has owner 0, mode as given and time 0, so the same
inputs give the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

LAYER_MEDIA_TYPE: Final = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE: Final = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE: Final = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE: Final = "application/vnd.oci.image.index.v1+json"
CONTAINERD_NAME_ANNOTATION: Final = "io.containerd.image.name"
REF_NAME_ANNOTATION: Final = "org.opencontainers.image.ref.name"
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_GO_ARCH: Final = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def go_arch() -> str:
    """This machine's architecture as an image platform names it (``amd64``, ``arm64``)."""
    machine = platform.machine()
    return _GO_ARCH.get(machine, machine)


@dataclass(frozen=True)
class LayerEntry:
    """One entry of the layer: a directory, a file (its bytes, or a host file's), or a
    symbolic link (``link_target``)."""

    path: str
    mode: int = 0o755
    content: bytes | None = None
    source: Path | None = None
    link_target: str | None = None

    def data(self) -> bytes | None:
        if self.source is not None:
            return self.source.read_bytes()
        return self.content


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    user: str = ""
    env: Sequence[str] = (f"PATH={DEFAULT_PATH}",)
    working_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)


def full_name(name: str) -> str:
    """The name the container runtime resolves ``name`` to (``busybox:1`` is
    ``docker.io/library/busybox:1``), which a pod's ``image`` matches an imported image by."""
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


def _layer(entries: Sequence[LayerEntry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path.strip("/"))
            info.mode, info.mtime, info.uid, info.gid = entry.mode, 0, 0, 0
            data = entry.data()
            if entry.link_target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link_target
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
        "size": len(blob),
    }


def _canonical(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def write_oci_archive(
    path: Path,
    name: str,
    entries: Sequence[LayerEntry],
    config: ImageConfig,
    base_layers: Sequence[Path] = (),
) -> str:
    """Write the image ``name`` to ``path`` (an OCI image layout in a tar): the tarballs
    ``base_layers`` as they are (a root filesystem made elsewhere), then one layer made of
    ``entries``; the manifest's digest."""
    layers = [*(base.read_bytes() for base in base_layers), _layer(entries)]
    image_config: dict[str, Any] = {
        "Env": list(config.env),
        "Entrypoint": list(config.entrypoint) or None,
        "Cmd": list(config.cmd) or None,
        "User": config.user,
        "WorkingDir": config.working_dir,
        "Labels": dict(config.labels) or None,
    }
    config_blob = _canonical(
        {
            "architecture": go_arch(),
            "os": "linux",
            "config": {k: v for k, v in image_config.items() if v},
            "rootfs": {
                "type": "layers",
                "diff_ids": [_descriptor("", layer)["digest"] for layer in layers],
            },
            "history": [{"created_by": "pkobatch.dev.oci"}],
        }
    )
    manifest_blob = _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": _descriptor(CONFIG_MEDIA_TYPE, config_blob),
            "layers": [_descriptor(LAYER_MEDIA_TYPE, layer) for layer in layers],
        }
    )
    manifest = _descriptor(MANIFEST_MEDIA_TYPE, manifest_blob)
    reference = full_name(name)
    manifest["platform"] = {"architecture": go_arch(), "os": "linux"}
    manifest["annotations"] = {
        CONTAINERD_NAME_ANNOTATION: reference,
        REF_NAME_ANNOTATION: reference.rpartition(":")[2],
    }
    index = _canonical({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [manifest]})
    files = {
        "oci-layout": _canonical({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{
            f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}": blob
            for blob in (*layers, config_blob, manifest_blob)
        },
    }
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(temporary, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for member, blob in files.items():
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(blob), 0o644, 0
            tar.addfile(info, io.BytesIO(blob))
    temporary.replace(path)
    return str(manifest["digest"])


def images_root() -> Path:
    """Where made images are cached (``$PKOBATCH_IMAGES_DIR``, default
    ``~/.cache/pkobatch/images``)."""
    override = os.environ.get("PKOBATCH_IMAGES_DIR")
    return Path(override) if override else Path.home() / ".cache" / "pkobatch" / "images"


def cached_archive(stem: str, inputs: Sequence[bytes], build: Callable[[Path], object]) -> Path:
    """``images_root()/archives/<stem>-<hash of inputs>.tar``, made by ``build(path)``
    unless it exists: a change of any input makes a new archive."""
    digest = hashlib.sha256()
    for part in inputs:
        digest.update(hashlib.sha256(part).digest())
    path = images_root() / "archives" / f"{stem}-{digest.hexdigest()[:16]}.tar"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        build(path)
    return path
