"""jobs/Dockerfile, checked offline (no container engine here): its targets, their users, and
that its pins agree with pkobatch's own (versions.env, Settings, pyproject)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pkobatch.config import JobSettings
from pkobatch.dev.tools import versions

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "jobs" / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, keyword: str) -> str:
        values = [value for key, value in self.instructions if key == keyword]
        assert values, f"stage {self.name} has no {keyword}"
        return values[-1]


def parse() -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, from the Dockerfile's logical lines."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), flags=re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            stages.append(Stage(match.group(2), match.group(1)))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        else:
            assert stages, f"{line!r} before the first FROM"
            stages[-1].instructions.append((keyword, rest.strip()))
    return args, stages


def stage(name: str) -> Stage:
    found = [s for s in parse()[1] if s.name == name]
    assert len(found) == 1, f"jobs/Dockerfile has no single stage {name!r}"
    return found[0]


def test_the_targets_exist_and_plain_docker_build_gives_the_runner() -> None:
    _, stages = parse()
    assert [s.name for s in stages] == ["bundle", "runner-bundle", "runner"]


def test_the_images_run_as_numeric_non_root_users() -> None:
    # runAsNonRoot can only verify a numeric user.
    for name in ("runner", "runner-bundle"):
        user, _, group = stage(name).last("USER").partition(":")
        assert user.isdigit() and int(user) != 0, f"{name}: USER {user}"
        assert group.isdigit() and int(group) != 0, f"{name}: group {group}"


def test_the_runner_is_the_official_pulumi_image_at_pkobatchs_version() -> None:
    args, _ = parse()
    assert args["PULUMI_VERSION"] == versions()["PULUMI_VERSION"]
    assert stage("runner").base == "pulumi/pulumi:${PULUMI_VERSION}-nonroot"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert f"pulumi=={args['PULUMI_VERSION']}" in pyproject["project"]["dependencies"]


def test_both_images_hold_the_bundle_where_the_controller_looks() -> None:
    args, _ = parse()
    assert args["RUNNER_BUNDLE"] == JobSettings().runner_bundle
    for name in ("runner", "runner-bundle"):
        instructions = stage(name).instructions
        assert ("ARG", "RUNNER_BUNDLE") in instructions, name
        assert ("COPY", "--from=bundle /out/pkobatch-runner ${RUNNER_BUNDLE}") in instructions
    build = stage("bundle").last("RUN")
    assert "jobs/build-runner-bundle.sh --out /out/pkobatch-runner" in build
    assert "'.[bundle]'" in build


def test_the_bundle_stage_builds_the_static_launcher() -> None:
    # The bundle carries its own glibc and starts through a launcher linked static
    # (docs/images.md): the stage needs gcc, glibc's static library and the launcher's source.
    instructions = stage("bundle").instructions
    installs = " ".join(args for kind, args in instructions if kind == "RUN")
    assert "gcc" in installs.split() and "libc6-dev" in installs.split()
    copied = " ".join(args for kind, args in instructions if kind == "COPY")
    assert "jobs/runner_launcher.c" in copied.split()
