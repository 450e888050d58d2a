"""Kubernetes' strategic merge patch of pod templates, as the API server applies it.

PKO merges ``spec.workspaceTemplate.spec.podTemplate`` over its workspace pod with
apimachinery's strategic merge (the server-side variant: parallel lists are applied, unmatched
nulls dropped), so pkobatch merges it over the run's pod template the same way:

- maps merge key by key; ``null`` deletes a key;
- a list merges item by item only where Kubernetes declares a patch strategy ``merge`` for it
  (``POD_TEMPLATE_LISTS``: containers by ``name``, volumeMounts by ``mountPath``, ports by
  ``containerPort``, ...); every other list (``tolerations``, ``args``, ``envFrom``, ...) is
  replaced. The merged list keeps the base's order among the base's items and the patch's
  among the patch's; a base item goes first only where the base places it before the patch
  item it meets, so items only the patch has usually come first (apimachinery's ordering
  rule), unless ``$setElementOrder/<list>`` says otherwise;
- directives: ``$patch: replace`` / ``$patch: delete`` on a map or a list item,
  ``$retainKeys``, ``$setElementOrder/<list>``, ``$deleteFromPrimitiveList/<list>``.

The table is checked against the ``x-kubernetes-patch-strategy`` and
``x-kubernetes-patch-merge-key`` extensions of a real API server's OpenAPI by
``tests/integration/test_strategic_merge_openapi.py``, and the whole merge against the
server's own dry-run PATCH by ``tests/integration/test_strategic_merge_server.py``.

The API server rejects a field the pod types do not have only where base and patch both hold
a map or a list under it; this module, which has the list table but not every field, merges
such a field as any other (the API server drops it, with a warning, from the Job). What the
server drops when it decodes the result into a typed object — keys starting with ``$`` that no
directive consumed, ``null`` values — is dropped here too. A patch that both adds a value to
a scalar list and deletes it (``$deleteFromPrimitiveList``) gets from the API server a result
that depends on Go's map order; here the patch's key order decides. The order apimachinery
gives a ``$setElementOrder`` list depends on how its merge reused the base's Go slice; that is
followed for lists of maps (``_base_as_apimachinery_sees_it``), not for the one merged scalar
list of a pod template (``finalizers``), whose result also depends on the slice's capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

DIRECTIVE: Final = "$patch"
RETAIN_KEYS: Final = "$retainKeys"
SET_ELEMENT_ORDER: Final = "$setElementOrder"
DELETE_FROM_PRIMITIVE_LIST: Final = "$deleteFromPrimitiveList"
_REPLACE: Final = "replace"
_DELETE: Final = "delete"
_MERGE: Final = "merge"


class StrategicMergeError(ValueError):
    """The patch is not a valid strategic merge patch; the message names where."""


@dataclass(frozen=True)
class ListStrategy:
    """A list's ``x-kubernetes-patch-strategy`` and ``x-kubernetes-patch-merge-key``."""

    strategy: str
    # None for a list of scalars (merged as a set).
    merge_key: str | None = None

    @property
    def merges(self) -> bool:
        return _MERGE in self.strategy.split(",")


_BY_NAME: Final = ListStrategy("merge", "name")
_CONTAINER_LISTS: Final = {
    "ports": ListStrategy("merge", "containerPort"),
    "env": _BY_NAME,
    "volumeMounts": ListStrategy("merge", "mountPath"),
    "volumeDevices": ListStrategy("merge", "devicePath"),
}
_OBJECT_META_LISTS: Final = {
    "ownerReferences": ListStrategy("merge", "uid"),
    "finalizers": ListStrategy("merge"),
}

