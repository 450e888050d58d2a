"""How a program runs: through the Pulumi CLI's language host for its runtime, or inline.

A run executes a program the way ``pulumi up`` in its directory would: the CLI starts the
language host of the project's ``runtime`` (``pulumi-language-nodejs``, ``-python``,
``-go``, ``-dotnet``, ``-java``, ``-yaml``), which reads the project's own ``Pulumi.yaml``
options (``main``, ``virtualenv``/``toolchain``, ``packagemanager``, ``binary``,
``buildTarget``, ...) and uses the runtime's toolchain from the image. The runner adds
three things around that:

- **A check before anything starts.** The language host and the toolchain it needs must be
  on ``PATH`` (or, for the host, next to the ``pulumi`` executable or installed as a plugin
  under ``$PULUMI_HOME/plugins``); a missing one fails the run with ``InvalidSpec`` and a
  message naming it, instead of a Pulumi stack trace halfway through.
- **Dependencies, installed as ``pulumi install`` installs them** (it asks the language host
  to; the host runs pip/uv/poetry, npm/yarn/pnpm, ``go mod``, ``dotnet``, Maven/Gradle).
- **Package caches on ``PKOBATCH_CACHE_DIR``.** Every package manager's cache variable
  points under the cache directory unless the environment already sets it, so a cache on a
  PersistentVolume makes the second run of a program fetch nothing again. Plugins go to
  ``$PULUMI_HOME/plugins``; when only ``PKOBATCH_CACHE_DIR`` is set, ``PULUMI_HOME`` becomes
  ``$PKOBATCH_CACHE_DIR/pulumi-home`` so plugins are cached too.

**The inline fallback.** A Python program runs *inline* (``pkobatch.runner.workspace``:
the runner's own interpreter executes it through the Automation API's language server) only
when ``pulumi-language-python`` is absent and the runner is a normal Python installation.
The injected runner bundle (a frozen executable, used with custom images) has no
interpreter a program could share, so there a missing Python host is an ``InvalidSpec``
like any other. The run's log and its result (``languageHost``) say which path ran.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pkobatch.runner.failures import RunFailure

RUNTIMES: Final = ("nodejs", "python", "go", "dotnet", "java", "yaml")
INLINE_PYTHON: Final = "inline-python"
INSTALL_TIMEOUT_SECONDS: Final = 1800.0

# Package-manager cache variables and their directory under the cache root.
CACHE_VARIABLES: Final[dict[str, str]] = {
    "PIP_CACHE_DIR": "pip",
    "UV_CACHE_DIR": "uv",
    "POETRY_CACHE_DIR": "poetry",
    "npm_config_cache": "npm",
    "YARN_CACHE_FOLDER": "yarn",
    "npm_config_store_dir": "pnpm-store",
    "BUN_INSTALL_CACHE_DIR": "bun",
    "GOMODCACHE": "go/mod",
    "GOCACHE": "go/build",
    "NUGET_PACKAGES": "nuget",
    "GRADLE_USER_HOME": "gradle",
}
MAVEN_REPOSITORY: Final = "maven"
PULUMI_HOME_DIRECTORY: Final = "pulumi-home"

# What each runtime's language host needs from the image besides itself.
_PACKAGE_MANAGERS: Final = ("npm", "yarn", "pnpm", "bun")
_PYTHON_TOOLCHAINS: Final = ("pip", "uv", "poetry")


def host_name(runtime: str) -> str:
    return f"pulumi-language-{runtime}"


@dataclass(frozen=True)
class ProgramHost:
    """How this run's program is executed."""

    runtime: str
    # The language host executable; None when a Python program runs inline.
    host: Path | None

    @property
    def inline(self) -> bool:
        return self.host is None

    @property
    def label(self) -> str:
        """What the result records in ``languageHost``."""
        return INLINE_PYTHON if self.host is None else host_name(self.runtime)


def search_path(env: Mapping[str, str], pulumi: str | None) -> list[Path]:
    """Where the CLI looks for a language host: beside ``pulumi`` first, then ``PATH``."""
    entries = [Path(pulumi).parent] if pulumi else []
    entries += [Path(entry) for entry in env.get("PATH", "").split(os.pathsep) if entry]
    return entries


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def which(names: Sequence[str], directories: Sequence[Path]) -> Path | None:
    """The first executable of ``names`` (in order of preference) in ``directories``."""
    for name in names:
        for directory in directories:
            candidate = directory / name
            if _executable(candidate):
                return candidate
    return None


