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
certificates. ``pulumi_old_yaml_image`` and ``pulumi_mid_yaml_image`` -> str: the same with the
older Pulumi CLIs (``pulumi_old_bin``, ``pulumi_mid_bin``: fixture_plugins/tools.py) as
``/usr/bin/pulumi``, the only CLI on the image's ``PATH``.

``brought_image`` -> ``BroughtImage`` (parametrised: ``debian``, ``musl``,
``no-shell-no-cp``): an image of the kind users bring for an injected run, imported into
``node_cluster`` (``.name``), each with the static Pulumi CLI and YAML language host in
``/usr/bin`` and the program ``yaml-os-release`` (whose output ``osRelease`` is the image's
``/etc/os-release``, ``.os_release``) in ``PULUMI_YAML_PROGRAM``; ``.paths`` lists every
path in its layers:

- ``debian``: Debian bookworm's ``minbase`` (made with mmdebstrap,
  ``pkobatch.dev.images.debian_rootfs``: a shell, coreutils, glibc, apt; no Python) with the
  run's user (uid 1000) added to its ``/etc/passwd``;
- ``musl``: musl as the image's C library (``/lib/ld-musl-x86_64.so.1`` and its
  ``libc.musl-x86_64.so.1`` link, as Alpine lays it out; from Debian's ``musl`` package, since
  no Alpine package index is reachable here), no glibc, no shell;
- ``no-shell-no-cp``: nothing but the Pulumi binaries, the program and ``/etc/passwd``.