# Every list under a PodTemplateSpec (core/v1, Kubernetes 1.37) with a patch strategy, by its
# path of field names from the PodTemplateSpec (list items add nothing to a path).
POD_TEMPLATE_LISTS: Final[Mapping[str, ListStrategy]] = {
    **{f"metadata.{field}": strategy for field, strategy in _OBJECT_META_LISTS.items()},
    "spec.volumes": ListStrategy("merge,retainKeys", "name"),
    **{
        f"spec.volumes.ephemeral.volumeClaimTemplate.metadata.{field}": strategy
        for field, strategy in _OBJECT_META_LISTS.items()
    },
    "spec.initContainers": _BY_NAME,
    "spec.containers": _BY_NAME,
    "spec.ephemeralContainers": _BY_NAME,
    **{
        f"spec.{containers}.{field}": strategy
        for containers in ("initContainers", "containers", "ephemeralContainers")
        for field, strategy in _CONTAINER_LISTS.items()
    },
    "spec.imagePullSecrets": _BY_NAME,
    "spec.hostAliases": ListStrategy("merge", "ip"),
    "spec.topologySpreadConstraints": ListStrategy("merge", "topologyKey"),
    "spec.schedulingGates": _BY_NAME,
    "spec.resourceClaims": ListStrategy("merge,retainKeys", "name"),
    "spec.evictionResponders": _BY_NAME,
}

Path = tuple[str, ...]
POD_TEMPLATE: Final[Path] = ()
POD_SPEC: Final[Path] = ("spec",)


def strategic_merge(
    base: Mapping[str, Any], patch: Mapping[str, Any], root: Path = POD_TEMPLATE
) -> dict[str, Any]:
    """``patch`` applied to ``base`` as the API server applies a strategic merge patch.

    ``root`` is where both sit in a PodTemplateSpec: ``POD_TEMPLATE`` (the template itself) or
    ``POD_SPEC`` (its ``spec``). Returns a new map; the inputs are not modified. Raises
    ``StrategicMergeError``.
    """
    merged = _merge_map(_copied(dict(base)), _copied(dict(patch)), root)
    return _decoded_map(merged)


