"""scripts/arm64-bundle.sh cross-builds the Pulumi CLI and the YAML host as scripts/tools.sh
builds them for x86-64, and stays out of the test command and CI (a cold run: about 80 minutes)."""

from __future__ import annotations

import re
from pathlib import Path

from pkobatch.dev.tools import versions

REPO = Path(__file__).resolve().parents[2]
ARM64_SH = REPO / "scripts" / "arm64-bundle.sh"
TOOLS_SH = REPO / "scripts" / "tools.sh"


def _go_builds(script: str) -> set[tuple[str, str]]:
    """(package, version stamp) of every ``go build`` of the Pulumi CLI and the YAML host."""
    return set(
        re.findall(
            r"-X (github\.com/pulumi/[\w/.-]+version\.Version)=v?\$\w+.*?"
            r"(github\.com/pulumi/[\w/.-]+/cmd/pulumi(?:-language-yaml)?)\s*$",
            script,
            re.MULTILINE | re.DOTALL,
        )
    )


def test_the_arm64_tools_are_the_modules_and_versions_tools_sh_builds() -> None:
    arm64 = ARM64_SH.read_text()
    builds = _go_builds(arm64)
    assert {package for _, package in builds} == {
        "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi",
        "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml",
    }
    assert builds <= _go_builds(TOOLS_SH.read_text())
    pinned = versions()
    used = set(re.findall(r"\$\{?(\w+_VERSION)\b", arm64))
    assert used == {"PULUMI_VERSION", "PULUMI_YAML_VERSION"}
    assert all(pinned.get(name) for name in used)


def test_the_arm64_bundle_is_not_part_of_the_test_command_or_ci() -> None:
    for runner in (REPO / "scripts" / "test.sh", REPO / ".ci" / "run"):
        assert "arm64" not in runner.read_text(), f"{runner.name} must not run the arm64 build"
