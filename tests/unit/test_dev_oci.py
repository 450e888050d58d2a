"""Image archives written by pkobatch.dev.oci: the same inputs give the same bytes, the
layout is what ``ctr images import`` reads (the name annotation, digests that match their
blobs), the layer holds the entries as given, and a base layer lies beneath it as it is."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from pkobatch.dev.images import image_manifest, image_paths
from pkobatch.dev.oci import (
    CONTAINERD_NAME_ANNOTATION,
    ImageConfig,
    LayerEntry,
    cached_archive,
    full_name,
    go_arch,
    write_oci_archive,
)

ENTRIES = [
    LayerEntry("bin"),
    LayerEntry("bin/tool", mode=0o755, content=b"#!/bin/sh\necho hi\n"),
    LayerEntry("bin/alias", mode=0o777, link_target="tool"),
    LayerEntry("tmp", mode=0o1777),
]


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


def test_the_same_inputs_give_the_same_archive(tmp_path: Path) -> None:
    config = ImageConfig(entrypoint=["/bin/tool"], user="65534")
    first = write_oci_archive(tmp_path / "a.tar", "example/tool:1", ENTRIES, config)
    second = write_oci_archive(tmp_path / "b.tar", "example/tool:1", ENTRIES, config)
    assert first == second
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_the_layout_names_the_image_and_every_digest_matches_its_blob(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    config = ImageConfig(entrypoint=["/bin/tool"], user="65534:65534")
    digest = write_oci_archive(archive, "example/tool:1", ENTRIES, config)
    files = members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (manifest_ref,) = json.loads(files["index.json"])["manifests"]
    assert manifest_ref["digest"] == digest
    assert manifest_ref["annotations"][CONTAINERD_NAME_ANNOTATION] == "docker.io/example/tool:1"
    assert manifest_ref["platform"] == {"architecture": go_arch(), "os": "linux"}

    def blob(ref: dict[str, object]) -> bytes:
        data = files[f"blobs/sha256/{str(ref['digest']).removeprefix('sha256:')}"]
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == ref["digest"]
        assert len(data) == ref["size"]
        return data

    manifest = json.loads(blob(manifest_ref))
    image = json.loads(blob(manifest["config"]))
    assert image["config"] == {
        "Entrypoint": ["/bin/tool"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "User": "65534:65534",
    }
    (layer_ref,) = manifest["layers"]
    layer = blob(layer_ref)
    assert image["rootfs"]["diff_ids"] == [layer_ref["digest"]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar.getmembers()}
        assert sorted(entries) == ["bin", "bin/alias", "bin/tool", "tmp"]
        assert entries["bin/tool"].mode == 0o755 and entries["tmp"].mode == 0o1777
        assert entries["bin/alias"].issym() and entries["bin/alias"].linkname == "tool"
        assert tar.extractfile("bin/tool").read() == b"#!/bin/sh\necho hi\n"  # type: ignore[union-attr]
        assert {(m.uid, m.gid, m.mtime) for m in entries.values()} == {(0, 0, 0)}


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("busybox:1", "docker.io/library/busybox:1"),
        ("pkobatch/runner:0.1", "docker.io/pkobatch/runner:0.1"),
        ("registry.k8s.io/pause:3.10.2", "registry.k8s.io/pause:3.10.2"),
        ("localhost/tool:1", "localhost/tool:1"),
        ("host:5000/tool:1", "host:5000/tool:1"),
    ],
)
def test_full_name_is_the_name_the_runtime_resolves(name: str, full: str) -> None:
    assert full_name(name) == full


def test_a_cached_archive_is_built_once_per_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PKOBATCH_IMAGES_DIR", str(tmp_path))
    built: list[Path] = []

    def build(path: Path) -> None:
        built.append(path)
        path.write_bytes(b"archive")

    first = cached_archive("tool", [b"a", b"b"], build)
    assert cached_archive("tool", [b"a", b"b"], build) == first
    other = cached_archive("tool", [b"a", b"c"], build)
    assert built == [first, other] and first != other
    assert first.parent == tmp_path / "archives"


def test_a_base_layer_lies_beneath_the_images_own_layer_as_it_is(tmp_path: Path) -> None:
    base = tmp_path / "rootfs.tar"
    with tarfile.open(base, "w") as tar:
        for name in ("./etc", "./etc/os-release"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE if name == "./etc" else tarfile.REGTYPE
            content = b"ID=example\n" if info.isreg() else b""
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    archive = tmp_path / "image.tar"
    write_oci_archive(archive, "example/tool:1", ENTRIES, ImageConfig(), [base])

    files = members(archive)
    layers: list[dict[str, str]] = image_manifest(archive)["layers"]  # type: ignore[assignment]
    base_digest = f"sha256:{hashlib.sha256(base.read_bytes()).hexdigest()}"
    assert len(layers) == 2 and layers[0]["digest"] == base_digest
    assert files[f"blobs/sha256/{base_digest.removeprefix('sha256:')}"] == base.read_bytes()
    assert image_paths(archive) == {"etc", "etc/os-release", "bin", "bin/alias", "bin/tool", "tmp"}
