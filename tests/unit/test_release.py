"""The release: one version everywhere a release names it, the tag check and the notes of
pkobatch.dev.release, and .github/workflows/release.yml publishing what the issue lists
(the workflow itself runs only on GitHub; its build steps run in
tests/integration/test_release_artefacts.py and tests/e2e/test_helm_install.py)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkobatch import __version__
from pkobatch.config import JobSettings
from pkobatch.dev.images import IMAGE_NAMES, TARGETS
from pkobatch.dev.release import (
    CHANGELOG,
    CHART_FILE,
    changelog_section,
    main,
    release_problems,
)
from pkobatch.dev.tools import versions

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def workflow() -> dict[str, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def steps_run(job: str) -> str:
    return "\n".join(step.get("run", "") for step in workflow()["jobs"][job]["steps"])


def test_the_version_is_declared_once_and_named_alike_everywhere() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pkobatch.__version__"}
    chart = yaml.safe_load((REPO / CHART_FILE).read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert JobSettings().image == IMAGE_NAMES["runner"] == f"pkobatch/runner:{__version__}"


def test_the_changelog_keeps_an_unreleased_section() -> None:
    text = (REPO / CHANGELOG).read_text()
    assert text.startswith("# Changelog\n")
    unreleased = changelog_section(text, "Unreleased")
    assert unreleased is not None and "### Added" in unreleased


def release_tree(tmp_path: Path, changelog: str) -> Path:
    (tmp_path / CHART_FILE).parent.mkdir(parents=True)
    shutil.copy(REPO / CHART_FILE, tmp_path / CHART_FILE)
    (tmp_path / CHANGELOG).write_text(changelog)
    return tmp_path


CHANGELOG_WITH_RELEASE = f"""# Changelog

## [Unreleased]

## [{__version__}] - 2026-12-01

### Added

- Everything.

## [0.0.9] - 2026-11-01

- Older.
"""


def test_a_tag_of_the_declared_version_with_a_changelog_section_is_releasable(
    tmp_path: Path,
) -> None:
    root = release_tree(tmp_path, CHANGELOG_WITH_RELEASE)
    assert release_problems(f"v{__version__}", root) == []
    assert changelog_section(CHANGELOG_WITH_RELEASE, __version__) == "### Added\n\n- Everything."


def test_a_tag_is_refused_naming_each_mismatch(tmp_path: Path) -> None:
    root = release_tree(tmp_path, "# Changelog\n\n## [Unreleased]\n\n- Work.\n")
    assert release_problems("v9.9.9", root) == [
        f"the tag v9.9.9 is not v{__version__}, the version pkobatch/__init__.py says",
        f"{CHANGELOG} has no section ## [{__version__}]",
    ]
    chart = (root / CHART_FILE).read_text().replace(f"version: {__version__}", "version: 0.0.1")
    (root / CHART_FILE).write_text(chart)
    assert f"{CHART_FILE} has version 0.0.1, not {__version__}" in release_problems(
        f"v{__version__}", root
    )


def test_the_check_of_this_tree_refuses_an_unreleased_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # CHANGELOG.md has no section for the version yet: nothing is released.
    assert main(["check", f"v{__version__}"]) == 1
    assert f"no section ## [{__version__}]" in capsys.readouterr().err
    assert main(["notes", "Unreleased"]) == 0
    assert "### Added" in capsys.readouterr().out


def test_the_workflow_runs_on_version_tags_and_checks_the_tag_first() -> None:
    flow = workflow()
    # PyYAML reads the key `on` as True (YAML 1.1).
    assert flow[True] == {"push": {"tags": ["v*"]}}
    assert 'python -m pkobatch.dev.release check "$GITHUB_REF_NAME"' in steps_run("check")
    for job in ("images", "chart", "python"):
        assert flow["jobs"][job]["needs"] == "check"
    assert set(flow["jobs"]["release"]["needs"]) == {"check", "images", "chart", "python"}


def test_the_workflow_builds_every_image_for_amd64_and_arm64() -> None:
    job = workflow()["jobs"]["images"]
    assert sorted(job["strategy"]["matrix"]["target"]) == sorted(TARGETS)
    (build,) = [s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push")]
    assert build["with"]["file"] == "jobs/Dockerfile"
    assert build["with"]["target"] == "${{ matrix.target }}"
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    # The names the install refers to, under the configured registry.
    assert build["with"]["tags"].endswith(
        "/${{ matrix.target }}:${{ needs.check.outputs.version }}"
    )
    assert workflow()["env"]["IMAGE_NAMESPACE"].endswith("'pkobatch' }}")
    assert {name.partition(":")[0] for name in IMAGE_NAMES.values()} == {
        f"pkobatch/{target}" for target in TARGETS
    }


def test_the_workflow_publishes_the_chart_and_the_python_artefacts_as_tested() -> None:
    assert workflow()["env"]["HELM_VERSION"] == versions()["HELM_VERSION"]
    chart = steps_run("chart")
    assert "helm package deploy/helm/pkobatch --destination dist" in chart
    assert '"oci://$IMAGE_REGISTRY/$IMAGE_NAMESPACE/charts"' in chart
    assert "python -m build --outdir dist ." in steps_run("python")
    release = steps_run("release")
    assert "python -m pkobatch.dev.release notes" in release
    assert 'gh release create "$GITHUB_REF_NAME" dist/*' in release