def _copied(value: Any) -> Any:
    """A copy of a JSON value in which no map or list is shared: unlike ``copy.deepcopy``,
    which keeps the sharing (a builder may put one env var into every container), so merging
    into one would change the others — decoded JSON shares nothing."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def _where(path: Path) -> str:
    return ".".join(path) or "the template"


def _strategy(path: Path) -> ListStrategy | None:
    return POD_TEMPLATE_LISTS.get(".".join(path))


def _merge_map(original: dict[str, Any], patch: dict[str, Any], path: Path) -> dict[str, Any]:
    if DIRECTIVE in patch:
        directive = patch.pop(DIRECTIVE)
        if directive == _REPLACE:
            return patch
        if directive == _DELETE:
            return {}
        raise StrategicMergeError(
            f"{_where(path)}: unknown {DIRECTIVE} {directive!r} (a map takes "
            f"{_REPLACE!r} or {_DELETE!r})"
        )
    _apply_retain_keys(original, patch, path)
    _apply_element_orders(original, patch, path)
    for key, value in list(patch.items()):
        deleting = key.startswith(DELETE_FROM_PRIMITIVE_LIST)
        if deleting:
            key = _directive_target(key, DELETE_FROM_PRIMITIVE_LIST, path)
        if value is None:
            original.pop(key, None)
            continue
        if key not in original or type(original[key]) is not type(value):
            if not deleting:
                _set_without_directives(original, key, _without_nulls(value))
            continue
        child = (*path, key)
        if isinstance(value, dict):
            original[key] = _merge_map(original[key], value, child)
        elif isinstance(value, list):
            original[key] = _merge_list_field(original[key], value, child, deleting)
        else:
            _set_without_directives(original, key, value)
    return original


def _merge_list_field(
    original: list[Any], patch: list[Any], path: Path, deleting: bool
) -> list[Any]:
    strategy = _strategy(path)
    if deleting or (strategy is not None and strategy.merges):
        key = strategy.merge_key if strategy else None
        return _merge_list(original, patch, path, key, deleting)
    return patch


def _set_without_directives(target: dict[str, Any], key: str, value: Any) -> None:
    kept, keep = _remove_directives(value)
    if keep:
        target[key] = kept
    else:
        target.pop(key, None)


def _apply_retain_keys(original: dict[str, Any], patch: dict[str, Any], path: Path) -> None:
    if RETAIN_KEYS not in patch:
        return
    retain = patch.pop(RETAIN_KEYS)
    if not isinstance(retain, list):
        raise StrategicMergeError(f"{_where(path)}: {RETAIN_KEYS} must be a list of field names")
    kept = {k for k in retain if isinstance(k, str)}
    for key, value in patch.items():
        if value is None or key.startswith((DELETE_FROM_PRIMITIVE_LIST, SET_ELEMENT_ORDER)):
            continue
        if key not in kept:
            raise StrategicMergeError(
                f"{_where(path)}: {key!r} is in the patch but not in its {RETAIN_KEYS} "
                f"{retain!r}; add it there"
            )
    for key in list(original):
        if key not in kept:
            del original[key]


def _apply_element_orders(original: dict[str, Any], patch: dict[str, Any], path: Path) -> None:
    """``$setElementOrder/<list>``: the list merged, then ordered as the directive says."""
    for directive in [k for k in patch if k.startswith(SET_ELEMENT_ORDER)]:
        order = patch.pop(directive)
        if not isinstance(order, list):
            raise StrategicMergeError(f"{_where(path)}: {directive} must be a list")
        field = _directive_target(directive, SET_ELEMENT_ORDER, path)
        child = (*path, field)
        in_original, in_patch = field in original, field in patch
        base_list = _list_at(original, field, child) if in_original else []
        patch_list = _list_at(patch, field, child) if in_patch else []
        strategy = _strategy(child)
        key = strategy.merge_key if strategy else None
        _check_order(patch_list, order, key, child)
        if in_original and in_patch:
            merged = _merge_list_field(base_list, patch_list, child, False)
        elif in_patch:
            merged, _ = _remove_directives(patch_list)
        elif in_original:
            merged = base_list
        else:
            continue
        kind = _element_kind([*base_list, *patch_list], child)
        in_order, server_only = _partition(merged, order, key, child)
        seen = base_list
        if in_original and in_patch and kind is dict and key and strategy and strategy.merges:
            seen = _base_as_apimachinery_sees_it(base_list, patch_list, key)
        original[field] = _normalize_order(in_order, server_only, order, seen, key, kind, child)
        patch.pop(field, None)


def _base_as_apimachinery_sees_it(base: list[Any], patch: list[Any], key: str) -> list[Any]:
    """The base list by which apimachinery orders a ``$setElementOrder`` list: the merge before
    it deletes and appends items in the base's own Go slice, so the base, as the ordering step
    reads it, has its items shifted left over each deleted one (the last one repeated) and, in
    the places the deletions freed, the first new items of the patch."""
    seen = list(base)
    current = list(base)
    for item in patch:
        if item.get(DIRECTIVE) == _DELETE and key in item:
            while (index := _find(current, key, item[key])) is not None:
                del current[index]
                seen[index : len(current)] = current[index:]
    if any(item.get(DIRECTIVE) == _REPLACE for item in patch):
        return seen
    for item in patch:
        if DIRECTIVE in item or key not in item or _find(current, key, item[key]) is not None:
            continue
        if len(current) < len(seen):
            seen[len(current)] = item
        current.append(item)
    return seen


def _list_at(obj: dict[str, Any], field: str, path: Path) -> list[Any]:
    value = obj[field]
    if not isinstance(value, list):
        raise StrategicMergeError(f"{_where(path)}: must be a list")
    return value


def _directive_target(key: str, prefix: str, path: Path) -> str:
    head, _, field = key.partition("/")
    if head != prefix or not field:
        raise StrategicMergeError(f"{_where(path)}: {key!r} must be {prefix}/<list field>")
    return field


def _check_order(patch_list: list[Any], order: list[Any], key: str | None, path: Path) -> None:
    """Every item of the patch list must appear in ``$setElementOrder``, in the same order."""
    if not patch_list or not order:
        return
    items = _without_deletions(patch_list, path)[0] if key else patch_list
    index = position = 0
    while index < len(items) and position < len(order):
        if isinstance(items[index], dict) and DIRECTIVE in items[index]:
            index += 1
            continue
        if _same(_merge_value(items[index], key, path), _merge_value(order[position], key, path)):
            index += 1
        position += 1
    if index < len(items):
        raise StrategicMergeError(
            f"{_where(path)}: the order of the list does not match its "
            f"{SET_ELEMENT_ORDER}/{path[-1]} {order!r}"
        )


def _merge_value(item: Any, key: str | None, path: Path) -> Any:
    if key is None:
        return item
    if not isinstance(item, dict):
        raise StrategicMergeError(f"{_where(path)}: item {item!r} must be a map")
    if key not in item:
        raise StrategicMergeError(f"{_where(path)}: item {item!r} has no merge key {key!r}")
    return item[key]


def _merge_list(
    original: list[Any], patch: list[Any], path: Path, key: str | None, deleting: bool
) -> list[Any]:
    if not original and not patch:
        return original
    kind = _element_kind([*original, *patch], path)
    if kind is not dict:
        if deleting:
            return [v for v in original if not any(_same(v, r) for r in patch)]
        merged = _deduplicated([*original, *patch])
    else:
        if key is None:
            raise StrategicMergeError(f"{_where(path)}: a list of maps needs a merge key to merge")
        original, patch = _apply_item_directives(original, patch, key, path)
        merged = list(original)
        for item in patch:
            value = _merge_value(item, key, path)
            found = _find(merged, key, value)
            if found is None:
                merged.append(item)
            else:
                merged[found] = _merge_map(merged[found], item, path)
    in_patch, server_only = _partition(merged, patch, key, path)
    return _normalize_order(in_patch, server_only, patch, original, key, kind, path)


def _apply_item_directives(
    original: list[Any], patch: list[Any], key: str, path: Path
) -> tuple[list[Any], list[Any]]:
    """``$patch: delete`` items delete their match; a ``$patch: replace`` item makes the
    patch's other items the whole list."""
    plain: list[Any] = []
    replace = False
    for item in patch:
        if DIRECTIVE not in item:
            plain.append(item)
            continue
        directive = item[DIRECTIVE]
        if directive == _DELETE:
            value = _merge_value(item, key, path)
            original = [o for o in original if _find([o], key, value) is None]
        elif directive == _REPLACE:
            replace = True
        elif directive == _MERGE:
            raise StrategicMergeError(
                f"{_where(path)}: {DIRECTIVE}: merge is not allowed in a list item"
            )
        else:
            raise StrategicMergeError(f"{_where(path)}: unknown {DIRECTIVE} {directive!r}")
    if replace:
        return plain, []
    return original, plain


