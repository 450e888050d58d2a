"""The run cache: one PersistentVolumeClaim per namespace, mounted into the runs of that
namespace at ``PKOBATCH_CACHE_DIR`` (``Settings.run_cache``; docs/operations.md#run-cache).

Pure: the claim's manifest, whether an observed claim may be mounted now, and the pod edit.
The controller creates the claim (``controller.act``) the first time a run of a namespace
wants it, and reads it afterwards from its watch (``Stores.run_caches``), so a run costs no
API call for its cache.

One claim per namespace, never shared across namespaces: a run writes plugins and
virtualenvs that later runs execute, so one tenant must not be able to plant them for
another.

A cache is an optimisation, never a reason for a run to fail or wait: a claim that is
missing, not ``Bound``, being deleted or lost (or, with ``ReadWriteOnce``, mounted by another
active run of the namespace) gives the run an ``emptyDir`` at the same path and the Stack a
Warning Event saying why (``CacheChoice.warning``).

``ReadWriteOnce``: a volume attached to one node cannot be mounted by a pod on another, and
the scheduler does not place pods next to a volume another pod uses, so a second run on
another node would wait for the attachment. The controller therefore mounts such a cache
into at most one active run of the namespace (as its Job store shows them); the others run
with an ``emptyDir``, without a warning (this is the mode's normal case). A run that follows
a finished one mounts the volume again wherever it lands: a terminated pod does not keep
its volume attached.

A Stack keeps its own cache by setting ``PKOBATCH_CACHE_DIR`` in its run container's
environment (``spec.workspaceTemplate.spec.env`` or a pod template) or mounting a volume at
the cache path: the controller then leaves its pod alone (the per-Stack opt-out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pkobatch.api.constants import MANAGED_BY_LABEL, MANAGED_BY_VALUE, PREFIX
from pkobatch.api.objects import JSON, job_finished
from pkobatch.api.quantity import parse_quantity
from pkobatch.api.run import CACHE_DIR_ENV, CACHE_MAX_BYTES_ENV
from pkobatch.config import RunCacheSettings
from pkobatch.controller.run_pod import with_named

# The label of the claims the controller creates (its watch selects them).
RUN_CACHE_LABEL: Final = f"{PREFIX}/run-cache"
# On a Job whose pod mounts the cache claim: the claim's name.
RUN_CACHE_ANNOTATION: Final = f"{PREFIX}/run-cache"
RUN_CACHE_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{RUN_CACHE_LABEL}=true"
CACHE_VOLUME: Final = "pkobatch-cache"
EVENT_RUN_CACHE_UNAVAILABLE: Final = "RunCacheUnavailable"
READ_WRITE_MANY: Final = "ReadWriteMany"
PRUNE_AT_PERCENT: Final = 80


@dataclass(frozen=True)
class CacheChoice:
    """What a run's pod gets at the cache path: the claim (``claim`` set) or an emptyDir,
    and why not the claim when that is worth a warning ("" when not)."""

    path: str
    claim: str | None
    warning: str = ""
    # The claim does not exist: the controller creates it with this run.
    create_claim: bool = False
    # With the claim: the size the runner prunes the cache down to (PKOBATCH_CACHE_MAX_BYTES).
    prune_to_bytes: int | None = None


def cache_claim(namespace: str, settings: RunCacheSettings) -> JSON:
    """The namespace's cache claim, as the controller creates it."""
    spec: JSON = {
        "accessModes": [settings.access_mode],
        "resources": {"requests": {"storage": settings.size}},
    }
    if settings.storage_class is not None:
        spec["storageClassName"] = settings.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": settings.claim_name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, RUN_CACHE_LABEL: "true"},
        },
        "spec": spec,
    }


def mounts_claim(job: Mapping[str, Any], claim: str) -> bool:
    """Whether ``job``'s pod mounts the cache claim ``claim`` (its annotation says so: the
    controller's Job cache keeps no pod template)."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    return annotations.get(RUN_CACHE_ANNOTATION) == claim


def mounts_cache(job: Mapping[str, Any]) -> bool:
    """Whether the controller gave ``job``'s pod a run cache (the claim or an emptyDir)."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(volume.get("name") == CACHE_VOLUME for volume in pod_spec.get("volumes") or [])


