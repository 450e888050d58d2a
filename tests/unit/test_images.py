"""jobs/Dockerfile, checked offline (no container engine here): its targets, their users, and
that its pins agree with pkobatch's own (versions.env, Settings, pyproject)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from pkobatch.config import JobSettings
from pkobatch.dev.images import (
    BASES,
    IMAGE_NAMES,
    TARGETS,
    Stage,
    _copied_sources,
    _stage_context,
    _stages_of,
    apt_sources,
    parse_dockerfile,
)
from pkobatch.dev.tools import versions

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "jobs" / "Dockerfile"


def parse() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def stage(name: str) -> Stage:
    found = [s for s in parse()[1] if s.name == name]
    assert len(found) == 1, f"jobs/Dockerfile has no single stage {name!r}"
    return found[0]


def test_the_targets_exist_and_plain_docker_build_gives_the_runner() -> None:
    _, stages = parse()
    assert [s.name for s in stages] == ["bundle", "runner-bundle", "controller", "runner"]
    assert sorted(TARGETS) == sorted(s.name for s in stages if s.name != "bundle")


def test_the_images_run_as_numeric_non_root_users() -> None:
    # runAsNonRoot can only verify a numeric user.
    for name in TARGETS:
        user, _, group = stage(name).last("USER").partition(":")
        assert user.isdigit() and int(user) != 0, f"{name}: USER {user}"
        assert group.isdigit() and int(group) != 0, f"{name}: group {group}"


def test_every_base_is_a_build_argument_defaulting_to_the_real_image() -> None:
    args, stages = parse()
    assert {s.base for s in stages} == {f"${{{arg}}}" for arg in BASES}
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    assert args["BUSYBOX_IMAGE"] == "busybox:1.37"
    assert args["PULUMI_IMAGE"] == "pulumi/pulumi:${PULUMI_VERSION}-nonroot"


def test_each_target_builds_from_its_own_stages_and_context() -> None:
    _, stages = parse()
    assert [s.name for s in _stages_of("controller", stages)] == ["controller"]
    assert [s.name for s in _stages_of("runner", stages)] == ["runner", "bundle"]
    assert [s.name for s in _stages_of("runner-bundle", stages)] == ["runner-bundle", "bundle"]
    assert _copied_sources(_stages_of("runner", stages)) == [
        "pyproject.toml",
        "README.md",
        "pkobatch",
        "jobs/build-runner-bundle.sh",
        "jobs/runner_bundle_entry.py",
        "jobs/runner_launcher.c",
    ]


def test_the_images_are_the_ones_the_kustomize_install_names() -> None:
    deployment = yaml.safe_load(
        (REPO_ROOT / "deploy/kustomize/base/controller/deployment.yaml").read_text()
    )
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE_NAMES["controller"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PKOBATCH_JOB__IMAGE"] == IMAGE_NAMES["runner"] == JobSettings().image
    user = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    assert stage("controller").last("USER") == "{}:{}".format(*user)


def test_the_readme_install_names_the_images_the_repository_builds() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    install = readme.partition("## Install on a cluster")[2].partition("\n## ")[0]
    named = set(re.findall(r"pkobatch/[a-z-]+:[0-9][^`\s]*", install))
    assert named == {IMAGE_NAMES["controller"], IMAGE_NAMES["runner"]}


def test_the_runner_is_the_official_pulumi_image_at_pkobatchs_version() -> None:
    args, _ = parse()
    assert args["PULUMI_VERSION"] == versions()["PULUMI_VERSION"]
    assert stage("runner").base == "${PULUMI_IMAGE}"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    runner_extra = pyproject["project"]["optional-dependencies"]["runner"]
    assert f"pulumi=={args['PULUMI_VERSION']}" in runner_extra


def test_both_images_hold_the_bundle_where_the_controller_looks() -> None:
    args, _ = parse()
    assert args["RUNNER_BUNDLE"] == JobSettings().runner_bundle
    for name in ("runner", "runner-bundle"):
        instructions = stage(name).instructions
        assert ("ARG", "RUNNER_BUNDLE") in instructions, name
        assert ("COPY", "--from=bundle /out/pkobatch-runner ${RUNNER_BUNDLE}") in instructions
    build = stage("bundle").last("RUN")
    assert "jobs/build-runner-bundle.sh --out /out/pkobatch-runner" in build
    assert "'.[runner,bundle]'" in build


def test_the_bundle_stage_builds_the_static_launcher() -> None:
    # The bundle carries its own glibc and starts through a launcher linked static
    # (docs/images.md): the stage needs gcc, glibc's static library and the launcher's source.
    instructions = stage("bundle").instructions
    installs = " ".join(args for kind, args in instructions if kind == "RUN")
    assert "gcc" in installs.split() and "libc6-dev" in installs.split()
    copied = " ".join(args for kind, args in instructions if kind == "COPY")
    assert "jobs/runner_launcher.c" in copied.split()


def test_only_the_runner_images_install_the_runner_extra() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    runner_extra = pyproject["project"]["optional-dependencies"]["runner"]
    assert [distribution(d) for d in runner_extra] == ["pulumi"]
    assert "pulumi" not in {distribution(d) for d in pyproject["project"]["dependencies"]}
    # import-linter forbids the controller and the CLI exactly what the extra holds.
    forbidden = [
        c["forbidden_modules"]
        for c in pyproject["tool"]["importlinter"]["contracts"]
        if "pulumi" in c["forbidden_modules"]
    ]
    assert forbidden == [["pulumi"], ["pulumi"]]
    installs = {
        name: " ".join(args for kind, args in stage(name).instructions if kind == "RUN")
        for name in ("bundle", "controller", "runner")
    }
    assert "'.[runner,bundle]'" in installs["bundle"].split()
    assert "'/src[runner]'" in installs["runner"].split()
    assert "/src" in installs["controller"].split() and "[runner" not in installs["controller"]


def distribution(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


# Runs `pkobatch` as the controller image does, with the Pulumi SDK (and gRPC) impossible to
# import: a None in sys.modules makes every import of the package fail and find_spec say
# it is not there.
WITHOUT_PULUMI = """
import sys
sys.modules["pulumi"] = sys.modules["grpc"] = None
sys.argv[0] = "pkobatch"
from pkobatch.main import main
main()
"""


def test_pkobatch_controller_starts_without_the_pulumi_sdk() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PKOBATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PULUMI, "controller", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Run the Stack controller" in done.stdout


def test_the_stand_ins_use_this_machines_bookworm_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# a comment\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.test/debian"
        " bookworm main contrib\n"
        "deb-src http://mirror.test/debian bookworm main\n"
        "deb http://mirror.test/debian trixie main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.test/security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://other.test\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    )
    (tmp_path / "sources.list.d" / "nodesource.sources").write_text(
        "Types: deb\nURIs: https://node.test\nSuites: nodistro\nComponents: main\n"
    )
    assert apt_sources(tmp_path) == (
        "Types: deb\nURIs: http://mirror.test/security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm\n"
        "Components: main contrib\nSigned-By: /usr/share/keyrings/k.gpg\n"
    )
    assert apt_sources(tmp_path / "absent") == ""


def test_the_build_context_holds_what_the_dockerfile_copies_without_caches(
    tmp_path: Path,
) -> None:
    _, stages = parse()
    _stage_context(_copied_sources(_stages_of("runner", stages)), DOCKERFILE, tmp_path)
    staged = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert {"jobs/Dockerfile", "pyproject.toml", "pkobatch/api/stack/spec.py"} <= staged
    assert "jobs/job-template.yaml" not in staged
    assert [p for p in staged if "__pycache__" in p or p.endswith(".pyc")] == []


@pytest.mark.parametrize(
    ("command", "status"),
    [(["job", "run", "--snapshot", "{}"], 3), (["run", "-f", "stack.yaml"], 2)],
)
def test_the_runner_refuses_to_start_without_the_pulumi_sdk(
    command: list[str], status: int, tmp_path: Path
) -> None:
    (tmp_path / "stack.yaml").write_text("kind: Stack\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PKOBATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PULUMI, *command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == status, done.stderr
    assert "pip install 'pkobatch[runner]'" in " ".join(done.stderr.split())