``runner_bundle_image`` -> str: the name of an image the init container copies the runner
bundle (``runner_bundle``) from: Debian's static busybox as ``/bin/cp`` and the bundle
directory at ``RUNNER_BUNDLE_PATH`` (the controller's ``PKOBATCH_JOB__RUNNER_BUNDLE``),
imported into ``node_cluster``.
"""

from __future__ import annotations

import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from helpers.controller_harness import literal, secret

from fixture_plugins.cluster import Cluster
from fixture_plugins.images import unavailable
from pkobatch.dev.images import (
    BaseRecipe,
    BuilderMissing,
    ImageBuildFailed,
    debian_rootfs,
    image_paths,
)
from pkobatch.dev.oci import (
    DEFAULT_PATH,
    ImageConfig,
    LayerEntry,
    cached_archive,
    write_oci_archive,
)
from pkobatch.dev.tools import Tools, versions

BUSYBOX: Final = Path("/bin/busybox")
BUSYBOX_IMAGE: Final = "pkobatch-test/busybox:1"
PULUMI_YAML_IMAGE: Final = "pkobatch-test/pulumi-yaml:1"
PULUMI_OLD_YAML_IMAGE: Final = f"pkobatch-test/pulumi-yaml:{versions()['PULUMI_OLD_VERSION']}"
PULUMI_MID_YAML_IMAGE: Final = f"pkobatch-test/pulumi-yaml:{versions()['PULUMI_MID_VERSION']}"
PULUMI_YAML_PROGRAM: Final = "/program"
RUNNER_BUNDLE_IMAGE: Final = "pkobatch-test/runner-bundle:1"
RUNNER_BUNDLE_PATH: Final = "/opt/pkobatch/runner"
RUN_AS: Final = 1000
PASSPHRASE: Final = "not-a-secret-of-this-test"
PROGRAMS: Final = Path(__file__).resolve().parents[1] / "fixtures" / "programs"
IMAGE_MARKER: Final = "/etc/pkobatch-test-image"
IMAGE_MARKER_TEXT: Final = "made by tests/fixture_plugins/node_images.py"
_PASSWD: Final = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
_GROUP: Final = b"root:x:0:\nnogroup:x:65534:\n"
# As jobs/Dockerfile's runner-bundle: the init container runs as non-root.
_BUNDLE_USER: Final = "65532:65532"
_RUN_AS_USER: Final = f"pulumi:x:{RUN_AS}:{RUN_AS}::/tmp:/nonexistent"
_RUN_AS_PASSWD: Final = f"{_RUN_AS_USER}\n".encode()
MUSL_LOADER: Final = Path("/lib/ld-musl-x86_64.so.1")
BROUGHT_IMAGES: Final = ("debian", "musl", "no-shell-no-cp")
DEBIAN_MINBASE: Final = BaseRecipe(
    build_arg="",
    name="test-debian-minbase",
    variant="minbase",
    packages=(),
    hooks=(f'echo "{_RUN_AS_USER}" >> "$1/etc/passwd"',),
    host_sources=False,
)
_OS_RELEASE: Final = {
    "musl": 'NAME="pkobatch test image with musl"\nID=pkobatch-test-musl\n',
    "no-shell-no-cp": 'NAME="pkobatch test image without a shell"\nID=pkobatch-test-bare\n',
}


@dataclass(frozen=True)
class NodeImage:
    name: str
    marker: str
    marker_text: str


@dataclass(frozen=True)
class BroughtImage:
    kind: str
    name: str
    os_release: str
    paths: frozenset[str]


def yaml_stack(image: str, **workspace: Any) -> dict[str, Any]:
    """A Stack of the YAML program baked into ``image`` (at ``PULUMI_YAML_PROGRAM``), its state
    on a ``file://`` backend in the pod's ``/tmp``, its passphrase ``PASSPHRASE`` from the
    Secret ``pulumi`` (``node_controller``, tests/node/conftest.py, makes it)."""
    return {
        "stack": "dev",
        "config": {"greeting": "kia ora"},
        "envRefs": {
            "PULUMI_BACKEND_URL": literal("file:///tmp"),
            "PULUMI_CONFIG_PASSPHRASE": secret("pulumi", "passphrase"),
            "PULUMI_SKIP_UPDATE_CHECK": literal("true"),
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": literal("true"),
        },
        "workspaceTemplate": {
            "spec": {
                "image": image,
                "imagePullPolicy": "Never",
                "local": {"dir": PULUMI_YAML_PROGRAM},
                "env": [{"name": "HOME", "value": "/tmp"}],
                **workspace,
            }
        },
    }


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
    _host_file(BUSYBOX, "busybox-static")
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


def _host_file(path: Path, package: str) -> Path:
    if not path.is_file():
        unavailable(f"{path} is missing: apt-get install {package}")
    return path


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


def _pulumi_yaml_entries(pulumi_bin: Path, yaml_host: Path, program: Path) -> list[LayerEntry]:
    """The static Pulumi CLI and YAML host in ``/usr/bin``, ``program`` in
    ``PULUMI_YAML_PROGRAM``."""
    return [
        LayerEntry("usr"),
        LayerEntry("usr/bin"),
        LayerEntry("usr/bin/pulumi", source=pulumi_bin / "pulumi"),
        LayerEntry("usr/bin/pulumi-language-yaml", source=yaml_host / "pulumi-language-yaml"),
        *_tree_entries(program, PULUMI_YAML_PROGRAM.strip("/")),
    ]


def _run_as_entries() -> list[LayerEntry]:
    """``/etc/passwd`` with the run's user and a world-writable ``/tmp``."""
    return [
        LayerEntry("etc"),
        LayerEntry("etc/passwd", mode=0o644, content=_RUN_AS_PASSWD),
        LayerEntry("tmp", mode=0o1777),
    ]


def _pulumi_yaml_inputs(pulumi_bin: Path, yaml_host: Path, program: Path) -> list[bytes]:
    return [
        (pulumi_bin / "pulumi").read_bytes(),
        (yaml_host / "pulumi-language-yaml").read_bytes(),
        *_tree_inputs(program),
    ]


def _pulumi_yaml_image(node_cluster: Cluster, name: str, pulumi_bin: Path, yaml_host: Path) -> str:
    """The image ``name`` of ``pulumi_yaml_image``'s contents with the CLI of ``pulumi_bin``,
    imported into ``node_cluster``."""
    program = PROGRAMS / "yaml"
    entries = [*_pulumi_yaml_entries(pulumi_bin, yaml_host, program), *_run_as_entries()]
    archive = cached_archive(
        "test-pulumi-yaml",
        [*_pulumi_yaml_inputs(pulumi_bin, yaml_host, program), _RUN_AS_PASSWD, name.encode()],
        lambda path: write_oci_archive(path, name, entries, ImageConfig(env=("PATH=/usr/bin",))),
    )
    assert node_cluster.node is not None
    node_cluster.node.import_image(archive)
    return name


@pytest.fixture(scope="session")
def pulumi_yaml_image(node_cluster: Cluster, pulumi_bin: Path, yaml_host: Path) -> str:
    return _pulumi_yaml_image(node_cluster, PULUMI_YAML_IMAGE, pulumi_bin, yaml_host)


@pytest.fixture(scope="session")
def pulumi_old_yaml_image(node_cluster: Cluster, pulumi_old_bin: Path, yaml_host: Path) -> str:
    return _pulumi_yaml_image(node_cluster, PULUMI_OLD_YAML_IMAGE, pulumi_old_bin, yaml_host)


@pytest.fixture(scope="session")
def pulumi_mid_yaml_image(node_cluster: Cluster, pulumi_mid_bin: Path, yaml_host: Path) -> str:
    return _pulumi_yaml_image(node_cluster, PULUMI_MID_YAML_IMAGE, pulumi_mid_bin, yaml_host)


def _debian_os_release(rootfs: Path) -> str:
    with tarfile.open(rootfs) as layer:
        # /etc/os-release is Debian's link to /usr/lib/os-release; extractfile follows it.
        release = layer.extractfile("./etc/os-release")
        assert release is not None
        return release.read().decode()


@pytest.fixture(scope="session", params=BROUGHT_IMAGES)
def brought_image(
    request: pytest.FixtureRequest, node_cluster: Cluster, pulumi_bin: Path, yaml_host: Path
) -> BroughtImage:
    kind: str = request.param
    name = f"pkobatch-test/brought-{kind}:1"
    program = PROGRAMS / "yaml-os-release"
    entries = _pulumi_yaml_entries(pulumi_bin, yaml_host, program)
    inputs = [name.encode(), *_pulumi_yaml_inputs(pulumi_bin, yaml_host, program)]
    base_layers: list[Path] = []
    if kind == "debian":
        try:
            rootfs = debian_rootfs(DEBIAN_MINBASE)
        except (BuilderMissing, ImageBuildFailed) as exc:
            unavailable(str(exc))
        base_layers.append(rootfs)
        inputs.append(str(rootfs).encode())  # its name is the hash of its inputs
        os_release = _debian_os_release(rootfs)
    else:
        os_release = _OS_RELEASE[kind]
        entries += [
            *_run_as_entries(),
            LayerEntry("etc/os-release", mode=0o644, content=os_release.encode()),
        ]
        inputs += [_RUN_AS_PASSWD, os_release.encode()]
    if kind == "musl":
        loader = _host_file(MUSL_LOADER, "musl").resolve()
        entries += [
            LayerEntry("lib"),
            LayerEntry(f"lib/{MUSL_LOADER.name}", source=loader),
            LayerEntry("lib/libc.musl-x86_64.so.1", mode=0o777, link_target=MUSL_LOADER.name),
        ]
        inputs.append(loader.read_bytes())
    archive = cached_archive(
        f"test-brought-{kind}",
        inputs,
        lambda path: write_oci_archive(
            path, name, entries, ImageConfig(env=(f"PATH={DEFAULT_PATH}",)), base_layers
        ),
    )
    assert node_cluster.node is not None
    node_cluster.node.import_image(archive)
    return BroughtImage(kind, name, os_release, image_paths(archive))


@pytest.fixture(scope="session")
def runner_bundle_image(node_cluster: Cluster, runner_bundle: Path) -> str:
    busybox = _host_file(BUSYBOX, "busybox-static")
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
