"""pkobatch's images, built on this machine: no container daemon, no registry.

``jobs/Dockerfile`` takes its bases as build arguments (``PYTHON_IMAGE``, ``BUSYBOX_IMAGE``,
``PULUMI_IMAGE``) whose defaults are the real images. No registry can be reached here, so
this module makes stand-ins from Debian's packages with ``mmdebstrap`` and builds every
target with ``buildah`` on them:

``PYTHON_IMAGE``   Debian bookworm with its ``python3`` (3.11, as ``python:3.11-slim-bookworm``)
``BUSYBOX_IMAGE``  Debian's ``busybox-static`` alone, linked as its applets (as ``busybox``)
``PULUMI_IMAGE``   Debian bookworm with ``git``, ``python3`` and ``venv``, the Pulumi CLI, the
                   YAML language host and the Kubernetes provider of the tools cache in
                   ``/pulumi/bin``, and the user ``pulumi`` (uid/gid 1000), as
                   ``pulumi/pulumi:<PULUMI_VERSION>-nonroot``

The stand-ins use this machine's package sources: its apt sources for bookworm (else
mmdebstrap's default mirrors), every certificate of its CA bundle (a TLS-inspecting proxy's
too), and its pip index settings as ``/etc/pip.conf``, so the Dockerfile's ``apt-get`` and
``pip install`` work here unchanged.

Everything lives under ``images_root()`` (``$PKOBATCH_IMAGES_DIR``, default
``~/.cache/pkobatch/images``): buildah's own storage (not the host's), the build logs, and
each target as an OCI archive ``archives/<target>-<key>.tar`` whose image is named
``docker.io/<image>`` (as its OCI ref name and as containerd's ``io.containerd.image.name``,
which ``ctr images import`` names it by), where the key hashes every input (the build
context the Dockerfile copies, the Dockerfile, the bases' keys). A base's key hashes its
recipe and this machine's sources, certificates, pip settings and tool binaries. A cached
target costs a hash of its context.

    python -m pkobatch.dev.images [TARGET ...]     build what is missing, print the sizes
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pkobatch import __version__
from pkobatch.dev.oci import CONTAINERD_NAME_ANNOTATION, DEFAULT_PATH, full_name, images_root
from pkobatch.dev.tools import Component, ToolsMissing, find_tools

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DOCKERFILE: Final = Path("jobs", "Dockerfile")
TARGETS: Final = ("runner", "runner-bundle", "controller")
IMAGE_NAMES: Final[dict[str, str]] = {
    "runner": f"pkobatch/runner:{__version__}",
    "runner-bundle": f"pkobatch/runner-bundle:{__version__}",
    "controller": f"pkobatch/controller:{__version__}",
}
"""The name of each target's image, as the install (deploy/) and ``Settings`` name them."""
BUILDER_PACKAGES: Final = ("buildah", "mmdebstrap")
"""Debian packages (and programs) this module runs; ``scripts/bootstrap.sh`` installs them."""
SUITE: Final = "bookworm"
_BASE_REPOSITORY: Final = "localhost/pkobatch-base"
_BUILD_REPOSITORY: Final = "localhost/pkobatch-build"
# Another checkout's archive of a target is dropped once unused this long (seconds).
_ARCHIVES_KEPT_UNUSED: Final = 6 * 3600
# Debian's own images leave out the docs and keep no apt caches (their docker-clean); so do
# the stand-ins, which otherwise carry 80 MB of caches into every image that runs apt-get.
_DEBIAN_IMAGE_OPTIONS: Final = (
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
    '--aptopt=Dir::Cache::pkgcache ""',
    '--aptopt=Dir::Cache::srcpkgcache ""',
)
# pip settings of this machine that say where packages come from (not host paths such as
# cert or find-links: the certificates go into the stand-ins' trust store instead).
_PIP_SETTINGS: Final = ("index-url", "extra-index-url", "trusted-host", "default-timeout")


_Say = Callable[[str], None] | None


class BuilderMissing(Exception):
    """buildah or mmdebstrap is not installed; the message says how to install them."""


class ImageBuildFailed(Exception):
    """A build step failed; the message names the step, the log and its last lines."""


BUNDLE_SCRIPT: Final = REPO_ROOT / "jobs" / "build-runner-bundle.sh"
_BUNDLE_BUILD_TIMEOUT_SECONDS: Final = 1800