def _find(items: list[Any], key: str, value: Any) -> int | None:
    """The first item (all maps) whose merge key is ``value``."""
    for index, item in enumerate(items):
        if key in item and _same(item[key], value):
            return index
    return None


def _without_deletions(items: list[Any], path: Path) -> tuple[list[Any], list[Any]]:
    """The items, and apart the ``$patch: delete`` ones."""
    kept: list[Any] = []
    deleted: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            raise StrategicMergeError(f"{_where(path)}: item {item!r} must be a map")
        (deleted if item.get(DIRECTIVE) == _DELETE else kept).append(item)
    return kept, deleted


def _partition(
    merged: list[Any], partition_by: list[Any], key: str | None, path: Path
) -> tuple[list[Any], list[Any]]:
    """The merged items named by ``partition_by`` (the patch or its order), and the rest."""
    if key is not None:
        for other in partition_by:
            if not isinstance(other, dict):
                raise StrategicMergeError(f"{_where(path)}: item {other!r} must be a map")
    named: list[Any] = []
    rest: list[Any] = []
    for item in merged:
        if key is None:
            found = any(_same(item, other) for other in partition_by)
        else:
            found = _find(partition_by, key, _merge_value(item, key, path)) is not None
        (named if found else rest).append(item)
    return named, rest


