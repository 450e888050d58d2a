"""The Prometheus Operator's own CRDs (from its Go module, scripts/tools.sh) installed in the
local control plane accept pkobatch's ServiceMonitor and PrometheusRule, from kustomize and
from the chart, with ``kubectl apply --dry-run=server``: the API server validates them
against the operator's schemas.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.deploy_render import KUBECTL, KUSTOMIZE, template, user_kustomization

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CRDS

OPERATOR_KINDS = ("servicemonitors", "prometheusrules")


def kubectl(cluster: Any, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def operator_crds(cluster: Any, prometheus_operator_crds: Path) -> None:
    for kind in OPERATOR_KINDS:
        path = prometheus_operator_crds / f"monitoring.coreos.com_{kind}.yaml"
        # Server-side: the CRDs are too large for kubectl's last-applied annotation.
        done = kubectl(cluster, "apply", "--server-side", "-f", str(path))
        assert done.returncode == 0, done.stderr

        def established(name: str = f"{kind}.monitoring.coreos.com") -> bool:
            conditions = (cluster.kube.get(CRDS, name).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until(established, timeout=60, what=f"CRD {kind}.monitoring.coreos.com")


def monitoring_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1"]


def dry_run(cluster: Any, objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return kubectl(
        cluster, "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(objects)
    )


def test_operator_accepts_the_kustomize_components_objects(
    cluster: Any, operator_crds: None, namespace: str, tmp_path: Path
) -> None:
    objects = monitoring_objects(
        user_kustomization(
            tmp_path, [KUSTOMIZE / "base"], [KUSTOMIZE / "components" / "monitoring"], namespace
        )
    )
    assert sorted(o["kind"] for o in objects) == ["PrometheusRule", "ServiceMonitor"]
    done = dry_run(cluster, objects)
    assert done.returncode == 0, done.stderr
    assert "servicemonitor.monitoring.coreos.com/pkobatch-controller created (server dry run)" in (
        done.stdout
    )
    assert "prometheusrule.monitoring.coreos.com/pkobatch created (server dry run)" in done.stdout


def test_operator_accepts_the_charts_objects(
    cluster: Any, operator_crds: None, namespace: str, helm_bin: Path
) -> None:
    objects = monitoring_objects(
        template(
            helm_bin,
            ["monitoring"],
            namespace,
            sets=["serviceMonitor.labels.release=prometheus", "prometheusRule.labels.role=alerts"],
        )
    )
    assert sorted(o["kind"] for o in objects) == ["PrometheusRule", "ServiceMonitor"]
    done = dry_run(cluster, objects)
    assert done.returncode == 0, done.stderr


def test_the_dry_run_enforces_the_operators_schema(
    cluster: Any, operator_crds: None, namespace: str, tmp_path: Path
) -> None:
    """A broken object is refused: the acceptance above means something."""
    objects = monitoring_objects(
        user_kustomization(
            tmp_path, [KUSTOMIZE / "base"], [KUSTOMIZE / "components" / "monitoring"], namespace
        )
    )
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["interval"] = "every minute"
    done = dry_run(cluster, [monitor])
    assert done.returncode != 0
    assert "interval" in done.stderr
