"""The program a run executes: its project file, and the inline way to run Python.

Most programs run through the Pulumi CLI's language host (``pkobatch.runner.runtimes``).
This module reads and writes the project file and holds the **inline Python fallback**,
used only when ``pulumi-language-python`` is absent: the runner loads the program itself,
as the Automation API's *inline program*, and the CLI talks to the Automation API's
language server in the runner's process (``--client``). The program's ``__main__.py`` (or
its Pulumi.yaml ``main``) is executed with ``runpy`` exactly as Pulumi's own
``pulumi-language-python-exec`` does, from the project directory.

**Inline dependencies.** A program with a ``requirements.txt`` gets a virtualenv built once
per requirements hash under ``$PKOBATCH_CACHE_DIR/venvs/<sha256>`` (put the cache on a PVC
to share it between Jobs): it is built in a temporary directory, its manifest recorded, and
renamed into place, so concurrent runs never see a half-built one, and one whose files no
longer match its manifest is built again (``pkobatch.runner.run_cache``). The runner's
process appends the virtualenv's site-packages to ``sys.path`` (the runner's own ``pulumi``
keeps precedence — the language server and the program must share one SDK), and
Pulumi.yaml's ``virtualenv`` option points at it so dynamic providers
(``pulumi-resource-pulumi-python``) run with it. A program without ``requirements.txt`` uses
the runner's interpreter (``PULUMI_PYTHON_CMD``), which has ``pulumi`` and ``dill``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import runpy
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from pkobatch.api.run import CACHE_DIR_ENV, ProjectInfo
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.run_cache import (
    LAST_USED_SUFFIX,
    LOCK_SUFFIX,
    LOCK_WAIT_SECONDS,
    CacheFull,
    entry_lock,
    is_disk_full,
    manifest_problem,
    record_manifest,
    remove_tree,
    touch,
)
from pkobatch.runner.runtimes import INSTALL_TIMEOUT_SECONDS

PROJECT_FILES: Final = ("Pulumi.yaml", "Pulumi.yml", "Pulumi.json")


@dataclass
class Project:
    """A Pulumi project file, read into a dict so it can be adjusted and written back."""

    path: Path
    settings: dict[str, Any]

    @property
    def directory(self) -> Path:
        return self.path.parent

    @property
    def info(self) -> ProjectInfo:
        runtime = self.settings.get("runtime")
        name = runtime.get("name", "") if isinstance(runtime, Mapping) else runtime
        return ProjectInfo(name=str(self.settings.get("name", "")), runtime=str(name or ""))

    def main_path(self) -> Path:
        """The file or directory the program starts from."""
        return (self.directory / str(self.settings.get("main") or ".")).resolve()

    def save(self) -> None:
        if self.path.suffix == ".json":
            text = json.dumps(self.settings, indent=2)
        else:
            text = yaml.safe_dump(self.settings, sort_keys=False)
        self.path.write_text(text)


def load_project(directory: Path) -> Project:
    for name in PROJECT_FILES:
        path = directory / name
        if path.is_file():
            text = path.read_text()
            try:
                loaded = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError) as error:
                raise RunFailure("ProgramError", f"{path.name} is not valid: {error}") from None
            if not isinstance(loaded, dict) or not loaded.get("name"):
                raise RunFailure("ProgramError", f"{path.name} needs a project name (name: ...)")
            return Project(path, loaded)
    raise RunFailure(
        "SourceUnavailable",
        f"no Pulumi.yaml in {directory.name or directory}: check spec.repoDir (or "
        "workspaceTemplate.spec.local.dir)",
    )


def with_python_environment(settings: Mapping[str, Any], virtualenv: str | None) -> dict[str, Any]:
    """Project settings whose Python runtime uses ``virtualenv`` (an absolute path), or the
    runner's interpreter when None (any ``virtualenv``/``toolchain`` option removed)."""
    runtime = settings.get("runtime")
    name = runtime.get("name", "python") if isinstance(runtime, Mapping) else runtime
    options = dict(runtime.get("options") or {}) if isinstance(runtime, Mapping) else {}
    options.pop("toolchain", None)
    options.pop("virtualenv", None)
    if virtualenv:
        options["virtualenv"] = virtualenv
    new_runtime: dict[str, Any] = {"name": name}
    if options:
        new_runtime["options"] = options
    return {**settings, "runtime": new_runtime}


def requirements_key(requirements: bytes) -> str:
    """Cache key of a virtualenv: the requirements and the interpreter they are built for."""
    digest = hashlib.sha256()
    digest.update(requirements)
    digest.update(f"\0{sys.version}\0{platform.machine()}\0{sys.implementation.name}".encode())
    return digest.hexdigest()


def cache_dir_from(env: Mapping[str, str]) -> Path:
    configured = env.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pkobatch"


def site_packages(venv: Path) -> Path:
    relative = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    return venv / relative


Log = Callable[[str], None]
Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]
"""Runs one command with a timeout of ``INSTALL_TIMEOUT_SECONDS`` (e.g. ``Cancellation.run``)."""


