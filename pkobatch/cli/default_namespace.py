"""The namespace a command works in when ``-n`` is not given, as kubectl picks it.

kubectl uses the namespace of the current (or ``--context``) kubeconfig context, else the
pod's namespace when running in a cluster, else ``default``. The Kubernetes client library
does not expose the context's namespace through ``pkobatch.kube``, and the CLI must not
import it, so the kubeconfig files are read here with PyYAML (merged like kubectl: the
first file that defines a context or ``current-context`` wins).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

DEFAULT_NAMESPACE: Final = "default"
IN_CLUSTER_NAMESPACE_FILE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def kubeconfig_paths(kubeconfig: str | None, environ: Mapping[str, str]) -> list[Path]:
    """The files kubectl would read: ``--kubeconfig``, else ``$KUBECONFIG``, else ~/.kube/config."""
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    listed = environ.get("KUBECONFIG", "")
    if listed:
        return [Path(part).expanduser() for part in listed.split(os.pathsep) if part]
    return [Path("~/.kube/config").expanduser()]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def context_namespace(configs: list[dict[str, Any]], context: str | None) -> str | None:
    """The namespace of ``context`` (or the current context) in merged kubeconfig data."""
    name = context or next((c["current-context"] for c in configs if c.get("current-context")), "")
    if not name:
        return None
    for config in configs:
        for entry in config.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                namespace = (entry.get("context") or {}).get("namespace")
                return str(namespace) if namespace else None
    return None


def default_namespace(
    kubeconfig: str | None, context: str | None, environ: Mapping[str, str] | None = None
) -> str:
    env = os.environ if environ is None else environ
    paths = [p for p in kubeconfig_paths(kubeconfig, env) if p.is_file()]
    if paths:
        namespace = context_namespace([_load(p) for p in paths], context)
        return namespace or DEFAULT_NAMESPACE
    try:
        return IN_CLUSTER_NAMESPACE_FILE.read_text(encoding="utf-8").strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE
