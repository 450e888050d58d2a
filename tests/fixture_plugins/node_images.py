"""Images for the real node (``node_cluster``, fixture_plugins/cluster.py), written on this
machine (no registry is reachable) by ``pkobatch.dev.oci`` and cached by their inputs under
``~/.cache/pkobatch/images``.

Session scope
-------------
``busybox_archive`` -> Path: the OCI archive of a small test image: Debian's static busybox
(``/bin/busybox`` of ``busybox-static``) with a link for each of its applets in ``/bin``,
the built ``kubectl`` (``/bin/kubectl``: a pod calls the API server with it as in-cluster
clients do), ``/etc/passwd`` and ``/etc/group`` (root and nobody), and ``IMAGE_MARKER``, a
file only the image has, holding ``IMAGE_MARKER_TEXT``. Needs no cluster.

``busybox_image`` -> ``NodeImage``: that image imported into ``node_cluster``'s containerd
(``.name``, ``.marker``, ``.marker_text``); pods run it with ``imagePullPolicy: Never``.

``pulumi_yaml_image`` -> str: the name of an image users could bring for an injected run,
imported into ``node_cluster``: the static Pulumi CLI and YAML language host in ``/usr/bin``
(from the tools cache), the YAML test program in ``PULUMI_YAML_PROGRAM``, ``/etc/passwd`` with
the run's user (uid 1000) and a world-writable ``/tmp``; no shell, no C library, no CA
certificates.

``runner_bundle_image`` -> str: the name of an image the init container copies the runner
bundle (``runner_bundle``) from: Debian's static busybox as ``/bin/cp`` and the bundle
directory at ``RUNNER_BUNDLE_PATH`` (the controller's ``PKOBATCH_JOB__RUNNER_BUNDLE``),
imported into ``node_cluster``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from fixture_plugins.cluster import Cluster
from fixture_plugins.tools import in_ci
from pkobatch.dev.oci import ImageConfig, LayerEntry, cached_archive, write_oci_archive
from pkobatch.dev.tools import Tools

BUSYBOX: Final = Path("/bin/busybox")
BUSYBOX_IMAGE: Final = "pkobatch-test/busybox:1"
PULUMI_YAML_IMAGE: Final = "pkobatch-test/pulumi-yaml:1"
PULUMI_YAML_PROGRAM: Final = "/program"
RUNNER_BUNDLE_IMAGE: Final = "pkobatch-test/runner-bundle:1"
RUNNER_BUNDLE_PATH: Final = "/opt/pkobatch/runner"
RUN_AS: Final = 1000
PROGRAMS: Final = Path(__file__).resolve().parents[1] / "fixtures" / "programs"
IMAGE_MARKER: Final = "/etc/pkobatch-test-image"
IMAGE_MARKER_TEXT: Final = "made by tests/fixture_plugins/node_images.py"
_PASSWD: Final = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
_GROUP: Final = b"root:x:0:\nnogroup:x:65534:\n"
# As jobs/Dockerfile's runner-bundle: the init container runs as non-root.
_BUNDLE_USER: Final = "65532:65532"
_RUN_AS_PASSWD: Final = f"pulumi:x:{RUN_AS}:{RUN_AS}::/tmp:/nonexistent\n".encode()


@dataclass(frozen=True)
class NodeImage:
    name: str
    marker: str
    marker_text: str


def _busybox_entries(applets: list[str], kubectl: Path) -> list[LayerEntry]:
    return [
        LayerEntry("bin"),
        LayerEntry("etc"),
        LayerEntry("tmp", mode=0o1777),
        LayerEntry("bin/busybox", source=BUSYBOX),
        LayerEntry("bin/kubectl", source=kubectl),
        *(LayerEntry(f"bin/{a}", mode=0o777, link_target="busybox") for a in applets),
        LayerEntry("etc/passwd", mode=0o644, content=_PASSWD),
        LayerEntry("etc/group", mode=0o644, content=_GROUP),
        LayerEntry(IMAGE_MARKER, mode=0o644, content=IMAGE_MARKER_TEXT.encode()),
    ]


@pytest.fixture(scope="session")
def busybox_archive(real_node_tools: Tools) -> Path:
    _busybox_static()
    listed = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    applets = sorted(set(listed.stdout.split()) - {"busybox", "kubectl"})
    kubectl = Path(real_node_tools.binary("node", "kubectl"))
    inputs = [BUSYBOX.read_bytes(), kubectl.read_bytes(), BUSYBOX_IMAGE.encode(), _PASSWD]
    return cached_archive(
        "test-busybox",
        [*inputs, _GROUP, IMAGE_MARKER_TEXT.encode()],
        lambda path: write_oci_archive(
            path,
            BUSYBOX_IMAGE,
            _busybox_entries(applets, kubectl),
            ImageConfig(cmd=["/bin/sh"]),
        ),
    )


@pytest.fixture(scope="session")
def busybox_image(node_cluster: Cluster, busybox_archive: Path) -> NodeImage:
    assert node_cluster.node is not None
    node_cluster.node.import_image(busybox_archive)
    return NodeImage(BUSYBOX_IMAGE, IMAGE_MARKER, IMAGE_MARKER_TEXT)


def _busybox_static() -> Path:
    if not BUSYBOX.is_file():
        message = f"{BUSYBOX} is missing: apt-get install busybox-static"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return BUSYBOX


def _tree_entries(source: Path, target: str) -> list[LayerEntry]:
    """``source``'s directory tree as layer entries under ``target``, modes and links kept."""
    entries = [LayerEntry(target)]
    for path in sorted(source.rglob("*")):
        name = f"{target}/{path.relative_to(source)}"
        mode = path.lstat().st_mode & 0o7777
        if path.is_symlink():
            entries.append(LayerEntry(name, mode=0o777, link_target=str(path.readlink())))
        elif path.is_dir():
            entries.append(LayerEntry(name, mode=mode))
        else:
            entries.append(LayerEntry(name, mode=mode, source=path))
    return entries