def build_runner_bundle(python: str) -> Path:
    """The runner bundle's directory for this checkout and ``python``'s packages, from
    ``jobs/build-runner-bundle.sh``: cached by a hash of its inputs, else built with
    PyInstaller (minutes). ``ImageBuildFailed`` holds the end of the script's output."""
    built = subprocess.run(
        ["bash", str(BUNDLE_SCRIPT)],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=_BUNDLE_BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    if built.returncode != 0:
        raise ImageBuildFailed(f"{BUNDLE_SCRIPT} failed:\n{built.stderr[-4000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def missing_builder() -> list[str]:
    return [program for program in BUILDER_PACKAGES if shutil.which(program) is None]


def require_builder() -> None:
    missing = missing_builder()
    if missing:
        raise BuilderMissing(
            f"building pkobatch's images needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: run "
            f"`apt-get install {' '.join(BUILDER_PACKAGES)}` as root, or scripts/bootstrap.sh"
        )


# -- jobs/Dockerfile -------------------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM ... AS name`` stage of a Dockerfile and its instructions, in order."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str:
        values = [value for key, value in self.instructions if key == keyword]
        if not values:
            raise ValueError(f"stage {self.name} has no {keyword}")
        return values[-1]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ``ARG`` defaults and the stages, from the Dockerfile's logical lines."""
    text = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), flags=re.IGNORECASE)
            if match is None:
                raise ValueError(f"every stage must be named: {line}")
            stages.append(Stage(match.group(2), match.group(1)))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        elif not stages:
            raise ValueError(f"{line!r} before the first FROM")
        else:
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


def _stages_of(target: str, stages: Sequence[Stage]) -> list[Stage]:
    """The stage ``target`` and every stage it copies from, each once."""
    by_name = {stage.name: stage for stage in stages}
    needed: list[Stage] = []
    pending = [target]
    while pending:
        stage = by_name[pending.pop()]
        if stage in needed:
            continue
        needed.append(stage)
        for keyword, value in stage.instructions:
            source = re.match(r"--from=(\S+)", value)
            if keyword == "COPY" and source:
                pending.append(source.group(1))
    return needed


def _bases_of(stages: Sequence[Stage]) -> list[str]:
    """The base build arguments (``PYTHON_IMAGE``, ...) the stages are built on."""
    return sorted({arg for stage in stages for arg in BASES if stage.base == f"${{{arg}}}"})


def tools_of(target: str) -> tuple[Component, ...]:
    """The built tools (``scripts/tools.sh``) the bases of ``target`` take in."""
    _, stages = parse_dockerfile((REPO_ROOT / DOCKERFILE).read_text())
    return tuple(c for arg in _bases_of(_stages_of(target, stages)) for c in BASES[arg].tools)


def _copied_sources(stages: Sequence[Stage]) -> list[str]:
    """The build context's paths that the stages ``COPY`` (not from other stages)."""
    sources: list[str] = []
    for stage in stages:
        for keyword, value in stage.instructions:
            if keyword == "COPY" and not value.startswith("--from="):
                sources += [s for s in value.split()[:-1] if s not in sources]
    return sources


# -- This machine's package sources ----------------------------------------------------------


def apt_sources(etc_apt: Path = Path("/etc/apt")) -> str:
    """This machine's enabled apt sources for bookworm as one deb822 text ("" when it has
    none): its ``*.sources`` paragraphs and its one-line ``deb`` entries."""
    paragraphs: list[str] = []
    for path in sorted(etc_apt.glob("sources.list.d/*.sources")):
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            lines = [line for line in paragraph.splitlines() if not line.lstrip().startswith("#")]
            fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
            if (
                "deb" in fields.get("types", "").split()
                and fields.get("enabled", "yes") != "no"
                and any(s.startswith(SUITE) for s in fields.get("suites", "").split())
            ):
                paragraphs.append("\n".join(line for line in lines if line.strip()))
    for path in [etc_apt / "sources.list", *sorted(etc_apt.glob("sources.list.d/*.list"))]:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        for line in lines:
            entry = re.fullmatch(r"\s*deb\s+(?:\[([^]]*)\]\s+)?(\S+)\s+(\S+)\s+(.+)", line)
            if entry is None or not entry.group(3).startswith(SUITE):
                continue
            signed_by = re.search(r"signed-by=(\S+)", entry.group(1) or "")
            paragraphs.append(
                f"Types: deb\nURIs: {entry.group(2)}\nSuites: {entry.group(3)}\n"
                f"Components: {entry.group(4).strip()}"
                + (f"\nSigned-By: {signed_by.group(1)}" if signed_by else "")
            )
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


