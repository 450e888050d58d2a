"""pkobatch's images (``pkobatch.dev.images``): built with buildah on the stand-in bases made
from Debian's packages, cached under ``~/.cache/pkobatch/images`` by their inputs.

A test of an image that cannot be built here — no buildah or mmdebstrap, or the runner's
Pulumi tools not built — fails with ``CI=true`` and is skipped locally, saying what to install
or build. The other images are still built and tested.

Session scope
-------------
``built_images`` -> ``Images``: ``built_images[target]`` is the ``BuiltImage`` of a target of
``jobs/Dockerfile`` (runner, runner-bundle, controller): its OCI archive (``.archive``), the
name inside it (``.reference``), its sizes. All buildable targets are built in one call, so
runner and runner-bundle share their bundle stage. Cold, that takes several minutes; cached,
a hash of the inputs.

``image_containers`` -> ``Containers``: ``image_containers[target]`` is a buildah container
made from that target's archive (so the archive itself is what is checked); ``.run(*argv)``
runs a command in it as the image's user. The containers and the images imported for them
are removed at the end of the session.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from fixture_plugins.tools import in_ci
from pkobatch.dev.images import (
    TARGETS,
    Builder,
    BuilderMissing,
    BuiltImage,
    build_images,
    tools_of,
)
from pkobatch.dev.oci import images_root
from pkobatch.dev.tools import ToolsMissing, find_tools

# Generous: a command in a container of a 2-core machine shared with builds.
COMMAND_TIMEOUT = 300


def unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Images:
    built: dict[str, BuiltImage]
    unbuildable: dict[str, str]
    """Targets whose bases lack built tools, and the message saying how to build them."""

    def __getitem__(self, target: str) -> BuiltImage:
        if target in self.unbuildable:
            unavailable(f"the {target} image cannot be built: {self.unbuildable[target]}")
        return self.built[target]


@pytest.fixture(scope="session")
def built_images() -> Images:
    unbuildable: dict[str, str] = {}
    for target in TARGETS:
        try:
            find_tools(tools_of(target))
        except ToolsMissing as exc:
            unbuildable[target] = str(exc)
    try:
        built = build_images([t for t in TARGETS if t not in unbuildable], progress=True)
    except BuilderMissing as exc:
        unavailable(str(exc))
    return Images(built, unbuildable)


@dataclass(frozen=True)
class ImageContainer:
    """A buildah working container of one image (its root filesystem and configuration)."""

    builder: Builder
    container: str

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` in the container (chroot isolation, the image's user, env and workdir)."""
        return subprocess.run(
            self.builder.argv("run", "--isolation=chroot", self.container, "--", *argv),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )


@dataclass
class Containers:
    images: Images
    builder: Builder
    made: dict[str, ImageContainer] = field(default_factory=dict)

    def __getitem__(self, target: str) -> ImageContainer:
        if target not in self.made:
            archive = self.images[target].archive
            created = self.builder.run("from", "--pull=always", f"oci-archive:{archive}")
            self.made[target] = ImageContainer(self.builder, created.strip().splitlines()[-1])
        return self.made[target]

    def remove(self) -> None:
        """Every working container in this storage, then the images they were made from."""
        self.builder.run("rm", "--all")
        for target in self.made:
            self.builder.run("rmi", self.images.built[target].reference)


@pytest.fixture(scope="session")
def image_containers(built_images: Images) -> Iterator[Containers]:
    # A storage of their own, as the image build empties its storage of working containers.
    containers = Containers(built_images, Builder(images_root() / "containers"))
    # Those of a session that was killed would keep their images in use, so that the
    # teardown could not remove them.
    containers.builder.run("rm", "--all")
    try:
        yield containers
    finally:
        containers.remove()
