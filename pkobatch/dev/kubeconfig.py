"""Kubeconfig files for the local control plane: the admin's (client certificate in
``system:masters``) and a ServiceAccount's (a real token from the TokenRequest API, so RBAC
applies to whoever uses it)."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

from pkobatch.kube.client import SERVICEACCOUNTS, Kube


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def kubeconfig(server: str, ca_pem: bytes, user_name: str, user: dict[str, str]) -> dict[str, Any]:
    """A single-context kubeconfig (context and cluster named ``pkobatch-dev``)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "pkobatch-dev",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user_name, "user": user}],
        "contexts": [
            {"name": "pkobatch-dev", "context": {"cluster": "pkobatch-dev", "user": user_name}}
        ],
        "current-context": "pkobatch-dev",
    }


def certificate_user(cert_pem: bytes, key_pem: bytes) -> dict[str, str]:
    return {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` readable by the owner only (it holds credentials)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    return path


def request_token(
    kube: Kube,
    namespace: str,
    service_account: str,
    *,
    expiration_seconds: int = 3600,
    bound_pod: dict[str, Any] | None = None,
) -> str:
    """A token for ``namespace/service_account`` from the TokenRequest API. A token bound to
    a pod stops working when that pod is deleted, as a kubelet-projected token does."""
    spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        spec["boundObjectRef"] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    response = kube.request(
        "POST",
        SERVICEACCOUNTS.path(namespace, service_account, "token"),
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(response["status"]["token"])


def service_account_user(namespace: str, service_account: str) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"
