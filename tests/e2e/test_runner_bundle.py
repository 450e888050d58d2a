"""The injected runner bundle (jobs/build-runner-bundle.sh) runs Stacks in images without
pkobatch: on its own, outside the project's virtualenv, and as the run of a Stack whose
``workspaceTemplate.spec.image`` is a stock Pulumi image, through the real controller, Job
controller and node agent. The programs are YAML: they run through the Pulumi CLI and
``pulumi-language-yaml``, all the image has to bring.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    create_secret,
    install_controller_rbac,
    ready,
    wait_stack,
)

from pkobatch.api.constants import STACK_LABEL
from pkobatch.api.run import RunResult
from pkobatch.controller.run_pod import INJECTED_BUNDLE, INJECTED_RUNNER
from pkobatch.kube.client import JOBS, Kube
from pkobatch.runner.embedded import fallback_env_name

# A cold build of the bundle (the session's first use) takes minutes on 2 busy cores.
pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
SYSTEM_PATH = ["/usr/bin", "/bin"]
VENV_BIN = str(Path(sys.executable).parent)


def offline_pulumi_env(pulumi_env: Any) -> dict[str, str]:
    """The file:// backend and offline settings of ``pulumi_env``, without its PATH (which
    has this virtualenv) and without PULUMI_PYTHON_CMD (this interpreter)."""
    keep = (
        "PULUMI_HOME",
        "PULUMI_BACKEND_URL",
        "PULUMI_CONFIG_PASSPHRASE",
        "PULUMI_SKIP_UPDATE_CHECK",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION",
    )
    return {name: pulumi_env.env[name] for name in keep}


def has_no_pkobatch(path: str) -> None:
    assert VENV_BIN not in path.split(os.pathsep)
    assert shutil.which("pkobatch", path=path) is None
    for python in ("python3", "python"):
        found = shutil.which(python, path=path)
        if found:
            probe = subprocess.run(
                [found, "-c", "import pkobatch"], cwd="/", env={"PATH": path}, capture_output=True
            )
            assert probe.returncode != 0, f"{found} can import pkobatch"


def test_the_bundle_runs_a_yaml_program_outside_the_virtualenv(
    runner_bundle: Path,
    pulumi_env: Any,
    pulumi_bin: Path,
    yaml_host: Path,
    git_repo: Callable[..., Any],
    git_server: Any,
    tmp_path: Path,
) -> None:
    repo = git_repo("yaml")
    manifest = tmp_path / "stack.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": "greeting", "namespace": "e2e"},
                "spec": {
                    "stack": "dev",
                    "projectRepo": repo.http_url,
                    "branch": "main",
                    "gitAuth": {
                        "accessToken": {"type": "Secret", "secret": {"name": "git", "key": "t"}}
                    },
                    "config": {"greeting": "bonjour"},
                },
            }
        )
    )
    path = os.pathsep.join([str(pulumi_bin), str(yaml_host), *SYSTEM_PATH])
    has_no_pkobatch(path)
    env = {
        **offline_pulumi_env(pulumi_env),
        "PATH": path,
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path),
        "PKOBATCH_CACHE_DIR": str(tmp_path / "cache"),
        "PKOBATCH_INSECURE_HTTP_GIT_HOSTS": "127.0.0.1",
        "LANG": "C.UTF-8",
        # Through the environment: as --secret it would be in the process list.
        fallback_env_name("PKOBATCH_SECRET", "git", "t"): git_server.token,
    }

    completed = subprocess.run(
        [str(runner_bundle / "pkobatch-runner"), "run", "-f", str(manifest), "-o", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert completed.stdout.strip(), completed.stderr
    result = RunResult.model_validate_json(completed.stdout)
    assert (completed.returncode, result.state) == (0, "succeeded"), result.message
    assert result.commit == repo.commit
    assert result.outputs["message"] == "bonjour from YAML"
    assert result.outputs["greetings"] == ["bonjour 1", "bonjour 2"]
    assert result.outputs["token"] == "[secret]"


@pytest.fixture
def bundle_controller(
    cluster: Any, namespace: str, tmp_path: Path, runner_bundle: Path, yaml_host: Path
) -> Iterator[ControllerProcess]:
    """The controller with the runner image's bundle at its place on this host (the node
    agent runs the init container's ``cp`` here)."""
    install_controller_rbac(cluster.kube)
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(
        cluster,
        namespace,
        tmp_path / "controller",
        env={"PKOBATCH_JOB__RUNNER_BUNDLE": str(runner_bundle)},
    )
    process.start()
    yield process
    process.stop()