def find_language_host(runtime: str, directories: Sequence[Path], pulumi_home: Path) -> Path | None:
    """``pulumi-language-<runtime>`` on the search path, or installed as a plugin."""
    found = which([host_name(runtime)], directories)
    if found is not None:
        return found
    plugins = sorted((pulumi_home / "plugins").glob(f"language-{runtime}-v*"), reverse=True)
    return which([host_name(runtime)], plugins)


def required_tools(
    runtime: str, options: Mapping[str, Any], directory: Path
) -> list[tuple[str, ...]]:
    """Executables the runtime's language host needs for this project; each entry lists
    alternatives, any one of which will do."""
    if runtime == "nodejs":
        manager = str(options.get("packagemanager") or "npm")
        tools: list[tuple[str, ...]] = [("node",)]
        if manager in _PACKAGE_MANAGERS and (directory / "package.json").is_file():
            tools.append((manager,))
        return tools
    if runtime == "python":
        toolchain = str(options.get("toolchain") or "pip")
        if toolchain in _PYTHON_TOOLCHAINS and toolchain != "pip":
            return [(toolchain,)]
        return [("python3", "python")]
    if runtime == "go":
        return [] if options.get("binary") else [("go",)]
    if runtime == "dotnet":
        return [("dotnet",)]
    if runtime == "java":
        tools = [("java",)]
        if options.get("binary"):
            return tools
        if (directory / "pom.xml").is_file():
            tools.append(("mvn",))
        elif not (directory / "gradlew").is_file() and any(
            (directory / name).is_file() for name in ("build.gradle", "build.gradle.kts")
        ):
            tools.append(("gradle",))
        return tools
    return []


def is_frozen() -> bool:
    """True inside the injected runner bundle (a frozen executable, no usable interpreter)."""
    return bool(getattr(sys, "frozen", False))


def choose_program_host(
    runtime: str,
    options: Mapping[str, Any],
    directory: Path,
    directories: Sequence[Path],
    pulumi_home: Path,
    frozen: bool,
) -> ProgramHost:
    """The language host that runs the program, or a RunFailure naming what is missing."""
    if runtime not in RUNTIMES:
        raise RunFailure(
            "InvalidSpec",
            f"Pulumi.yaml: runtime {runtime!r} is not a Pulumi runtime; use one of "
            + ", ".join(RUNTIMES),
        )
    host = find_language_host(runtime, directories, pulumi_home)
    if host is None:
        if runtime == "python" and not frozen:
            return ProgramHost(runtime, None)
        raise RunFailure(
            "InvalidSpec",
            f"the {runtime} program needs the language host {host_name(runtime)}, which is "
            "not in the run's image (searched beside pulumi, on PATH and under "
            f"$PULUMI_HOME/plugins): run it in an image that has it, e.g. the official "
            f"pulumi/pulumi or pulumi/pulumi-{runtime} images "
            "(spec.workspaceTemplate.spec.image)",
        )
    for alternatives in required_tools(runtime, options, directory):
        if which(alternatives, directories) is None:
            raise RunFailure(
                "InvalidSpec",
                f"the {runtime} program needs {' or '.join(alternatives)} on PATH, which the "
                "run's image does not have: use an image that provides the runtime's "
                "toolchain (spec.workspaceTemplate.spec.image)",
            )
    return ProgramHost(runtime, host)


def cache_environment(cache_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Cache variables for package managers and plugins that ``env`` does not set itself."""
    cached = {
        name: str(cache_dir / relative)
        for name, relative in CACHE_VARIABLES.items()
        if not env.get(name)
    }
    repository = f"-Dmaven.repo.local={cache_dir / MAVEN_REPOSITORY}"
    maven_opts = env.get("MAVEN_OPTS", "")
    if "maven.repo.local" not in maven_opts:
        cached["MAVEN_OPTS"] = f"{maven_opts} {repository}".strip()
    return cached


def pulumi_home(env: Mapping[str, str], cache_dir_configured: bool, cache_dir: Path) -> str | None:
    """``PULUMI_HOME`` for the run: the environment's own, else one on the configured
    cache directory (plugins are cached there), else Pulumi's default (None)."""
    if env.get("PULUMI_HOME"):
        return env["PULUMI_HOME"]
    if cache_dir_configured:
        return str(cache_dir / PULUMI_HOME_DIRECTORY)
    return None


# `pulumi install`: the language host installs the project's dependencies (and the CLI the
# SDKs of Pulumi.yaml's `packages`). Not the plugins: for a package without a version (YAML
# resources name none) `pulumi install` asks GitHub for the latest release even when the
# plugin is on PATH, and fails without internet access. The operation itself loads plugins
# from beside `pulumi`, PATH or the plugin cache and downloads only missing ones (unless
# PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION is set), into $PULUMI_HOME/plugins.
INSTALL_ARGS: Final = ("install", "--no-plugins", "--non-interactive")