def _ca_certificates() -> list[str]:
    """Every certificate of this machine's CA bundle (PEM)."""
    for candidate in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            text = Path(candidate).read_text(encoding="utf-8", errors="replace")
            return re.findall(
                r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, flags=re.S
            )
    return []


def _pip_config() -> str:
    """This machine's pip settings that say where packages come from, as a pip.conf."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        match = re.fullmatch(r"[^.]*\.([\w-]+)='(.*)'", line.strip())
        if match and match.group(1) in _PIP_SETTINGS:
            settings[match.group(1)] = match.group(2)
    if not settings:
        return ""
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(settings.items()))


# -- Stand-in bases --------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseRecipe:
    """How one stand-in base is made: mmdebstrap's variant and packages, what it adds from
    this machine, and the image configuration."""

    build_arg: str
    """The jobs/Dockerfile build argument it stands in for ("" for a test's own image)."""
    name: str
    variant: str
    packages: tuple[str, ...]
    tools: tuple[Component, ...] = ()
    hooks: tuple[str, ...] = ()
    config: tuple[str, ...] = ()
    host_sources: bool = True
    """Whether it gets this machine's CA certificates and pip settings (it runs apt or pip)."""
    hook_stage: str = "customize"
    """When mmdebstrap runs the hooks: ``customize`` (installed) or ``extract`` (the only
    hooks the ``extract`` variant runs)."""


BASES: Final[dict[str, BaseRecipe]] = {
    recipe.build_arg: recipe
    for recipe in (
        BaseRecipe(
            build_arg="PYTHON_IMAGE",
            name="python",
            variant="minbase",
            packages=(
                "ca-certificates",
                "libpython3.11",
                "python3",
                "python3-venv",
                "python-is-python3",
            ),
            config=("--cmd", '["python3"]'),
        ),
        BaseRecipe(
            build_arg="BUSYBOX_IMAGE",
            name="busybox",
            # Only busybox-static's files: no dpkg, no libc (the binary is static).
            variant="extract",
            packages=("busybox-static",),
            # Links made from outside: `busybox --install` needs a /proc the chroot lacks.
            hook_stage="extract",
            hooks=(
                'for applet in $(chroot "$1" /bin/busybox --list); do'
                ' [ "$applet" = busybox ] || ln -sf busybox "$1/bin/$applet"; done',
                'mkdir -p -m 1777 "$1/tmp"',
            ),
            config=("--cmd", '["sh"]'),
            host_sources=False,
        ),
        BaseRecipe(
            build_arg="PULUMI_IMAGE",
            name="pulumi",
            variant="minbase",
            packages=("ca-certificates", "git", "python3", "python3-venv"),
            tools=("pulumi", "yaml", "kubernetes_provider"),
            hooks=(
                'echo "pulumi:x:1000:1000:pulumi:/home/pulumi:/bin/bash" >> "$1/etc/passwd"',
                'echo "pulumi:x:1000:" >> "$1/etc/group"',
                'install -d -o 1000 -g 1000 "$1/home/pulumi"',
            ),
            config=(
                "--env",
                f"PATH=/pulumi/bin:{DEFAULT_PATH}",
                "--user",
                "1000:1000",
                "--workingdir",
                "/home/pulumi",
                "--cmd",
                '["pulumi"]',
            ),
        ),
    )
}


@dataclass(frozen=True)
class Builder:
    """buildah with its storage under ``root``: overlay where the kernel has it, else vfs."""

    root: Path

    @property
    def driver(self) -> str:
        filesystems = Path("/proc/filesystems")
        has_overlay = filesystems.is_file() and "\toverlay\n" in filesystems.read_text()
        return "overlay" if has_overlay else "vfs"

    def argv(self, *args: str) -> list[str]:
        storage = self.root / f"storage-{self.driver}"
        return [
            "buildah",
            "--root",
            str(storage),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            self.driver,
            *args,
        ]

    def run(self, *args: str, log: Path | None = None) -> str:
        """Run buildah; its output goes to ``log`` when given (and is returned otherwise)."""
        return _run(self.argv(*args), log=log, step=f"buildah {args[0]}")

    def has_image(self, name: str) -> bool:
        found = subprocess.run(
            self.argv("inspect", "--type", "image", name), capture_output=True, check=False
        )
        return found.returncode == 0

    def images(self, repository: str) -> list[str]:
        listed = self.run("images", "--format", "{{.Name}}:{{.Tag}}")
        return [n for n in listed.split() if n.startswith(repository + "/")]


def _run(argv: list[str], *, log: Path | None, step: str) -> str:
    if log is None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImageBuildFailed(f"{step} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        code = subprocess.call(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
        raise ImageBuildFailed(f"{step} failed ({code}); log {log}:\n{tail}")
    return ""


def _digest(*parts: bytes | str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "big") + data)
    return hasher.hexdigest()[:16]


def _hash_tree(paths: Sequence[Path], relative_to: Path) -> str:
    """A hash of the files under ``paths``: names, modes and contents, in a stable order."""
    hasher = hashlib.sha256()
    files = sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    for path in files:
        hasher.update(f"{path.relative_to(relative_to)}\0{path.stat().st_mode & 0o111}\0".encode())
        with path.open("rb") as data:
            for chunk in iter(lambda: data.read(1 << 20), b""):
                hasher.update(chunk)
    return hasher.hexdigest()


@dataclass(frozen=True)
class HostSources:
    """What the stand-ins take from this machine (all of it goes into their keys)."""

    apt: str
    certificates: tuple[str, ...]
    pip_conf: str

    @classmethod
    def of_this_machine(cls) -> HostSources:
        return cls(apt_sources(), tuple(_ca_certificates()), _pip_config())


def _base_key(recipe: BaseRecipe, host: HostSources) -> str:
    tool_dirs = [find_tools(recipe.tools).bin_dir(c) for c in recipe.tools]
    return _digest(
        repr(recipe),
        SUITE,
        *_DEBIAN_IMAGE_OPTIONS,
        host.apt,
        *(host.certificates if recipe.host_sources else ()),
        host.pip_conf if recipe.host_sources else "",
        *(_hash_tree([d], d.parent) for d in tool_dirs),
    )


def _base_tag(recipe: BaseRecipe, host: HostSources) -> str:
    return f"{_BASE_REPOSITORY}/{recipe.name}:{_base_key(recipe, host)}"


def _make_base(
    recipe: BaseRecipe, tag: str, host: HostSources, builder: Builder, log: Path
) -> None:
    """mmdebstrap the stand-in into a tarball, then commit it as ``tag`` in buildah's storage."""
    with tempfile.TemporaryDirectory(prefix=f"pkobatch-base-{recipe.name}-") as work_dir:
        rootfs = Path(work_dir) / "rootfs.tar"
        _debootstrap(recipe, host, rootfs, log)
        container = builder.run("from", "scratch").strip()
        try:
            builder.run("add", container, str(rootfs), "/", log=log)
            builder.run(
                "config", "--env", f"PATH={DEFAULT_PATH}", *recipe.config, container, log=log
            )
            builder.run("commit", "--rm", container, tag, log=log)
        except BaseException:
            with contextlib.suppress(ImageBuildFailed):
                builder.run("rm", container)
            raise


def debian_rootfs(recipe: BaseRecipe) -> Path:
    """The root filesystem of ``recipe`` as a tarball (``images_root()/rootfs/<name>-<key>.tar``,
    an image layer as it is), made with mmdebstrap unless it exists for the same inputs; its
    other versions are dropped once unused as long as older archives are. Raises
    ``BuilderMissing`` without mmdebstrap and ``ImageBuildFailed`` when it fails."""
    if shutil.which("mmdebstrap") is None:
        raise BuilderMissing(
            "making a Debian root filesystem needs mmdebstrap: run "
            "`apt-get install mmdebstrap` as root, or scripts/bootstrap.sh"
        )
    root = images_root()
    host = HostSources.of_this_machine()
    rootfs = root / "rootfs" / f"{recipe.name}-{_base_key(recipe, host)}.tar"
    # A lock of its own: the images' builds need not wait for it.
    with _locked(rootfs.parent):
        if not rootfs.is_file():
            (root / "logs").mkdir(exist_ok=True)
            partial = rootfs.with_suffix(".partial")
            partial.unlink(missing_ok=True)  # a build that was killed
            _debootstrap(recipe, host, partial, root / "logs" / f"rootfs-{recipe.name}.log")
            partial.rename(rootfs)
        os.utime(rootfs)  # in use: another checkout's call keeps it
        versions = re.compile(rf"{re.escape(recipe.name)}-[0-9a-f]{{16}}\.tar")
        for old in rootfs.parent.iterdir():
            if (
                versions.fullmatch(old.name)
                and old != rootfs
                and time.time() - old.stat().st_mtime > _ARCHIVES_KEPT_UNUSED
            ):
                old.unlink()
    return rootfs


def _debootstrap(recipe: BaseRecipe, host: HostSources, rootfs: Path, log: Path) -> None:
    """mmdebstrap the recipe's root filesystem into the tarball ``rootfs``."""
    with tempfile.TemporaryDirectory(prefix=f"pkobatch-rootfs-{recipe.name}-") as work_dir:
        work = Path(work_dir)
        hooks: list[str] = []
        if recipe.host_sources and host.certificates:
            certs = work / "pkobatch-host"
            certs.mkdir()
            for index, pem in enumerate(host.certificates):
                (certs / f"host-{index:03d}.crt").write_text(pem + "\n")
            hooks += [
                f"copy-in {certs} /usr/local/share/ca-certificates",
                'chroot "$1" update-ca-certificates >/dev/null',
            ]
        if recipe.host_sources and host.pip_conf:
            (work / "pip.conf").write_text(host.pip_conf)
            hooks.append(f"upload {work / 'pip.conf'} /etc/pip.conf")
        if recipe.tools:
            tools = find_tools(recipe.tools)
            binaries = sorted(
                str(f)
                for c in recipe.tools
                for f in tools.bin_dir(c).iterdir()
                if f.is_file() and os.access(f, os.X_OK)
            )
            hooks += ['mkdir -p "$1/pulumi/bin"', f"copy-in {' '.join(binaries)} /pulumi/bin"]
        hooks += recipe.hooks
        mirrors: list[str] = []
        if host.apt:
            (work / "host.sources").write_text(host.apt)
            mirrors.append(str(work / "host.sources"))
        _run(
            [
                "mmdebstrap",
                f"--variant={recipe.variant}",
                "--format=tar",
                *([f"--include={','.join(recipe.packages)}"] if recipe.packages else []),
                "--skip=output/dev",
                *_DEBIAN_IMAGE_OPTIONS,
                *(f"--{recipe.hook_stage}-hook={hook}" for hook in hooks),
                SUITE,
                str(rootfs),
                *mirrors,
            ],
            log=log,
            step=f"mmdebstrap of the {recipe.name} base",
        )


# -- Targets ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltImage:
    """One target's image, exported as an OCI archive."""

    target: str
    name: str
    """The name the install refers to it by, e.g. ``pkobatch/runner:0.1.0``."""
    archive: Path
    archive_bytes: int
    unpacked_bytes: int
    seconds: float
    """How long making it took in this call (0 when it came from the cache)."""
    cached: bool

    @property
    def reference(self) -> str:
        """The full name inside the archive (and a container runtime's after import)."""
        return full_name(self.name)


def _stage_context(sources: Sequence[str], dockerfile: Path, into: Path) -> None:
    """Copy the files the Dockerfile copies (no caches) and the Dockerfile itself into ``into``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source in [*sources, str(DOCKERFILE)]:
        origin = REPO_ROOT / source
        target = into / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(origin if source != str(DOCKERFILE) else dockerfile, target)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One build at a time on this machine (tests and engineers share the cache)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_images(
    targets: Sequence[str] = TARGETS, *, progress: bool = False
) -> dict[str, BuiltImage]:
    """Each target of jobs/Dockerfile as an OCI archive, built on the stand-in bases unless
    its archive for the same inputs exists. Raises ``BuilderMissing`` without buildah or
    mmdebstrap, ``ToolsMissing`` when the Pulumi base's tools are not built, and
    ``ImageBuildFailed`` (with the log's tail) when a step fails."""
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown targets {unknown}; jobs/Dockerfile builds {list(TARGETS)}")
    dockerfile = REPO_ROOT / DOCKERFILE
    if not dockerfile.is_file():
        raise FileNotFoundError(f"{dockerfile} not found: build images from a pkobatch checkout")
    require_builder()
    root = images_root()
    builder = Builder(root)
    say = (lambda message: print(f"[images] {message}", file=sys.stderr)) if progress else None
    _, stages = parse_dockerfile(dockerfile.read_text())
    host = HostSources.of_this_machine()
    built: dict[str, BuiltImage] = {}
    with _locked(root):
        (root / "archives").mkdir(exist_ok=True)
        (root / "logs").mkdir(exist_ok=True)
        # Working containers of a build that was killed: they would pin stale layers.
        builder.run("rm", "--all")
        base_tags: dict[str, str] = {}
        for target in targets:
            needed = _stages_of(target, stages)
            args = _bases_of(needed)
            for arg in args:
                if arg not in base_tags:
                    base_tags[arg] = _base(arg, host, builder, root, say)
            built[target] = _target(target, needed, dockerfile, base_tags, args, builder, root, say)
        _forget_stale(builder, root, set(base_tags.values()), built)
    return built


def _base(arg: str, host: HostSources, builder: Builder, root: Path, say: _Say) -> str:
    recipe = BASES[arg]
    tag = _base_tag(recipe, host)
    if builder.has_image(tag):
        return tag
    if say:
        say(f"making the {recipe.name} base {tag} with mmdebstrap")
    started = time.monotonic()
    _make_base(recipe, tag, host, builder, root / "logs" / f"base-{recipe.name}.log")
    if say:
        say(f"{recipe.name} base made in {time.monotonic() - started:.0f} s")
    return tag


def _target(
    target: str,
    stages: list[Stage],
    dockerfile: Path,
    base_tags: dict[str, str],
    args: list[str],
    builder: Builder,
    root: Path,
    say: _Say,
) -> BuiltImage:
    name = IMAGE_NAMES[target]
    with tempfile.TemporaryDirectory(prefix=f"pkobatch-context-{target}-") as context_dir:
        context = Path(context_dir)
        _stage_context(_copied_sources(stages), dockerfile, context)
        key = _digest(target, name, _hash_tree([context], context), *(base_tags[a] for a in args))
        archive = root / "archives" / f"{target}-{key}.tar"
        summary = archive.with_suffix(".json")
        if summary.is_file() and archive.is_file():
            recorded = json.loads(summary.read_text())
            # Marks it as in use, so that another checkout's build does not forget it.
            os.utime(archive)
            return BuiltImage(target, name, archive, archive.stat().st_size, recorded, 0.0, True)
        if say:
            say(f"building {target} ({name}) with buildah")
        log = root / "logs" / f"{target}.log"
        log.write_text("")
        started = time.monotonic()
        tag = f"{_BUILD_REPOSITORY}/{target}:{key}"
        builder.run(
            "build",
            "--layers",
            # No working containers left behind by a failed step.
            "--force-rm",
            "--pull=never",
            "--isolation=chroot",
            "--target",
            target,
            "--tag",
            tag,
            "--file",
            str(context / DOCKERFILE),
            *(f"--build-arg={a}={base_tags[a]}" for a in args),
            str(context),
            log=log,
        )
    pushed = archive.with_suffix(".pushed")
    partial = archive.with_suffix(".partial")
    builder.run("push", tag, f"oci-archive:{pushed}:{full_name(name)}", log=log)
    _name_for_containerd(pushed, partial, full_name(name))
    pushed.unlink()
    partial.rename(archive)
    unpacked = unpacked_bytes(archive)
    summary.write_text(json.dumps(unpacked))
    seconds = time.monotonic() - started
    if say:
        say(f"{target} built in {seconds:.0f} s: {archive}")
    return BuiltImage(target, name, archive, archive.stat().st_size, unpacked, seconds, False)


def _forget_stale(
    builder: Builder, root: Path, bases: set[str], built: dict[str, BuiltImage]
) -> None:
    """Drop what the inputs of this call replaced: older versions of the bases it used, the
    build tags and their layers (the archives keep the images), older archives of its
    targets that nothing built or used for ``_ARCHIVES_KEPT_UNUSED`` (several checkouts of
    the repository share the cache and each builds its own version)."""
    for tag in builder.images(_BASE_REPOSITORY):
        repository = tag.rpartition(":")[0]
        if tag not in bases and any(b.rpartition(":")[0] == repository for b in bases):
            builder.run("rmi", "--force", tag)
    for tag in builder.images(_BUILD_REPOSITORY):
        builder.run("rmi", tag)
    builder.run("rmi", "--prune")
    for image in built.values():
        versions = re.compile(
            rf"{re.escape(image.target)}-[0-9a-f]{{16}}\.(tar|json|pushed|partial)"
        )
        for old in (root / "archives").iterdir():
            if (
                versions.fullmatch(old.name)
                and old.stem != image.archive.stem
                and time.time() - old.stat().st_mtime > _ARCHIVES_KEPT_UNUSED
            ):
                old.unlink()


# -- OCI archives ----------------------------------------------------------------------------


def _name_for_containerd(source: Path, target: Path, reference: str) -> None:
    """Copy the OCI archive with its image named for containerd too: ``ctr images import``
    names an image by the annotation ``io.containerd.image.name``; buildah writes only
    ``org.opencontainers.image.ref.name``."""
    with tarfile.open(source) as pushed, tarfile.open(target, "w") as out:
        for member in pushed:
            data = pushed.extractfile(member) if member.isfile() else None
            if member.name == "index.json" and data is not None:
                index = json.load(data)
                for manifest in index["manifests"]:
                    manifest.setdefault("annotations", {})[CONTAINERD_NAME_ANNOTATION] = reference
                raw = json.dumps(index).encode()
                member.size = len(raw)
                data = io.BytesIO(raw)
            out.addfile(member, data)


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile("blobs/" + digest.replace(":", "/"))
    if member is None:
        raise ValueError(f"{archive.name!s}: no blob {digest}")
    return member.read()


def image_manifest(path: Path) -> dict[str, object]:
    """The manifest of the one image in the OCI archive ``path``."""
    with tarfile.open(path) as archive:
        index_file = archive.extractfile("index.json")
        if index_file is None:
            raise ValueError(f"{path}: not an OCI archive (no index.json)")
        (descriptor,) = json.load(index_file)["manifests"]
        manifest: dict[str, object] = json.loads(_blob(archive, descriptor["digest"]))
        return manifest


def image_config(path: Path) -> dict[str, object]:
    """The OCI image configuration of the one image in the archive (``config`` holds its
    ``User``, ``Entrypoint``, ``Cmd``, ``Env``)."""
    manifest = image_manifest(path)
    with tarfile.open(path) as archive:
        config: dict[str, object] = json.loads(_blob(archive, manifest["config"]["digest"]))  # type: ignore[index]
        return config


def _layer_entries(path: Path) -> Iterator[tarfile.TarInfo]:
    """Every entry of every layer of the image in the OCI archive ``path``, in order."""
    manifest = image_manifest(path)
    with tarfile.open(path) as archive:
        for layer in manifest["layers"]:  # type: ignore[attr-defined]
            member = archive.extractfile("blobs/" + layer["digest"].replace(":", "/"))
            with tarfile.open(fileobj=member, mode="r|*") as files:
                yield from files


def unpacked_bytes(path: Path) -> int:
    """The size of the image's files: every regular file of every layer, uncompressed."""
    return sum(entry.size for entry in _layer_entries(path) if entry.isreg())


def image_paths(path: Path) -> frozenset[str]:
    """Every path any layer of the image holds, relative (``usr/bin/pulumi``)."""
    names = (entry.name.removeprefix("./").rstrip("/") for entry in _layer_entries(path))
    return frozenset(name for name in names if name not in ("", "."))


# -- Command line ----------------------------------------------------------------------------


def summary(images: dict[str, BuiltImage]) -> str:
    """One line per image: name, archive size, unpacked size, build time or "cached"."""
    rows = [("image", "archive (compressed)", "unpacked", "built in", "archive")]
    for image in images.values():
        rows.append(
            (
                image.name,
                f"{image.archive_bytes / 1e6:.1f} MB",
                f"{image.unpacked_bytes / 1e6:.1f} MB",
                "cached" if image.cached else f"{image.seconds:.0f} s",
                str(image.archive),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pkobatch.dev.images",
        description="Build jobs/Dockerfile's targets on bases made from Debian's packages "
        "(cached by their inputs) and print each image's size.",
    )
    parser.add_argument(
        "targets", nargs="*", metavar="TARGET", help=f"default: {' '.join(TARGETS)}"
    )
    targets = parser.parse_args(argv).targets or list(TARGETS)
    started = time.monotonic()
    try:
        images = build_images(targets, progress=True)
    except (BuilderMissing, ImageBuildFailed, ToolsMissing, ValueError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    print(summary(images))
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