def _parents(path: str) -> list[LayerEntry]:
    parts = path.strip("/").split("/")[:-1]
    return [LayerEntry("/".join(parts[: i + 1])) for i in range(len(parts))]


def _tree_inputs(root: Path) -> list[bytes]:
    return [
        f"{p.relative_to(root)}:{p.lstat().st_mode}".encode()
        + (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
        for p in sorted(root.rglob("*"))
    ]


@pytest.fixture(scope="session")
def pulumi_yaml_image(node_cluster: Cluster, pulumi_bin: Path, yaml_host: Path) -> str:
    pulumi = pulumi_bin / "pulumi"
    host = yaml_host / "pulumi-language-yaml"
    program = PROGRAMS / "yaml"
    entries = [
        LayerEntry("usr"),
        LayerEntry("usr/bin"),
        LayerEntry("usr/bin/pulumi", source=pulumi),
        LayerEntry("usr/bin/pulumi-language-yaml", source=host),
        LayerEntry("etc"),
        LayerEntry("etc/passwd", mode=0o644, content=_RUN_AS_PASSWD),
        LayerEntry("tmp", mode=0o1777),
        *_tree_entries(program, PULUMI_YAML_PROGRAM.strip("/")),
    ]
    archive = cached_archive(
        "test-pulumi-yaml",
        [pulumi.read_bytes(), host.read_bytes(), _RUN_AS_PASSWD, *_tree_inputs(program)],
        lambda path: write_oci_archive(
            path, PULUMI_YAML_IMAGE, entries, ImageConfig(env=("PATH=/usr/bin",))
        ),
    )
    assert node_cluster.node is not None
    node_cluster.node.import_image(archive)
    return PULUMI_YAML_IMAGE


@pytest.fixture(scope="session")
def runner_bundle_image(node_cluster: Cluster, runner_bundle: Path) -> str:
    busybox = _busybox_static()
    entries = [
        LayerEntry("bin"),
        LayerEntry("bin/busybox", source=busybox),
        LayerEntry("bin/cp", mode=0o777, link_target="busybox"),
        *_parents(RUNNER_BUNDLE_PATH),
        *_tree_entries(runner_bundle, RUNNER_BUNDLE_PATH.strip("/")),
    ]
    archive = cached_archive(
        "test-runner-bundle",
        # The bundle's directory name is the hash of all that went into it.
        [
            busybox.read_bytes(),
            RUNNER_BUNDLE_PATH.encode(),
            _BUNDLE_USER.encode(),
            str(runner_bundle).encode(),
        ],
        lambda path: write_oci_archive(
            path,
            RUNNER_BUNDLE_IMAGE,
            entries,
            ImageConfig(env=("PATH=/bin",), user=_BUNDLE_USER),
        ),
    )
    assert node_cluster.node is not None
    node_cluster.node.import_image(archive)
    return RUNNER_BUNDLE_IMAGE
