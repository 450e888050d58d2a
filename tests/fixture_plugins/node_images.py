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
IMAGE_MARKER: Final = "/etc/pkobatch-test-image"
IMAGE_MARKER_TEXT: Final = "made by tests/fixture_plugins/node_images.py"
_PASSWD: Final = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
_GROUP: Final = b"root:x:0:\nnogroup:x:65534:\n"


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
    if not BUSYBOX.is_file():
        message = f"{BUSYBOX} is missing: apt-get install busybox-static"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
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
