"""The local cache a reflector fills: key "namespace/name" -> the object as a plain dict.

Readers get the stored dict itself, not a copy (copies of thousands of objects per resync
would dominate CPU and memory): treat everything a store returns as read-only and
``copy.deepcopy`` before changing it. The reflector replaces objects, never mutates them.

A store may index its objects by the name of the object they belong to, in the same
namespace (``owner_of``; controller-runtime's field indexer), so a reconciler finds, say, a
parent's children without scanning. What "belongs to" means is the caller's: the runtime
knows no kind.

Objects are slimmed on ingest (``slim``): ``metadata.managedFields`` and kubectl's
last-applied annotation are dropped — nothing in pkobatch reads them and they are often
the larger half of an object.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from pkobatch.api.objects import JSON
from pkobatch.runtime.interfaces import ObjectKey

OwnerOf = Callable[[JSON], str | None]
"""The name of the object ``obj`` belongs to (same namespace); None: it belongs to none."""
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


def object_key(obj: JSON) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return ObjectKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


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
    """Thread-safe map of objects, indexed by owner when ``owner_of`` is given."""

    def __init__(self, owner_of: OwnerOf | None = None) -> None:
        self._owner_of = owner_of
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, JSON] = {}
        self._owner: dict[ObjectKey, ObjectKey] = {}
        self._by_owner: dict[ObjectKey, dict[ObjectKey, JSON]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def get(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            return self._objects.get(ObjectKey(namespace, name))

    def list_keys(self) -> list[ObjectKey]:
        with self._lock:
            return list(self._objects)

    def list_objects(self) -> list[JSON]:
        with self._lock:
            return list(self._objects.values())

    def for_owner(self, namespace: str, owner_name: str) -> list[JSON]:
        """Objects that belong to ``namespace/owner_name`` (by ``owner_of``)."""
        with self._lock:
            return list(self._by_owner.get(ObjectKey(namespace, owner_name), {}).values())

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

    def _index(self, key: ObjectKey, obj: JSON) -> None:
        owner_name = self._owner_of(obj) if self._owner_of else None
        if owner_name:
            owner = ObjectKey(key.namespace, owner_name)
            self._owner[key] = owner
            self._by_owner.setdefault(owner, {})[key] = obj

    def _unindex(self, key: ObjectKey) -> None:
        owner = self._owner.pop(key, None)
        if owner is not None:
            members = self._by_owner[owner]
            members.pop(key, None)
            if not members:
                del self._by_owner[owner]


def _resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
