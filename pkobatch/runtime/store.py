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

A store may keep the objects its owner rarely reads again packed (``Packing``): as JSON
compressed with a preset dictionary (raw deflate, ``zdict``), decoded again on each read.
A small JSON document held as Python dicts and strings takes several times its text, and
every dict is one more object for each full garbage collection to walk; the same document
deflated against a dictionary holding its keys and usual values is a fraction of its text
(under a third for a finished Job or result: ``tests/unit/test_controller_cache.py``) and is
no object to the collector. Packing suits objects that stop changing and are read only now
and then (a finished Job, a run's result): each read decodes them again. Readers cannot
tell: every read returns a dict (a fresh one for a packed object); ``list_unpacked`` lists
only the objects kept as dicts, for callers that want exactly those without decoding the
rest.
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from pkobatch.api.objects import JSON
from pkobatch.runtime.interfaces import ObjectKey

OwnerOf = Callable[[JSON], str | None]
"""The name of the object ``obj`` belongs to (same namespace); None: it belongs to none."""
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"
# Raw deflate (no header or checksum: the bytes never leave the process), whole window.
_DEFLATE_WINDOW_BITS = -15


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


@dataclass(frozen=True)
class Packing:
    """Which objects a store keeps packed, and the preset dictionary they are deflated
    against: text that objects of this kind usually contain (keys, labels, fixed values)."""

    selects: Callable[[JSON], bool]
    dictionary: bytes = b""

    def pack(self, obj: JSON) -> bytes:
        text = json.dumps(obj, separators=(",", ":")).encode()
        deflate = zlib.compressobj(
            zlib.Z_BEST_COMPRESSION,
            zlib.DEFLATED,
            _DEFLATE_WINDOW_BITS,
            zlib.DEF_MEM_LEVEL,
            zlib.Z_DEFAULT_STRATEGY,
            self.dictionary,
        )
        return deflate.compress(text) + deflate.flush()

    def unpack(self, packed: bytes) -> JSON:
        inflate = zlib.decompressobj(_DEFLATE_WINDOW_BITS, zdict=self.dictionary)
        obj: JSON = json.loads(inflate.decompress(packed) + inflate.flush())
        return obj


Stored = JSON | bytes
"""An object as a store keeps it: a dict, or packed bytes."""


@dataclass(frozen=True, slots=True)
class Entry:
    """An object ready for a store: its key, its owner's key, its resource version and the
    form the store keeps (``Store.entry``)."""

    key: ObjectKey
    owner: ObjectKey | None
    resource_version: str
    stored: Stored


class Store:
    """Thread-safe map of objects, indexed by owner when ``owner_of`` is given, keeping
    the objects ``packing`` selects packed."""

    def __init__(self, owner_of: OwnerOf | None = None, packing: Packing | None = None) -> None:
        self._owner_of = owner_of
        self._packing = packing
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, Stored] = {}
        self._by_owner: dict[ObjectKey, dict[ObjectKey, Stored]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def get(self, namespace: str, name: str) -> JSON | None:
        with self._lock:
            stored = self._objects.get(ObjectKey(namespace, name))
        return None if stored is None else self._read(stored)

    def list_objects(self) -> list[JSON]:
        with self._lock:
            stored = list(self._objects.values())
        return [self._read(item) for item in stored]

    def list_unpacked(self) -> list[JSON]:
        """The objects kept as dicts: all but those ``packing`` selects."""
        with self._lock:
            return [item for item in self._objects.values() if isinstance(item, dict)]

    def for_owner(self, namespace: str, owner_name: str) -> list[JSON]:
        """Objects that belong to ``namespace/owner_name`` (by ``owner_of``)."""
        with self._lock:
            stored = list(self._by_owner.get(ObjectKey(namespace, owner_name), {}).values())
        return [self._read(item) for item in stored]

    def entry(self, obj: JSON) -> Entry:
        """``obj`` made ready to store (packed if selected): what ``replace`` takes, so a
        list being read page by page never holds every object unpacked at once."""
        key = object_key(obj)
        packing = self._packing
        stored = packing.pack(obj) if packing is not None and packing.selects(obj) else obj
        return Entry(key, self._owner_key(key, obj), _resource_version(obj), stored)

    def upsert(self, obj: JSON) -> JSON | None:
        """Store ``obj``; returns the object it replaced."""
        entry = self.entry(obj)
        with self._lock:
            old = self._forget(entry.key)
            self._add(entry)
        return old

    def delete(self, obj: JSON) -> JSON | None:
        """Forget ``obj``; returns what was stored under its key."""
        with self._lock:
            return self._forget(object_key(obj))

    def replace(
        self, entries: Iterable[Entry], namespace: str | None = None
    ) -> tuple[Iterator[tuple[JSON | None, JSON]], list[JSON]]:
        """Make the store hold exactly ``entries`` (within ``namespace`` when given).

        Returns (changed, deleted): (old, new) pairs for objects that are new or have a new
        resourceVersion — decoded one at a time as they are iterated — and the objects that
        disappeared.
        """
        fresh = {entry.key: entry for entry in entries}
        changed: list[tuple[JSON | None, Stored]] = []
        deleted: list[JSON] = []
        with self._lock:
            scope = [k for k in self._objects if namespace is None or k.namespace == namespace]
            for key in scope:
                if key not in fresh:
                    gone = self._forget(key)
                    if gone is not None:
                        deleted.append(gone)
            for key, entry in fresh.items():
                before = self._objects.get(key)
                if isinstance(before, bytes) and before == entry.stored:
                    continue  # packed alike: the same object, indexed already
                old = self._forget(key)
                if old is None or _resource_version(old) != entry.resource_version:
                    changed.append((old, entry.stored))
                self._add(entry)
        return ((old, self._read(new)) for old, new in changed), deleted

    def _read(self, stored: Stored) -> JSON:
        if isinstance(stored, dict):
            return stored
        assert self._packing is not None, "only a store with packing holds packed objects"
        return self._packing.unpack(stored)

    def _owner_key(self, key: ObjectKey, obj: JSON) -> ObjectKey | None:
        owner_name = self._owner_of(obj) if self._owner_of else None
        return ObjectKey(key.namespace, owner_name) if owner_name else None

    def _add(self, entry: Entry) -> None:
        self._objects[entry.key] = entry.stored
        if entry.owner is not None:
            self._by_owner.setdefault(entry.owner, {})[entry.key] = entry.stored

    def _forget(self, key: ObjectKey) -> JSON | None:
        """Remove ``key`` and its index entry (its owner found again from the object: no
        per-object record of owners); returns the object it held."""
        stored = self._objects.pop(key, None)
        if stored is None:
            return None
        old = self._read(stored)
        owner = self._owner_key(key, old)
        if owner is not None:
            members = self._by_owner.get(owner, {})
            members.pop(key, None)
            if not members:
                self._by_owner.pop(owner, None)
        return old


def _resource_version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))
