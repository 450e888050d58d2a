"""The merge-key table of pkobatch.api.strategic_merge against the real API server's OpenAPI.

Every property under ``io.k8s.api.core.v1.PodTemplateSpec`` that carries
``x-kubernetes-patch-strategy`` (and ``x-kubernetes-patch-merge-key``) in the server's
``/openapi/v3/api/v1`` must be in ``POD_TEMPLATE_LISTS`` with the same values, and nothing
else: a Kubernetes upgrade that adds a merged list fails here until the table has it.
"""

from __future__ import annotations

from typing import Any

from pkobatch.api.strategic_merge import POD_TEMPLATE_LISTS, ListStrategy
from pkobatch.kube.client import Kube

JSON = dict[str, Any]
SCHEMA_PREFIX = "#/components/schemas/"
POD_TEMPLATE_SPEC = "io.k8s.api.core.v1.PodTemplateSpec"
STRATEGY = "x-kubernetes-patch-strategy"
MERGE_KEY = "x-kubernetes-patch-merge-key"


def referenced(schema: JSON) -> str | None:
    """The schema a property refers to (``$ref``, or OpenAPI v3's ``allOf: [{$ref}]``)."""
    ref = schema.get("$ref")
    if ref is None:
        refs = [s["$ref"] for s in schema.get("allOf") or [] if "$ref" in s]
        ref = refs[0] if refs else None
    return ref.removeprefix(SCHEMA_PREFIX) if ref else None


def declared_strategies(schemas: JSON) -> dict[str, ListStrategy]:
    found: dict[str, ListStrategy] = {}

    def walk(name: str, path: tuple[str, ...], seen: tuple[str, ...]) -> None:
        if name in seen:  # a recursive type: nothing new below it
            return
        for field, prop in (schemas[name].get("properties") or {}).items():
            at = (*path, field)
            if STRATEGY in prop:
                found[".".join(at)] = ListStrategy(prop[STRATEGY], prop.get(MERGE_KEY))
            below = (
                (prop, at),
                (prop.get("items"), at),
                (prop.get("additionalProperties"), (*at, "*")),
            )
            for child, child_path in below:
                target = referenced(child) if isinstance(child, dict) else None
                if target is not None:
                    walk(target, child_path, (*seen, name))

    walk(POD_TEMPLATE_SPEC, (), ())
    return found


def test_the_merge_key_table_is_the_api_servers(kube: Kube) -> None:
    document = kube.request("GET", "/openapi/v3/api/v1")
    schemas = document["components"]["schemas"]
    declared = declared_strategies(schemas)
    # The walk reached the pod's lists at all depths it should (a broken walk finds nothing).
    assert "spec.containers.env" in declared
    assert "spec.volumes.ephemeral.volumeClaimTemplate.metadata.finalizers" in declared
    assert declared == dict(POD_TEMPLATE_LISTS)