def claim_in_use(jobs: Iterable[Mapping[str, Any]], namespace: str, claim: str) -> bool:
    """Whether an active Job of ``namespace`` mounts ``claim`` (``jobs``: any Jobs)."""
    return any(
        (job.get("metadata") or {}).get("namespace") == namespace
        and not job_finished(job)
        and mounts_claim(job, claim)
        for job in jobs
    )


def choose_cache(
    claim: Mapping[str, Any] | None, settings: RunCacheSettings, in_use: bool
) -> CacheChoice:
    """The cache of the next run of a namespace whose observed claim is ``claim`` (None: it
    does not exist); ``in_use``: an active run of the namespace mounts it."""
    name, path = settings.claim_name, settings.path
    fallback = "this run uses an emptyDir (nothing is kept)"
    if claim is None:
        return CacheChoice(
            path,
            None,
            f"run cache PersistentVolumeClaim {name} did not exist: the controller creates it "
            f"now; {fallback}",
            create_claim=True,
        )
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    phase = status.get("phase") or "Pending"
    if meta.get("deletionTimestamp"):
        return CacheChoice(
            path,
            None,
            f"run cache PersistentVolumeClaim {name} is being deleted; {fallback}; once it is "
            "gone the controller creates it again",
        )
    if phase != "Bound":
        return CacheChoice(
            path,
            None,
            f"run cache PersistentVolumeClaim {name} is {phase}{_unbound_hint(phase)}; {fallback}",
        )
    if in_use and READ_WRITE_MANY not in (status.get("accessModes") or []):
        return CacheChoice(path, None)
    return CacheChoice(path, name, prune_to_bytes=prune_bound(claim, settings))


def prune_bound(claim: Mapping[str, Any], settings: RunCacheSettings) -> int:
    """What the runner prunes the claim's cache down to: 80% of the volume's capacity (its
    status, else the size asked for), so pruning starts well before the volume is full
    (a full one makes runs uncached)."""
    capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
    try:
        size = parse_quantity(str(capacity)) if capacity else parse_quantity(settings.size)
    except ValueError:
        size = parse_quantity(settings.size)
    return size * PRUNE_AT_PERCENT // 100


def _unbound_hint(phase: str) -> str:
    if phase == "Lost":
        return (
            " (its volume is gone): delete it and the controller creates a new one "
            "(the cache starts empty)"
        )
    return (
        " (not bound to a volume yet): check its Events (kubectl describe pvc); a storage "
        "class with volumeBindingMode WaitForFirstConsumer never binds it, as the controller "
        "mounts only a Bound claim: set PKOBATCH_RUN_CACHE__STORAGE_CLASS to a class that binds "
        "Immediately, or provision a volume for it"
    )


def stack_keeps_own_cache(runner: Mapping[str, Any], path: str) -> bool:
    """Whether the Stack's templates set the run's cache themselves (the opt-out)."""
    if any(e.get("name") == CACHE_DIR_ENV for e in runner.get("env") or []):
        return True
    return any(
        str(m.get("mountPath", "")).rstrip("/") == path.rstrip("/")
        for m in runner.get("volumeMounts") or []
    )


def mount_cache(job: JSON, pod_spec: JSON, runner: JSON, choice: CacheChoice) -> None:
    """Mount the chosen cache (the claim, or an emptyDir) at its path in ``job``'s run
    container and point ``PKOBATCH_CACHE_DIR`` at it, unless the Stack keeps its own cache."""
    path = choice.path
    if stack_keeps_own_cache(runner, path):
        return
    source: JSON = (
        {"persistentVolumeClaim": {"claimName": choice.claim}}
        if choice.claim is not None
        else {"emptyDir": {}}
    )
    pod_spec["volumes"] = with_named(pod_spec.get("volumes"), {"name": CACHE_VOLUME, **source})
    runner["volumeMounts"] = with_named(
        runner.get("volumeMounts"), {"name": CACHE_VOLUME, "mountPath": path}
    )
    env = [*(runner.get("env") or []), {"name": CACHE_DIR_ENV, "value": path}]
    if choice.prune_to_bytes is not None and not any(
        e.get("name") == CACHE_MAX_BYTES_ENV for e in env
    ):
        env.append({"name": CACHE_MAX_BYTES_ENV, "value": str(choice.prune_to_bytes)})
    runner["env"] = env
    if choice.claim is not None:
        metadata = job.setdefault("metadata", {})
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            RUN_CACHE_ANNOTATION: choice.claim,
        }
