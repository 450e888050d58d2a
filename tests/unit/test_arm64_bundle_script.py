"""scripts/arm64-bundle.sh cross-builds the Pulumi CLI and the YAML host with scripts/tools.sh's
own components, and stays out of the test command and CI (a cold run: about 80 minutes)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARM64_SH = REPO / "scripts" / "arm64-bundle.sh"


def test_the_arm64_tools_are_built_by_tools_sh_for_arm64() -> None:
    build = re.search(r"^build_pulumi_tools\(\) \{\n(.*?)^\}", ARM64_SH.read_text(), re.M | re.S)
    assert build is not None
    body = build.group(1)
    assert "GOARCH=arm64" in body
    assert re.search(r'scripts/tools\.sh" pulumi yaml$', body, re.M)
    assert "go build" not in ARM64_SH.read_text()


def test_the_arm64_bundle_is_not_part_of_the_test_command_or_ci() -> None:
    for runner in (REPO / "scripts" / "test.sh", REPO / ".ci" / "run"):
        assert "arm64" not in runner.read_text(), f"{runner.name} must not run the arm64 build"
