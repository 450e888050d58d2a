"""What the Stack controller watches, and which Stack each watched object wakes.

The runtime knows no kind: it fills the ``Store``s below and calls the map functions here
(controller-runtime's map functions) to turn an object's change into the keys of the Stacks
to reconcile.

A Job or result ConfigMap belongs to the Stack named by, in order: the
``pkobatch.io/stack-name`` annotation (present when the name is too long for a label), the
controlling ownerReference of kind Stack, the ``pkobatch.io/stack`` label
(``stack_name_of``). The stores of Jobs and ConfigMaps are indexed by it, so the reconciler
finds a Stack's own objects without scanning (``jobs.for_owner(namespace, stack_name)``).

Finished Jobs and the ConfigMaps (a run's result and inputs, written once) do not change
again and are read only when their Stack reconciles, yet with a few runs of history they
are most of what the controller caches: their stores keep them packed (``SETTLED_RUNS``,
deflated against ``pkobatch.controller.cache_transforms.PACKING_DICTIONARY``).
``jobs.list_unpacked()`` lists the Jobs still running without decoding the finished ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol

from pkobatch.api.constants import (
    FLUX_SOURCE_GROUP,
    FLUX_SOURCE_VERSION,
    KIND,
    STACK_LABEL,
    STACK_NAME_ANNOTATION,
)
from pkobatch.api.objects import JSON, job_finished
from pkobatch.controller.cache_transforms import PACKING_DICTIONARY
from pkobatch.kube.client import Resource
from pkobatch.runtime.interfaces import MapFunc, ObjectKey
from pkobatch.runtime.on_demand_watches import Lookup
from pkobatch.runtime.store import Packing, Store

StackKey = ObjectKey
"""The key of a Stack: its namespace and name."""


class ProgramKey(ObjectKey):
    """The key of a Program whose ``status.artifact`` is kept: one work queue serves both
    kinds, and a ``ProgramKey`` never equals the ``StackKey`` of a Stack of the same name."""


class WorkspaceKey(ObjectKey):
    """The key of a PKO Workspace (its status, ``controller.auto_runs``)."""


class UpdateKey(ObjectKey):
    """The key of a PKO Update (its Job and status, ``controller.auto_runs``)."""


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


def settled(obj: JSON) -> bool:
    """Whether a watched Job or ConfigMap will not change again: a finished Job, or a
    ConfigMap (the stores keep these packed)."""
    return obj.get("kind") == "ConfigMap" or job_finished(obj)


SETTLED_RUNS: Final = Packing(settled, PACKING_DICTIONARY)


class FluxSources(Protocol):
    """The Flux sources Stacks name, from watches started on first use and stopped when no
    Stack needs them (``pkobatch.runtime.on_demand_watches``)."""

    def lookup(self, resource: Resource, namespace: str, name: str, user: StackKey) -> Lookup: ...

    def release(self, user: StackKey) -> None: ...


def flux_source_resource(kind: str) -> Resource:
    """The resource of a ``spec.fluxSource.sourceRef`` kind (any Flux kind with an artifact)
    at the version the controller reads Flux sources at, the plural as Kubernetes code
    generators form it."""
    lower = kind.lower()
    plural = (
        lower[:-1] + "ies"
        if lower.endswith("y")
        else lower + ("es" if lower.endswith("s") else "s")
    )
    return Resource(FLUX_SOURCE_GROUP, FLUX_SOURCE_VERSION, plural, kind)


@dataclass
class Stores:
    """The watched objects: Stacks, the Jobs and ConfigMaps labelled managed-by pkobatch
    (indexed by Stack), the Programs Stacks may name in ``spec.programRef`` and the run cache
    claims."""

    stacks: Store
    jobs: Store
    configmaps: Store
    programs: Store
    # PKO's Workspaces and Updates (``controller.auto_objects``).
    workspaces: Store
    updates: Store
    # The run cache claims the controller created, one per namespace (``controller.run_cache``);
    # empty while the run cache is disabled.
    run_caches: Store = field(default_factory=Store)
    # None: Flux sources are not watched (a reconciler built without the Manager).
    flux_sources: FluxSources | None = None

    @classmethod
    def empty(cls) -> Stores:
        return cls(
            stacks=Store(),
            jobs=Store(owner_of=stack_name_of, packing=SETTLED_RUNS),
            configmaps=Store(owner_of=stack_name_of, packing=SETTLED_RUNS),
            programs=Store(),
            workspaces=Store(),
            updates=Store(),
        )


def no_stack(obj: JSON) -> Iterator[StackKey]:
    """A run cache claim's event wakes no Stack: the next run reads the claim as it is then."""
    yield from ()


def _namespace_and_name(obj: JSON) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def the_stack(obj: JSON) -> Iterator[StackKey]:
    """A Stack's event wakes that Stack."""
    yield StackKey(*_namespace_and_name(obj))


def owning_stack(stacks: Store) -> MapFunc:
    """A Job's or ConfigMap's event wakes the Stack it belongs to, if this controller has that
    Stack (objects of Stacks outside its namespaces or label selector are ignored)."""

    def keys(obj: JSON) -> Iterator[StackKey]:
        stack_name = stack_name_of(obj)
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        if stack_name and stacks.get(namespace, stack_name) is not None:
            yield StackKey(namespace, stack_name)

    return keys


def owning_stack_or_update(stacks: Store, updates: Store) -> MapFunc:
    """A Job's or ConfigMap's event wakes its Stack (``owning_stack``), or the Update of its
    name: an Update's Job and result carry the Update's name where a Stack's carry the
    Stack's; whose they are is checked by UID when they are read."""
    of_stack = owning_stack(stacks)

    def keys(obj: JSON) -> Iterator[ObjectKey]:
        yield from of_stack(obj)
        name = stack_name_of(obj)
        namespace = str((obj.get("metadata") or {}).get("namespace", ""))
        if name and updates.get(namespace, name) is not None:
            yield UpdateKey(namespace, name)

    return keys


def the_workspace_and_its_updates(updates: Store) -> MapFunc:
    """A Workspace's event wakes it (its status) and the Updates that name it."""

    def keys(workspace: JSON) -> Iterator[ObjectKey]:
        namespace, name = _namespace_and_name(workspace)
        yield WorkspaceKey(namespace, name)
        for update in updates.list_objects():
            meta = update.get("metadata") or {}
            if (
                meta.get("namespace") == namespace
                and (update.get("spec") or {}).get("workspaceName") == name
            ):
                yield UpdateKey(namespace, str(meta.get("name", "")))

    return keys


def the_update(obj: JSON) -> Iterator[ObjectKey]:
    yield UpdateKey(*_namespace_and_name(obj))


def stacks_naming_program(stacks: Store) -> MapFunc:
    """A Program's event wakes every Stack of its namespace that names it in
    ``spec.programRef``."""

    def keys(program: JSON) -> Iterator[StackKey]:
        namespace, name = _namespace_and_name(program)
        for stack in stacks.list_objects():
            stack_meta = stack.get("metadata") or {}
            reference = (stack.get("spec") or {}).get("programRef") or {}
            if (
                stack_meta.get("namespace") == namespace
                and isinstance(reference, dict)
                and reference.get("name") == name
            ):
                yield StackKey(namespace, str(stack_meta.get("name", "")))

    return keys


def program_and_stacks_naming_it(stacks: Store) -> MapFunc:
    """A Program's event wakes the Program itself (its ``status.artifact``) and the Stacks
    that name it (``stacks_naming_program``)."""
    stacks_of = stacks_naming_program(stacks)

    def keys(program: JSON) -> Iterator[ObjectKey]:
        yield ProgramKey(*_namespace_and_name(program))
        yield from stacks_of(program)

    return keys


def stacks_naming_flux_source(stacks: Store) -> Callable[[Resource], MapFunc]:
    """For a Flux kind: a source's event wakes the Stacks of its namespace whose
    ``spec.fluxSource.sourceRef`` names it (any version of its API group)."""

    def for_kind(resource: Resource) -> MapFunc:
        def keys(source: JSON) -> Iterator[StackKey]:
            meta = source.get("metadata") or {}
            namespace, name = meta.get("namespace"), meta.get("name")
            for stack in stacks.list_objects():
                stack_meta = stack.get("metadata") or {}
                ref = ((stack.get("spec") or {}).get("fluxSource") or {}).get("sourceRef") or {}
                if (
                    stack_meta.get("namespace") == namespace
                    and ref.get("kind") == resource.kind
                    and ref.get("name") == name
                    and str(ref.get("apiVersion") or "").rpartition("/")[0] == resource.group
                ):
                    yield StackKey(str(namespace), str(stack_meta.get("name")))

        return keys

    return for_kind
