"""The local cache a reflector fills: key "namespace/name" -> the object as a plain dict.

Readers get the stored dict itself, not a copy (copies of thousands of Stacks per resync
would dominate CPU and memory): treat everything a store returns as read-only and
``copy.deepcopy`` before changing it. The reflector replaces objects, never mutates them.

Each object is also indexed by the Stack it belongs to, (namespace, stack name), so the
reconciler finds a Stack's Jobs and result ConfigMaps without scanning. The Stack name is
taken from, in order: the ``pkobatch.io/stack-name`` annotation (present when the name is too
long for a label), the controlling ownerReference of kind Stack, the ``pkobatch.io/stack``
label. Stacks index under their own name.

Objects are slimmed on ingest (``slim``): ``metadata.managedFields`` and kubectl's
last-applied annotation are dropped — nothing in pkobatch reads them and they are often
the larger half of an object.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from pkobatch.api.constants import KIND, STACK_LABEL, STACK_NAME_ANNOTATION
from pkobatch.runtime.interfaces import StackKey

JSON = dict[str, Any]
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def object_key(obj: JSON) -> StackKey:
    meta = obj.get("metadata") or {}
    return StackKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def stack_name_of(obj: JSON) -> str | None:
    """The name of the Stack ``obj`` belongs to (itself, for a Stack); None when unknown."""
    meta = obj.get("metadata") or {}
    if obj.get("kind") == KIND and str(obj.get("apiVersion", "")).startswith("pulumi.com/"):
        return str(meta.get("name") or "") or None
    annotations = meta.get("annotations") or {}
    if annotations.get(STACK_NAME_ANNOTATION):
        return str(annotations[STACK_NAME_ANNOTATION])
    for owner in meta.get("ownerReferences") or ():
        if (
            owner.get("controller")
            and owner.get("kind") == KIND
            and owner.get("apiVersion", "").startswith("pulumi.com/")
        ):
            return str(owner.get("name") or "") or None
    label = (meta.get("labels") or {}).get(STACK_LABEL)
    return str(label) if label else None


def slim(obj: JSON) -> JSON:
    """Drop the metadata nothing in pkobatch reads (in place; returns ``obj``)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if annotations and LAST_APPLIED_ANNOTATION in annotations:
            annotations.pop(LAST_APPLIED_ANNOTATION)
    return obj


class Store:
    """Thread-safe map of objects with a by-Stack index."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[StackKey, JSON] = {}
        self._stack_of: dict[StackKey, StackKey] = {}
        self._by_stack: dict[StackKey, dict[StackKey, JSON]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def get(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            return self._objects.get(StackKey(namespace, name))

    def list_keys(self) -> list[StackKey]:
        with self._lock:
            return list(self._objects)

    def list_objects(self) -> list[JSON]:
        with self._lock:
            return list(self._objects.values())

    def for_stack(self, namespace: str, stack_name: str) -> list[JSON]:
        """Objects belonging to the Stack ``namespace/stack_name`` (for Stacks: itself)."""
        with self._lock:
            return list(self._by_stack.get(StackKey(namespace, stack_name), {}).values())

    def upsert(self, obj: JSON) -> JSON | None:
        """Store ``obj``; returns the object it replaced."""
        key = object_key(obj)
        with self._lock:
            old = self._objects.get(key)
            self._unindex(key)
            self._objects[key] = obj
            self._index(key, obj)
            return old

    def delete(self, obj: JSON) -> JSON | None:
        """Forget ``obj``; returns what was stored under its key."""
        key = object_key(obj)
        with self._lock:
            self._unindex(key)
            return self._objects.pop(key, None)

    def replace(
        self, objects: Iterable[JSON], namespace: str | None = None
    ) -> tuple[list[tuple[JSON | None, JSON]], list[JSON]]:
        """Make the store hold exactly ``objects`` (within ``namespace`` when given).

        Returns (changed, deleted): (old, new) pairs for objects that are new or have a new
        resourceVersion, and the objects that disappeared.
        """
        fresh = {object_key(obj): obj for obj in objects}
        changed: list[tuple[JSON | None, JSON]] = []
        deleted: list[JSON] = []
        with self._lock:
            scope = [k for k in self._objects if namespace is None or k.namespace == namespace]
            for key in scope:
                if key not in fresh:
                    self._unindex(key)
                    deleted.append(self._objects.pop(key))
            for key, obj in fresh.items():
                old = self._objects.get(key)
                if old is None or _resource_version(old) != _resource_version(obj):
                    changed.append((old, obj))
                self._unindex(key)
                self._objects[key] = obj
                self._index(key, obj)
        return changed, deleted

    def _index(self, key: StackKey, obj: JSON) -> None:
        stack_name = stack_name_of(obj)
        if stack_name:
            stack = StackKey(key.namespace, stack_name)
            self._stack_of[key] = stack
            self._by_stack.setdefault(stack, {})[key] = obj

    def _unindex(self, key: StackKey) -> None:
        stack = self._stack_of.pop(key, None)
        if stack is not None:
            members = self._by_stack[stack]
            members.pop(key, None)
            if not members:
                del self._by_stack[stack]


def _resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
