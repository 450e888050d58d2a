"""Every property path of a CRD's schema, as the tests compare them with PKO's tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def walk(
    schema: dict[str, Any], path: str = "", *, map_values: str = "{}"
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, node) for the node and every node below it: ``a.b`` for a property, ``a[]`` for
    a list's items and ``a`` + ``map_values`` for a map's values; the root's path is ""."""
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}" if path else name, map_values=map_values)
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]", map_values=map_values)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], path + map_values, map_values=map_values)