def _normalize_order(
    in_patch: list[Any],
    server_only: list[Any],
    patch_order: list[Any],
    server_order: list[Any],
    key: str | None,
    kind: type,
    path: Path,
) -> list[Any]:
    """apimachinery's order: the patch's items in the patch's order, the base's in the base's,
    then interleaved — a base item goes before a patch item only where the base has both and
    places it earlier."""
    in_patch = _sorted_by(in_patch, patch_order, key, kind, path)
    server_only = _sorted_by(server_only, server_order, key, kind, path)

    def position(item: Any) -> int:
        return _index(server_order, item, key, kind)

    merged: list[Any] = []
    left, right = 0, 0
    while left < len(server_only) or right < len(in_patch):
        if right >= len(in_patch):
            merged.append(server_only[left])
            left += 1
        elif left >= len(server_only):
            merged.append(in_patch[right])
            right += 1
        else:
            mine, theirs = position(server_only[left]), position(in_patch[right])
            if mine >= 0 and theirs >= 0 and mine < theirs:
                merged.append(server_only[left])
                left += 1
            else:
                merged.append(in_patch[right])
                right += 1
    return merged


def _sorted_by(
    items: list[Any], order: list[Any], key: str | None, kind: type, path: Path
) -> list[Any]:
    deleted: list[Any] = []
    if kind is dict:
        for item in [*items, *order]:
            _merge_value(item, key, path)
        items, deleted = _without_deletions(items, path)
    ranked = sorted(items, key=lambda item: _index(order, item, key, kind))
    return [*ranked, *deleted]


def _index(items: list[Any], item: Any, key: str | None, kind: type) -> int:
    def value(of: Any) -> Any:
        if kind is dict:
            return of.get(key) if isinstance(of, dict) and key else None
        return of

    wanted = value(item)
    for index, each in enumerate(items):
        if _same(value(each), wanted):
            return index
    return -1


def _element_kind(items: list[Any], path: Path) -> type:
    kinds = {type(item) for item in items}
    if not kinds:
        raise StrategicMergeError(f"{_where(path)}: no elements in the lists to order")
    if list in kinds:
        raise StrategicMergeError(f"{_where(path)}: lists of lists cannot be merged")
    if len(kinds) > 1:
        raise StrategicMergeError(f"{_where(path)}: the list's items are not all of one type")
    return kinds.pop()


def _same(left: Any, right: Any) -> bool:
    """Go's ``==`` on decoded JSON: equal values of the same type (1 is not 1.0 or true)."""
    return type(left) is type(right) and left == right


def _deduplicated(items: list[Any]) -> list[Any]:
    """apimachinery's deduplication of a scalar list: a duplicate is replaced by the last
    item (so the order changes as the API server changes it)."""
    items = list(items)
    last = len(items) - 1
    i = 0
    while i < last:
        j = i + 1
        while j <= last:
            if _same(items[i], items[j]):
                items[j] = items[last]
                items = items[:last]
                last -= 1
                j -= 1
            j += 1
        i += 1
    return items


def _remove_directives(value: Any) -> tuple[Any, bool]:
    """A value new to the base, without the maps that carry a ``$patch`` (and whether the value
    itself is kept)."""
    if isinstance(value, dict):
        if DIRECTIVE in value:
            return None, False
        for key in list(value):
            kept, keep = _remove_directives(value[key])
            if keep:
                value[key] = kept
            else:
                del value[key]
        return value, True
    if isinstance(value, list):
        return [kept for kept, keep in map(_remove_directives, value) if keep], True
    return value, True


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _decoded_map(value: dict[str, Any]) -> dict[str, Any]:
    """What the API server keeps when it decodes the merged map into a typed object: no
    directive keys (no pod field starts with ``$``) and no ``null`` values."""
    return {k: _decoded(v) for k, v in value.items() if not k.startswith("$") and v is not None}


def _decoded(value: Any) -> Any:
    if isinstance(value, dict):
        return _decoded_map(value)
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value
