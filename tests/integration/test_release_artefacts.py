"""pkobatch's Python release artefacts as users get them: the sdist and the wheel built by
``python -m build`` (what .github/workflows/release.yml publishes), and the wheel installed
without the extra ``runner`` into a fresh virtualenv, where the CLI works against the real
control plane, the controller loads, and the runner refuses to start, naming the extra.

pip takes pkobatch's dependencies (and the build backend) from this machine's package index
and its cache, as ``pip install -e '.[dev]'`` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from pkobatch import __version__
from pkobatch.kube.client import STACKS

REPO = Path(__file__).resolve().parents[2]
IMPORT_EVERY_CONTROLLER_MODULE = """
import importlib, pkgutil, pkobatch.controller as controller
for module in pkgutil.walk_packages(controller.__path__, "pkobatch.controller."):
    importlib.import_module(module.name)
    print(module.name)
"""


def run(*argv: str | Path, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PKOBATCH_")}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it (``python -m build``'s default)."""
    out = tmp_path_factory.mktemp("dist")
    done = run(sys.executable, "-m", "build", "--outdir", out, REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def slim_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed as ``pip install pkobatch`` does."""
    root = tmp_path_factory.mktemp("slim-venv")
    venv.create(root, with_pip=True)
    (wheel,) = dist.glob("*.whl")
    done = run(root / "bin" / "python", "-m", "pip", "install", "-q", wheel, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_the_sdist_and_the_wheel_carry_pkobatch_at_its_version(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == [
        f"pkobatch-{__version__}-py3-none-any.whl",
        f"pkobatch-{__version__}.tar.gz",
    ]
    with zipfile.ZipFile(dist / f"pkobatch-{__version__}-py3-none-any.whl") as wheel:
        names = set(wheel.namelist())
        metadata = Parser().parsestr(
            wheel.read(f"pkobatch-{__version__}.dist-info/METADATA").decode()
        )
    # The package data the controller and the dev tools read at run time.
    assert {
        "pkobatch/controller/job_template.yaml",
        "pkobatch/dev/versions.env",
        "pkobatch/py.typed",
    } <= names
    requires = metadata.get_all("Requires-Dist") or []
    pulumi = [r for r in requires if r.startswith("pulumi")]
    assert pulumi == ['pulumi==3.259.0; extra == "runner"']
    assert "runner" in (metadata.get_all("Provides-Extra") or [])
    with tarfile.open(dist / f"pkobatch-{__version__}.tar.gz") as sdist:
        members = {m.name.partition("/")[2] for m in sdist.getmembers()}
    assert {"pyproject.toml", "README.md", "pkobatch/main.py"} <= members


def test_the_wheel_without_the_extra_gives_the_cli_and_the_controller(
    slim_venv: Path, cluster: Any, namespace: str
) -> None:
    python, pkobatch = slim_venv / "bin" / "python", slim_venv / "bin" / "pkobatch"
    absent = run(
        python,
        "-c",
        "import importlib.util as u; print(u.find_spec('pulumi'), u.find_spec('grpc'))",
    )
    assert absent.stdout.split() == ["None", "None"], absent.stderr

    cluster.kube.create(
        STACKS,
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "slim"},
            "spec": {"stack": "org/p/slim"},
        },
        namespace,
    )
    done = run(pkobatch, "get", "--kubeconfig", cluster.kubeconfig, "-n", namespace, "-o", "name")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["stack.pulumi.com/slim"]

    controller = run(pkobatch, "controller", "--help")
    assert controller.returncode == 0, controller.stderr
    assert "Usage: pkobatch controller" in controller.stdout
    loaded = run(python, "-c", IMPORT_EVERY_CONTROLLER_MODULE)
    assert loaded.returncode == 0, loaded.stderr
    assert "pkobatch.controller.reconcile" in loaded.stdout.split()


def test_the_runner_without_the_extra_says_which_extra_to_install(slim_venv: Path) -> None:
    done = run(slim_venv / "bin" / "pkobatch", "job", "run", "--snapshot", "{}")
    assert done.returncode == 3
    assert "pip install 'pkobatch[runner]'" in done.stderr
    assert "Traceback" not in done.stderr
