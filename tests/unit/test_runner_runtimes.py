"""Which language host runs a program, what a runtime needs from the image, and where
package caches go (pkobatch.runner.runtimes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkobatch.runner.failures import RunFailure
from pkobatch.runner.runtimes import (
    INLINE_PYTHON,
    cache_environment,
    choose_program_host,
    find_language_host,
    pulumi_home,
    required_tools,
    search_path,
)


def executable(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_host_is_found_beside_pulumi_on_path_or_as_an_installed_plugin(
    tmp_path: Path,
) -> None:
    beside = executable(tmp_path / "pulumi-bin", "pulumi-language-yaml")
    on_path = executable(tmp_path / "path", "pulumi-language-go")
    plugin = executable(
        tmp_path / "home" / "plugins" / "language-java-v1.2.0", "pulumi-language-java"
    )
    directories = search_path({"PATH": str(tmp_path / "path")}, str(tmp_path / "pulumi-bin/pulumi"))
    home = tmp_path / "home"
    assert find_language_host("yaml", directories, home) == beside
    assert find_language_host("go", directories, home) == on_path
    assert find_language_host("java", directories, home) == plugin
    assert find_language_host("nodejs", directories, home) is None


def test_a_file_without_execute_permission_is_not_a_host(tmp_path: Path) -> None:
    (tmp_path / "pulumi-language-yaml").write_text("")
    assert find_language_host("yaml", [tmp_path], tmp_path) is None


def test_a_missing_host_names_itself_and_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RunFailure) as failed:
        choose_program_host("nodejs", {}, tmp_path, [tmp_path], tmp_path, frozen=False)
    assert failed.value.reason == "InvalidSpec"
    assert "pulumi-language-nodejs" in failed.value.message
    assert "workspaceTemplate.spec.image" in failed.value.message


def test_python_without_its_host_runs_inline_except_in_the_bundle(tmp_path: Path) -> None:
    host = choose_program_host("python", {}, tmp_path, [tmp_path], tmp_path, frozen=False)
    assert host.inline and host.label == INLINE_PYTHON
    with pytest.raises(RunFailure, match="pulumi-language-python"):
        choose_program_host("python", {}, tmp_path, [tmp_path], tmp_path, frozen=True)


def test_a_present_host_is_used_for_python_too(tmp_path: Path) -> None:
    executable(tmp_path, "pulumi-language-python")
    executable(tmp_path, "python3")
    host = choose_program_host("python", {}, tmp_path, [tmp_path], tmp_path, frozen=True)
    assert not host.inline and host.label == "pulumi-language-python"


def test_a_missing_toolchain_is_named(tmp_path: Path) -> None:
    executable(tmp_path / "bin", "pulumi-language-nodejs")
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text("{}")
    with pytest.raises(RunFailure, match="needs node on PATH"):
        choose_program_host("nodejs", {}, project, [tmp_path / "bin"], tmp_path, frozen=False)
    executable(tmp_path / "bin", "node")
    with pytest.raises(RunFailure, match="needs pnpm on PATH"):
        choose_program_host(
            "nodejs", {"packagemanager": "pnpm"}, project, [tmp_path / "bin"], tmp_path, False
        )
    executable(tmp_path / "bin", "pnpm")
    host = choose_program_host(
        "nodejs", {"packagemanager": "pnpm"}, project, [tmp_path / "bin"], tmp_path, False
    )
    assert host.label == "pulumi-language-nodejs"


def test_an_unknown_runtime_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(RunFailure, match="not a Pulumi runtime; use one of nodejs, python"):
        choose_program_host("cobol", {}, tmp_path, [tmp_path], tmp_path, frozen=False)


@pytest.mark.parametrize(
    ("runtime", "options", "files", "expected"),
    [
        ("yaml", {}, [], []),
        ("nodejs", {}, [], [("node",)]),
        ("nodejs", {}, ["package.json"], [("node",), ("npm",)]),
        ("nodejs", {"packagemanager": "yarn"}, ["package.json"], [("node",), ("yarn",)]),
        ("python", {}, [], [("python3", "python")]),
        ("python", {"toolchain": "uv"}, [], [("uv",)]),
        ("python", {"toolchain": "poetry"}, [], [("poetry",)]),
        ("go", {}, [], [("go",)]),
        ("go", {"binary": "bin/app"}, [], []),
        ("dotnet", {}, [], [("dotnet",)]),
        ("java", {}, ["pom.xml"], [("java",), ("mvn",)]),
        ("java", {}, ["build.gradle"], [("java",), ("gradle",)]),
        ("java", {}, ["build.gradle", "gradlew"], [("java",)]),
        ("java", {"binary": "app.jar"}, ["pom.xml"], [("java",)]),
    ],
)
def test_required_tools_follow_the_projects_options(
    tmp_path: Path,
    runtime: str,
    options: dict[str, str],
    files: list[str],
    expected: list[tuple[str, ...]],
) -> None:
    for name in files:
        (tmp_path / name).write_text("")
    assert required_tools(runtime, options, tmp_path) == expected


def test_caches_go_under_the_cache_dir_unless_the_environment_sets_them(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = cache_environment(cache, {"GOMODCACHE": "/mine", "MAVEN_OPTS": "-Xmx1g"})
    assert "GOMODCACHE" not in env
    assert env["PIP_CACHE_DIR"] == str(cache / "pip")
    assert env["npm_config_cache"] == str(cache / "npm")
    assert env["NUGET_PACKAGES"] == str(cache / "nuget")
    assert env["MAVEN_OPTS"] == f"-Xmx1g -Dmaven.repo.local={cache / 'maven'}"
    assert "MAVEN_OPTS" not in cache_environment(cache, {"MAVEN_OPTS": "-Dmaven.repo.local=/r"})


def test_pulumi_home_is_cached_only_when_a_cache_dir_is_configured(tmp_path: Path) -> None:
    assert pulumi_home({"PULUMI_HOME": "/home/p"}, True, tmp_path) == "/home/p"
    assert pulumi_home({}, True, tmp_path) == str(tmp_path / "pulumi-home")
    assert pulumi_home({}, False, tmp_path) is None