def ensure_virtualenv(
    cache_dir: Path, requirements: Path, log: Log, run: Run, held: contextlib.ExitStack
) -> Path:
    """The cached virtualenv for ``requirements``, built first if missing or damaged (see
    ``pkobatch.runner.run_cache``); the run keeps a shared lock on it in ``held``. Raises
    ``CacheFull`` when the cache ran out of space."""
    key = requirements_key(requirements.read_bytes())
    venvs = cache_dir / "venvs"
    target = venvs / key
    lock = venvs / f"{key}{LOCK_SUFFIX}"
    try:
        venvs.mkdir(parents=True, exist_ok=True)
        if target.exists():
            # Checked under the shared lock, so a pruning run cannot remove it in between.
            using = contextlib.ExitStack()
            locked = using.enter_context(
                entry_lock(lock, shared=True, wait_seconds=LOCK_WAIT_SECONDS)
            )
            problem = manifest_problem(target) if locked else "other runs hold it locked"
            if problem is None:
                held.enter_context(using)
                touch(venvs / f"{key}{LAST_USED_SUFFIX}")
                log(f"dependencies: using cached virtualenv {target}")
                return target
            using.close()
            log(f"cache: virtualenv {key[:12]} is not used ({problem}); building it again")
        return _build_virtualenv(venvs, key, requirements, log, run, held)
    except OSError as error:
        if is_disk_full(error):
            raise CacheFull(str(error)) from None
        raise


def _build_virtualenv(
    venvs: Path, key: str, requirements: Path, log: Log, run: Run, held: contextlib.ExitStack
) -> Path:
    """Build the virtualenv in a temporary directory, record its manifest and rename it into
    place under the entry's exclusive lock (replacing a damaged one)."""
    target = venvs / key
    lock = venvs / f"{key}{LOCK_SUFFIX}"
    building = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=venvs))
    log(f"dependencies: installing {requirements.name} into a new virtualenv ({key[:12]})")
    keep_building = False
    try:
        for command in (
            [sys.executable, "-m", "venv", str(building)],
            [
                str(building / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                str(requirements),
            ],
        ):
            done = run(command)
            if done.returncode != 0:
                said = (done.stderr or done.stdout).strip()
                if is_disk_full(said):
                    raise CacheFull(said)
                raise RunFailure("ProgramError", f"installing {requirements.name} failed: {said}")
        record_manifest(building)
        with entry_lock(lock, wait_seconds=LOCK_WAIT_SECONDS) as exclusive:
            if not exclusive:
                # Runs still hold the damaged one: this run uses its own, removed after it.
                log(f"cache: virtualenv {key[:12]} is in use; this run uses a private copy")
                keep_building = True
                held.callback(shutil.rmtree, building, ignore_errors=True)
                return building
            if manifest_problem(target) is not None:  # else another run finished it first
                remove_tree(target)
                os.rename(building, target)
        held.enter_context(entry_lock(lock, shared=True, wait_seconds=LOCK_WAIT_SECONDS))
        touch(venvs / f"{key}{LAST_USED_SUFFIX}")
    except subprocess.TimeoutExpired:
        raise RunFailure(
            "ProgramError",
            f"installing {requirements.name} took over {INSTALL_TIMEOUT_SECONDS:.0f}s",
        ) from None
    finally:
        if not keep_building:
            shutil.rmtree(building, ignore_errors=True)
    return target


@dataclass(frozen=True)
class PythonProgram:
    """How to run a project's Python program inline."""

    main: Path
    directory: Path
    virtualenv: Path | None

    def sys_path_additions(self) -> list[str]:
        return [str(site_packages(self.virtualenv))] if self.virtualenv else []

    def function(self) -> Callable[[], None]:
        """The inline program: the project's main run as ``__main__``, as Pulumi's Python
        language host runs it (working directory = the project directory)."""
        main, directory = str(self.main), str(self.directory)
        additions = self.sys_path_additions()

        def program() -> None:
            for path in additions:
                if path not in sys.path:
                    sys.path.append(path)
            os.chdir(directory)
            sys.argv = [main]
            try:
                runpy.run_path(main, run_name="__main__")
            except Exception as error:
                import pulumi  # loaded: the program runs inside the Automation API

                raise pulumi.RunError(
                    "Program failed with an unhandled exception:\n"
                    + user_traceback(error, directory)
                ) from None

        return program


def user_traceback(error: BaseException, directory: str) -> str:
    """The traceback from the first frame of the user's program on (as Pulumi's language
    host shows it), with paths relative to the project directory."""
    all_frames = traceback.extract_tb(error.__traceback__)
    prefix = directory.rstrip("/") + "/"
    first = next(
        (i for i, frame in enumerate(all_frames) if frame.filename.startswith(prefix)),
        len(all_frames),
    )
    frames = all_frames[first:]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(error), error))
    return "".join(lines).replace(prefix, "").rstrip()


def prepare_python_program(
    project: Project, cache_dir: Path, log: Log, run: Run, held: contextlib.ExitStack
) -> PythonProgram:
    """Install an inline Python program's dependencies (cached) and point its runtime at
    them."""
    main = project.main_path()
    if not main.exists():
        raise RunFailure("ProgramError", f"{project.path.name}: main {main.name!r} does not exist")
    requirements = project.directory / "requirements.txt"
    venv = (
        ensure_virtualenv(cache_dir, requirements, log, run, held)
        if requirements.is_file()
        else None
    )
    project.settings = with_python_environment(project.settings, str(venv) if venv else None)
    project.save()
    return PythonProgram(main=main, directory=project.directory, virtualenv=venv)


def write_state_only_project(directory: Path, info: ProjectInfo) -> Project:
    """A minimal project (name and runtime) for destroying a stack from its state alone."""
    directory.mkdir(parents=True, exist_ok=True)
    project = Project(directory / "Pulumi.yaml", {"name": info.name, "runtime": info.runtime})
    project.save()
    return project


def copy_program(source: Path, destination: Path) -> Path:
    """A writable copy of a program baked into the image (Pulumi writes stack files)."""
    if not source.is_dir():
        raise RunFailure(
            "SourceUnavailable",
            f"workspaceTemplate.spec.local.dir {source} does not exist in the runner image",
        )
    shutil.copytree(
        source, destination, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    return destination
