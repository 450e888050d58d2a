"""Secure metrics (``PKOBATCH_METRICS_SECURE``) against the real API server: the manager,
wired as ``pkobatch controller`` wires it and connected as the controller's ServiceAccount
with the kustomize base's RBAC, serves /metrics over HTTPS (a mounted certificate) to a
ServiceAccount bound to ``pkobatch-metrics-reader`` (200), refuses one without that binding
(403), a token the API server does not accept and a request without a token (401)."""

from __future__ import annotations

import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.controller_harness import CONTROLLER_NAMESPACE, CONTROLLER_SA

from pkobatch.config import Settings, load_settings
from pkobatch.controller.composition import CONTROLLER_NAME, build_manager
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import StackKey, Stores
from pkobatch.dev.kubeconfig import request_token
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CLUSTERROLEBINDINGS, CLUSTERROLES, SERVICEACCOUNTS, Kube
from pkobatch.runtime.interfaces import Enqueuer, ReconcileResult
from pkobatch.runtime.manager import Manager
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.secure_metrics import CERT_FILE, KEY_FILE, self_signed_certificate

REPO = Path(__file__).resolve().parents[2]
READER_ROLE = REPO / "deploy" / "kustomize" / "components" / "secure-metrics"
SERVER_NAME = "localhost"


class Idle:
    def reconcile(self, key: StackKey) -> ReconcileResult:
        return ReconcileResult()


@pytest.fixture
def secure_manager(
    cluster: Any, controller_rbac: None, namespace: str, tmp_path: Path
) -> Iterator[tuple[Manager, Path]]:
    cert, key = self_signed_certificate(SERVER_NAME)
    (tmp_path / CERT_FILE).write_bytes(cert)
    (tmp_path / KEY_FILE).write_bytes(key)
    settings = load_settings(
        namespaces=namespace,
        metrics_addr="127.0.0.1:0",
        health_addr="0",
        metrics_secure=True,
        metrics_cert_dir=str(tmp_path),
    )

    def factory(
        kube: Kube, stores: Stores, settings: Settings, metrics: StackMetrics, enqueuer: Enqueuer
    ) -> Idle:
        return Idle()

    kube = cluster.service_account_kube(CONTROLLER_NAMESPACE, CONTROLLER_SA)
    manager = build_manager(kube, settings, Metrics(CONTROLLER_NAME), factory)
    thread = threading.Thread(target=manager.run)
    thread.start()
    try:
        wait_until(manager.synced, timeout=60, what="caches to sync")
        yield manager, tmp_path / CERT_FILE
    finally:
        manager.stop()
        thread.join(60)


@pytest.fixture
def reader_role(kube: Kube, namespace: str) -> Iterator[str]:
    """The component's ClusterRole, bound to ServiceAccount ``reader`` of ``namespace``."""
    role = yaml.safe_load((READER_ROLE / "metrics-reader-clusterrole.yaml").read_text())
    binding_name = f"{namespace}-metrics-reader"
    created_role = kube.get_or_none(CLUSTERROLES, role["metadata"]["name"]) is None
    if created_role:
        kube.create(CLUSTERROLES, role)
    kube.create(
        CLUSTERROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding_name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    try:
        yield binding_name
    finally:
        kube.delete(CLUSTERROLEBINDINGS, binding_name)
        if created_role:
            kube.delete(CLUSTERROLES, role["metadata"]["name"])


def scrape(port: int, ca: Path, token: str | None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    # The certificate names localhost; the connection goes to loopback.
    request = urllib.request.Request(f"https://{SERVER_NAME}:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_only_a_bound_service_account_reads_the_metrics(
    kube: Kube,
    namespace: str,
    secure_manager: tuple[Manager, Path],
    reader_role: str,
) -> None:
    manager, ca = secure_manager
    (port,) = manager.endpoint_ports
    for name in ("reader", "stranger"):
        kube.create(
            SERVICEACCOUNTS,
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            namespace,
        )
    reader = request_token(kube, namespace, "reader", expiration_seconds=600)
    stranger = request_token(kube, namespace, "stranger", expiration_seconds=600)

    status, text = scrape(port, ca, reader)
    assert status == 200, text
    assert 'controller_runtime_reconcile_total{controller="stack-controller"' in text

    status, text = scrape(port, ca, stranger)
    assert status == 403
    assert f"system:serviceaccount:{namespace}:stranger may not get /metrics" in text

    assert scrape(port, ca, None)[0] == 401
    assert scrape(port, ca, reader[:-4] + "AAAA")[0] == 401

    # Plain HTTP gets no metrics.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)