def test_a_stack_in_a_stock_pulumi_image_runs_the_injected_bundle(
    cluster: Any,
    kube: Kube,
    namespace: str,
    bundle_controller: ControllerProcess,
    runner_bundle: Path,
    pulumi_env: Any,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo("yaml")
    data = {"token": git_server.token, "passphrase": pulumi_env.passphrase}
    create_secret(kube, namespace, "run", data)
    env = offline_pulumi_env(pulumi_env)
    env_refs: JSON = {
        name: {"type": "Literal", "literal": {"value": value}}
        for name, value in env.items()
        if name != "PULUMI_CONFIG_PASSPHRASE"
    }
    env_refs["PULUMI_CONFIG_PASSPHRASE"] = {
        "type": "Secret",
        "secret": {"name": "run", "key": "passphrase"},
    }
    spec = {
        "stack": "dev",
        "projectRepo": repo.http_url,
        "branch": "main",
        "gitAuth": {"accessToken": {"type": "Secret", "secret": {"name": "run", "key": "token"}}},
        "config": {"greeting": "hej"},
        "envRefs": env_refs,
        "workspaceTemplate": {"spec": {"image": cluster.pulumi_image}},
    }

    apply_stack(kube, namespace, "greeting", spec)
    stack = wait_stack(kube, namespace, "greeting", ready, timeout=600, what="Stack Ready")

    assert stack["status"]["outputs"]["message"] == "hej from YAML"
    assert stack["status"]["lastUpdate"]["state"] == "succeeded"
    # The Job: the stock image runs the bundle that an init container of the runner image
    # copied into a shared emptyDir.
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}=greeting")
    (job,) = jobs
    pod_spec = job["spec"]["template"]["spec"]
    (run,) = pod_spec["containers"]
    assert run["image"] == cluster.pulumi_image
    assert run["command"] == [INJECTED_RUNNER, "job", "run"]
    (init,) = pod_spec["initContainers"]
    assert init["command"] == ["cp", "-R", str(runner_bundle), INJECTED_BUNDLE]
    assert {"name": "pkobatch-runner", "emptyDir": {}} in pod_spec["volumes"]
    # What the node agent really started: the pod's copy of the bundle, with a PATH that
    # has the Pulumi CLI and the YAML host but not this virtualenv.
    launches = {launch.container: launch for launch in cluster.agent.launches(namespace)}
    copied = launches["pkobatch-runner"].argv[-1]
    assert launches["pkobatch-runner"].argv[:3] == ("cp", "-R", str(runner_bundle))
    assert copied.endswith("/volumes/pkobatch-runner/runner")
    assert launches["pulumi"].argv[:3] == (f"{copied}/pkobatch-runner", "job", "run")
    has_no_pkobatch(launches["pulumi"].path)


def test_programs_the_bundle_starts_get_the_images_library_path(
    runner_bundle: Path, tmp_path: Path
) -> None:
    """The launcher points LD_LIBRARY_PATH at the bundle's C library; what the runner starts
    (here a ``pulumi`` that records its environment) must see the image's value instead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorded = tmp_path / "pulumi-env"
    fake_pulumi = bin_dir / "pulumi"
    fake_pulumi.write_text(f'#!/bin/sh\nenv > "{recorded}"\necho v3.259.0\n')
    fake_pulumi.chmod(0o755)
    program = tmp_path / "program"
    program.mkdir()
    (program / "Pulumi.yaml").write_text("name: env-probe\nruntime: yaml\n")
    manifest = tmp_path / "stack.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "pulumi.com/v1",
                "kind": "Stack",
                "metadata": {"name": "probe", "namespace": "e2e"},
                "spec": {
                    "stack": "dev",
                    "workspaceTemplate": {"spec": {"local": {"dir": str(program)}}},
                },
            }
        )
    )
    env = {
        "PATH": os.pathsep.join([str(bin_dir), *SYSTEM_PATH]),
        "HOME": str(tmp_path / "home"),
        "LD_LIBRARY_PATH": "/opt/image-libraries",
        "PULUMI_CONFIG_PASSPHRASE": "not-a-secret",
    }

    subprocess.run(
        [str(runner_bundle / "pkobatch-runner"), "run", "-f", str(manifest)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )

    seen = dict(line.split("=", 1) for line in recorded.read_text().splitlines() if "=" in line)
    assert seen["LD_LIBRARY_PATH"] == "/opt/image-libraries"
    assert "PKOBATCH_IMAGE_LD_LIBRARY_PATH" not in seen
    assert "LD_LIBRARY_PATH_ORIG" not in seen
