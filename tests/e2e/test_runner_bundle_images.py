"""The injected runner bundle runs in images that have nothing it could lean on: a musl image
with no glibc, and an image with no shell and no ``cp`` — each a real container run by
``runc`` (the OCI runtime under containerd and the kubelet) from a root filesystem made here,
with a read-only root, its own namespaces and a non-root user.

Each image holds only what docs/images.md says an image must bring for an injected run: the
Pulumi CLI and the YAML language host (static Go binaries), the program (baked in, selected
with ``workspaceTemplate.spec.local.dir``), plus — for the musl image — musl's loader and C
library. The bundle directory is mounted read-only where the Job's init container copies it
(``/pkobatch/runner``), and its launcher runs ``pkobatch-runner run`` as the run's container
would run ``job run``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixture_plugins.tools import in_ci

from pkobatch.api.run import RunResult
from pkobatch.controller.run_pod import INJECTED_BUNDLE, INJECTED_RUNNER

pytestmark = pytest.mark.timeout(1800)
PROGRAMS = Path(__file__).resolve().parents[1] / "fixtures" / "programs"
MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")
RUN_AS = 1000


def need(path: str | None, what: str) -> str:
    if path:
        return path
    message = f"{what} is missing (scripts/bootstrap.sh installs it: apt-get install runc musl)"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def runc() -> str:
    if os.geteuid() != 0:
        pytest.skip("runc containers need root")
    return need(shutil.which("runc"), "runc")


def make_rootfs(root: Path, pulumi_bin: Path, yaml_host: Path, *, musl: bool) -> None:
    """An image's root filesystem: the static Pulumi CLI and YAML host, the YAML program, the
    mount points of a container — and musl's C library when ``musl``; no shell, no ``cp``."""
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(pulumi_bin / "pulumi", bin_dir / "pulumi")
    shutil.copy2(yaml_host / "pulumi-language-yaml", bin_dir / "pulumi-language-yaml")
    shutil.copytree(PROGRAMS / "yaml", root / "program")
    for mount_point in ("proc", "dev", "sys", "work", INJECTED_BUNDLE.lstrip("/")):
        (root / mount_point).mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text(f"pulumi:x:{RUN_AS}:{RUN_AS}::/work:/nonexistent\n")
    if musl:
        loader = Path(need(str(MUSL_LOADER) if MUSL_LOADER.exists() else None, "musl"))
        (root / "lib").mkdir()
        # musl's loader is its C library: one file, as in Alpine's /lib/ld-musl-x86_64.so.1.
        shutil.copy2(loader.resolve(), root / "lib" / loader.name)


def glibc_files(root: Path) -> list[Path]:
    return [
        path
        for pattern in ("libc.so.6", "ld-linux*")
        for path in root.rglob(pattern)
        if INJECTED_BUNDLE.lstrip("/") not in str(path.relative_to(root))
    ]


def container_config(runc: str, bundle: Path, runner_bundle: Path, args: list[str]) -> None:
    """``runc spec``'s default container (its own namespaces, read-only root, no new
    privileges, default capabilities dropped for a non-root user) with the bundle directory
    mounted read-only where the init container copies it and a writable ``/work``."""
    subprocess.run([runc, "spec", "--bundle", str(bundle)], check=True, timeout=60)
    config_file = bundle / "config.json"
    config: dict[str, Any] = json.loads(config_file.read_text())
    config["root"] = {"path": "rootfs", "readonly": True}
    config["process"].update(
        {
            "terminal": False,
            "args": args,
            "cwd": "/work",
            "user": {"uid": RUN_AS, "gid": RUN_AS},
            "env": [
                "PATH=/usr/bin",
                "HOME=/work",
                "TMPDIR=/work",
                "PULUMI_HOME=/work/.pulumi",
                "PULUMI_BACKEND_URL=file:///work",
                "PULUMI_CONFIG_PASSPHRASE=not-a-secret-of-this-test",
                "PULUMI_SKIP_UPDATE_CHECK=true",
                "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true",
            ],
        }
    )
    config["process"]["capabilities"] = {
        kind: [] for kind in ("bounding", "effective", "permitted", "inheritable", "ambient")
    }
    config["mounts"] += [
        {
            "destination": INJECTED_BUNDLE,
            "type": "bind",
            "source": str(runner_bundle),
            "options": ["rbind", "ro"],
        },
        {
            "destination": "/work",
            "type": "tmpfs",
            "source": "tmpfs",
            # Owned by the run's user, as an emptyDir with the pod's fsGroup would be.
            "options": ["nosuid", "nodev", "size=512m", f"uid={RUN_AS}", f"gid={RUN_AS}"],
        },
    ]
    config_file.write_text(json.dumps(config))


@pytest.fixture
def container(runc: str, tmp_path: Path) -> Iterator[Any]:
    """Runs one container to its end: ``run(bundle) -> CompletedProcess``; deleted after."""
    started: list[str] = []

    def run(bundle: Path) -> subprocess.CompletedProcess[str]:
        name = f"pkobatch-test-{uuid.uuid4().hex[:12]}"
        started.append(name)
        return subprocess.run(
            [runc, "--root", str(tmp_path / "runc-state"), "run", "--bundle", str(bundle), name],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )

    yield run
    for name in started:
        subprocess.run(
            [runc, "--root", str(tmp_path / "runc-state"), "delete", "--force", name],
            capture_output=True,
            timeout=60,
        )


def stack_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "greeting", "namespace": "images"},
        "spec": {
            "stack": "dev",
            "config": {"greeting": "kia ora"},
            "workspaceTemplate": {"spec": {"local": {"dir": "/program"}}},
        },
    }


@pytest.mark.parametrize("image", ["musl", "no-shell-no-cp"])
def test_the_bundle_runs_a_stack_in_an_image_without_glibc_or_a_shell(
    image: str,
    runc: str,
    container: Any,
    runner_bundle: Path,
    pulumi_bin: Path,
    yaml_host: Path,
    tmp_path: Path,
) -> None:
    bundle = tmp_path / "oci"
    root = bundle / "rootfs"
    make_rootfs(root, pulumi_bin, yaml_host, musl=image == "musl")
    # The image brings no C library of glibc's, no shell and no cp: nothing the bundle could
    # borrow.
    assert glibc_files(root) == []
    for tool in ("sh", "bash", "cp", "ls"):
        assert shutil.which(tool, path=f"{root}/usr/bin:{root}/bin") is None
    assert (root / "lib" / MUSL_LOADER.name).exists() == (image == "musl")
    manifest = yaml.safe_dump(stack_manifest())
    (root / "stack.yaml").write_text(manifest)
    container_config(
        runc, bundle, runner_bundle, [INJECTED_RUNNER, "run", "-f", "/stack.yaml", "-o", "json"]
    )

    completed = container(bundle)

    assert completed.stdout.strip(), completed.stderr[-4000:]
    result = RunResult.model_validate_json(completed.stdout)
    assert (completed.returncode, result.state) == (0, "succeeded"), result.message
    assert result.outputs["message"] == "kia ora from YAML"
    assert result.outputs["greetings"] == ["kia ora 1", "kia ora 2"]
    assert result.outputs["token"] == "[secret]"
