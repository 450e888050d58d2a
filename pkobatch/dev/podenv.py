"""A container's environment as the kubelet builds it: ``envFrom`` first, then ``env`` (later
entries win), values from Secrets, ConfigMaps and the pod's own fields, and ``$(VAR)``
references expanded against the variables defined before.

A reference that cannot be resolved yet (a missing Secret or key that is not optional) is a
``CreateContainerConfigError``: the kubelet leaves the pod Pending and retries, and so does
the node agent.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

from pkobatch.api.objects import JSON
from pkobatch.kube.client import CONFIGMAPS, SECRETS, Kube, NotFound

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class CreateContainerConfigError(Exception):
    """The environment references something that does not exist (yet)."""


def expand(value: str, variables: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal
    ``$``, anything else stays as written."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return variables.get(name, match.group(0))

    return _REFERENCE.sub(replace, value)


def field_value(pod: JSON, path: str) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple: dict[str, Callable[[], Any]] = {
        "metadata.name": lambda: meta.get("name"),
        "metadata.namespace": lambda: meta.get("namespace"),
        "metadata.uid": lambda: meta.get("uid"),
        "spec.nodeName": lambda: spec.get("nodeName"),
        "spec.serviceAccountName": lambda: spec.get("serviceAccountName") or "default",
        # The process runs on this host, on loopback.
        "status.hostIP": lambda: "127.0.0.1",
        "status.hostIPs": lambda: "127.0.0.1",
        "status.podIP": lambda: "127.0.0.1",
        "status.podIPs": lambda: "127.0.0.1",
    }
    if path in simple:
        return str(simple[path]() or "")
    keyed = _FIELD_KEY.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise CreateContainerConfigError(f"unsupported fieldRef.fieldPath {path!r}")


class _Sources:
    """Secrets and ConfigMaps of the pod's namespace, each read once per resolution."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self._cache: dict[tuple[str, str], dict[str, str] | None] = {}

    def data(self, kind: str, name: str) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self._cache:
            self._cache[key] = self._read(kind, name)
        return self._cache[key]

    def _read(self, kind: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "Secret":
                obj = self._kube.get(SECRETS, name, self._namespace)
                return {
                    k: base64.b64decode(v).decode("utf-8", "replace")
                    for k, v in (obj.get("data") or {}).items()
                }
            obj = self._kube.get(CONFIGMAPS, name, self._namespace)
        except NotFound:
            return None
        values = dict(obj.get("data") or {})
        for k, v in (obj.get("binaryData") or {}).items():
            values[k] = base64.b64decode(v).decode("utf-8", "replace")
        return values


def _key_ref(sources: _Sources, kind: str, ref: JSON) -> str | None:
    name, key = ref.get("name", ""), ref["key"]
    data = sources.data(kind, name)
    if data is None or key not in data:
        if ref.get("optional"):
            return None
        what = f"{kind.lower()} {name!r}" if data is None else f"key {key!r} in {kind} {name!r}"
        raise CreateContainerConfigError(f"{what} not found")
    return data[key]


def resolve_env(kube: Kube, pod: JSON, container: JSON) -> dict[str, str]:
    """The variables the kubelet would give ``container`` of ``pod``."""
    namespace = pod["metadata"]["namespace"]
    sources = _Sources(kube, namespace)
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = source.get(field)
            if ref is None:
                continue
            data = sources.data(kind, ref.get("name", ""))
            if data is None:
                if ref.get("optional"):
                    continue
                raise CreateContainerConfigError(f"{kind.lower()} {ref.get('name')!r} not found")
            for key, item in data.items():
                env[prefix + key] = item
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        value: str | None
        if "secretKeyRef" in source:
            value = _key_ref(sources, "Secret", source["secretKeyRef"])
        elif "configMapKeyRef" in source:
            value = _key_ref(sources, "ConfigMap", source["configMapKeyRef"])
        elif "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        else:
            raise CreateContainerConfigError(
                f"env {name}: only secretKeyRef, configMapKeyRef and fieldRef are supported "
                "by the node agent"
            )
        if value is not None:
            env[name] = value
    return env
