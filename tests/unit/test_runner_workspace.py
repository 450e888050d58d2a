"""The program side of a run: project files, the cached virtualenv, the inline program."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest
import yaml

from pkobatch.api.run import ProjectInfo
from pkobatch.runner.failures import RunFailure
from pkobatch.runner.run_cache import MANIFEST_NAME, CacheFull, manifest_problem
from pkobatch.runner.workspace import (
    PythonProgram,
    cache_dir_from,
    ensure_virtualenv,
    load_project,
    prepare_python_program,
    requirements_key,
    site_packages,
    with_python_environment,
    write_state_only_project,
)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)


def test_project_info_and_main(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(
        "name: web\nruntime:\n  name: python\n  options:\n    virtualenv: venv\nmain: src/\n"
    )
    project = load_project(tmp_path)
    assert project.info == ProjectInfo(name="web", runtime="python")
    assert project.main_path() == (tmp_path / "src").resolve()


def test_a_directory_without_a_project_is_source_unavailable(tmp_path: Path) -> None:
    with pytest.raises(RunFailure) as raised:
        load_project(tmp_path)
    assert raised.value.reason == "SourceUnavailable"
    assert "spec.repoDir" in raised.value.message


def test_python_environment_is_pointed_at_the_virtualenv_or_the_runner() -> None:
    settings = {
        "name": "p",
        "runtime": {"name": "python", "options": {"toolchain": "pip", "virtualenv": "venv"}},
    }
    assert with_python_environment(settings, "/cache/v")["runtime"] == {
        "name": "python",
        "options": {"virtualenv": "/cache/v"},
    }
    assert with_python_environment(settings, None)["runtime"] == {"name": "python"}
    assert with_python_environment({"name": "p", "runtime": "python"}, None)["runtime"] == {
        "name": "python"
    }


def test_requirements_key_depends_on_the_content() -> None:
    assert requirements_key(b"a==1\n") == requirements_key(b"a==1\n")
    assert requirements_key(b"a==1\n") != requirements_key(b"a==2\n")


def test_cache_dir_is_configurable(tmp_path: Path) -> None:
    assert cache_dir_from({"PKOBATCH_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir_from({"XDG_CACHE_HOME": "/x"}) == Path("/x/pkobatch")


def test_the_virtualenv_is_built_once_per_requirements(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install\n")
    lines: list[str] = []
    with contextlib.ExitStack() as held:
        first = ensure_virtualenv(tmp_path / "cache", requirements, lines.append, run, held)
        assert (first / "pyvenv.cfg").is_file()
        assert site_packages(first).is_dir()
        assert manifest_problem(first) is None
        second = ensure_virtualenv(tmp_path / "cache", requirements, lines.append, run, held)
    assert second == first
    assert "using cached virtualenv" in lines[-1]
    venvs = tmp_path / "cache" / "venvs"
    assert [p.name for p in venvs.iterdir() if p.is_dir()] == [first.name]
    assert (venvs / f"{first.name}.lastused").is_file()


def test_a_damaged_virtualenv_is_built_again(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install\n")
    with contextlib.ExitStack() as held:
        venv = ensure_virtualenv(tmp_path / "cache", requirements, print, run, held)
    (venv / "pyvenv.cfg").write_text("home = /nowhere\n")  # a different size: damaged
    lines: list[str] = []
    with contextlib.ExitStack() as held:
        again = ensure_virtualenv(tmp_path / "cache", requirements, lines.append, run, held)
    assert again == venv
    assert any("pyvenv.cfg changed since it was installed" in line for line in lines)
    assert "/nowhere" not in (venv / "pyvenv.cfg").read_text()
    assert manifest_problem(venv) is None


def test_a_virtualenv_without_manifest_is_not_used(tmp_path: Path) -> None:
    """What a run killed between building and recording would leave, were it in place."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install\n")
    with contextlib.ExitStack() as held:
        venv = ensure_virtualenv(tmp_path / "cache", requirements, print, run, held)
    (venv / MANIFEST_NAME).unlink()
    lines: list[str] = []
    with contextlib.ExitStack() as held:
        ensure_virtualenv(tmp_path / "cache", requirements, lines.append, run, held)
    assert any("it has no manifest" in line for line in lines)
    assert manifest_problem(venv) is None


def test_a_full_disk_during_the_install_is_cache_full(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# nothing to install\n")

    def full(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            argv, 1, "", "ERROR: [Errno 28] No space left on device: 'x'"
        )

    with contextlib.ExitStack() as held, pytest.raises(CacheFull):
        ensure_virtualenv(tmp_path / "cache", requirements, print, full, held)
    assert [p for p in (tmp_path / "cache" / "venvs").iterdir() if p.is_dir()] == []


def test_a_failed_install_is_a_program_error_and_leaves_no_cache(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("--this-is-not-an-option\n")
    with contextlib.ExitStack() as held, pytest.raises(RunFailure) as raised:
        ensure_virtualenv(tmp_path / "cache", requirements, lambda _: None, run, held)
    assert raised.value.reason == "ProgramError"
    assert [p for p in (tmp_path / "cache" / "venvs").iterdir() if p.is_dir()] == []


def test_prepare_rewrites_the_project_for_the_runners_interpreter(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(
        "name: p\nruntime:\n  name: python\n  options:\n    virtualenv: venv\n"
    )
    (tmp_path / "__main__.py").write_text("")
    with contextlib.ExitStack() as held:
        program = prepare_python_program(load_project(tmp_path), tmp_path / "c", print, run, held)
    assert program.virtualenv is None
    assert yaml.safe_load((tmp_path / "Pulumi.yaml").read_text())["runtime"] == {"name": "python"}


def test_the_inline_program_reports_the_users_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The program changes the working directory and sys.argv, as the language host does.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    (tmp_path / "helper.py").write_text("def fail():\n    raise ValueError('bad value')\n")
    (tmp_path / "__main__.py").write_text("import helper\nhelper.fail()\n")
    program = PythonProgram(main=tmp_path, directory=tmp_path, virtualenv=None).function()
    with pytest.raises(pulumi.RunError) as raised:
        program()
    message = str(raised.value)
    assert message.startswith("Program failed with an unhandled exception:\nTraceback")
    assert 'File "__main__.py", line 2, in <module>' in message
    assert 'File "helper.py", line 2, in fail' in message
    assert message.endswith("ValueError: bad value")
    assert "runpy" not in message and str(tmp_path) not in message


def test_state_only_project(tmp_path: Path) -> None:
    project = write_state_only_project(tmp_path / "s", ProjectInfo(name="web", runtime="python"))
    assert yaml.safe_load(project.path.read_text()) == {"name": "web", "runtime": "python"}
