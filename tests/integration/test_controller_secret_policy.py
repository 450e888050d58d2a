"""The admission policy on the controller's Secrets (deploy/kustomize/base), on the real API
server: the controller's `create` on Secrets serves a run's inline secrets and a PKO Update's
outputs, and nothing else."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import CONTROLLER_NAMESPACE, CONTROLLER_SA

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import JOBS, SECRETS, Kube, KubeError, NotFound


def test_the_controller_may_create_no_secret_but_a_runs_own(
    cluster: Any, kube: Kube, namespace: str, controller_rbac: None, tmp_path: Path
) -> None:
    """`create` on Secrets (a run's inline secrets) must not let a stolen controller token mint
    a ServiceAccount token Secret, which its `get` could then read: the admission policy of
    deploy/kustomize/base allows only an Opaque `<job>-secrets` owned by its Job."""
    path = tmp_path / "controller.kubeconfig"
    as_controller = Kube.connect(
        str(cluster.service_account_kubeconfig(CONTROLLER_NAMESPACE, CONTROLLER_SA, path))
    )
    minted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "minted-token",
            "annotations": {"kubernetes.io/service-account.name": "default"},
        },
        "type": "kubernetes.io/service-account-token",
    }

    def refused() -> bool:
        try:
            as_controller.create(SECRETS, minted, namespace)
        except KubeError as error:
            assert "the pkobatch controller may only create" in error.message, error.message
            return True
        kube.delete(SECRETS, "minted-token", namespace)  # the policy is not in force yet
        return False

    wait_until(refused, timeout=60, what="the admission policy refusing a token Secret")
    job = kube.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "app-up-0123456789"},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "pulumi", "image": "unused"}],
                    }
                },
            },
        },
        namespace,
    )
    run_secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "app-up-0123456789-secrets",
            "labels": {"pkobatch.io/run-input-of": "app-up-0123456789"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "app-up-0123456789",
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "type": "Opaque",
        "stringData": {"PKOBATCH_INLINE_SECRET_0": "value"},
    }
    as_controller.create(SECRETS, run_secret, namespace)
    unowned = {**run_secret, "metadata": {**run_secret["metadata"], "ownerReferences": []}}
    unowned["metadata"]["name"] = "app-up-0123456789-secrets-2"
    with pytest.raises(KubeError, match="may only create"):
        as_controller.create(SECRETS, unowned, namespace)
    # A PKO Update's outputs Secret, owned by that Update (pkobatch.controller.auto_runs).
    by_update = {
        "apiVersion": "auto.pulumi.com/v1alpha1",
        "kind": "Update",
        "name": "app-up",
        "uid": "00000000-0000-4000-8000-000000000001",
        "controller": True,
    }
    outputs = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "app-up-stack-outputs",
            "labels": {"auto.pulumi.com/update-name": "app-up"},
            "ownerReferences": [by_update],
        },
        "type": "Opaque",
        "stringData": {"url": '"https://example.com"'},
    }
    as_controller.create(SECRETS, outputs, namespace)
    job_owned = {**outputs, "metadata": {**outputs["metadata"], "name": "app-up-stack-outputs"}}
    job_owned["metadata"]["ownerReferences"] = run_secret["metadata"]["ownerReferences"]
    job_owned["metadata"]["labels"] = {"auto.pulumi.com/update-name": "app-up"}
    # Its owner Update does not exist, so kube-controller-manager's garbage collector may
    # have deleted it already.
    with contextlib.suppress(NotFound):
        kube.delete(SECRETS, "app-up-stack-outputs", namespace)
    with pytest.raises(KubeError, match="must be owned by"):
        as_controller.create(SECRETS, job_owned, namespace)
    update_owned_input = {
        **run_secret,
        "metadata": {**run_secret["metadata"], "name": "app-up-0123456789-secrets"},
    }
    update_owned_input["metadata"]["ownerReferences"] = [by_update]
    kube.delete(SECRETS, "app-up-0123456789-secrets", namespace)
    with pytest.raises(KubeError, match="must be owned by"):
        as_controller.create(SECRETS, update_owned_input, namespace)
    as_controller.close()
