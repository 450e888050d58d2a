"""The run cache against the real control plane: the controller (under exactly the RBAC of
deploy/kustomize/base) creates one cache claim per namespace with the settings, mounts a
Bound claim into the runs of that namespace, gives runs an emptyDir and the Stack a Warning
Event while the claim is missing, Pending or being deleted, and changes nothing when the
cache is disabled.

This control plane runs no PersistentVolume binder (its kube-controller-manager runs only
the controllers of ``pkobatch.dev.controlplane.CONTROLLERS``), so a claim stays Pending until
the test writes its status as the binder would; the real binder and kubelet are in
tests/node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    delete_namespace,
    request_reconcile,
    stack_jobs,
    wait_events,
)

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    NAMESPACES,
    PERSISTENTVOLUMECLAIMS,
    SERVICEACCOUNTS,
    Kube,
)

JSON = dict[str, Any]
CLAIM = "pkobatch-run-cache"
CACHE_VOLUME = "pkobatch-cache"
CACHE_SETTINGS = {
    "PKOBATCH_RUN_CACHE__ENABLED": "true",
    "PKOBATCH_RUN_CACHE__STORAGE_CLASS": "shared-files",
    "PKOBATCH_RUN_CACHE__SIZE": "3Gi",
}


@pytest.fixture
def second_namespace(kube: Kube, namespace: str) -> Iterator[str]:
    """Another tenant namespace, with the runner's ServiceAccount and binding."""
    name = f"{namespace[:56]}-b"
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "pkobatch-runner"}},
        name,
    )
    bind_runner(kube, name)
    yield name
    delete_namespace(kube, name)


def start_controller(
    cluster: Any, namespaces: str, work_dir: Path, env: dict[str, str]
) -> ControllerProcess:
    process = ControllerProcess(cluster, namespaces, work_dir, env=env)
    process.start()
    return process


def cache_volume(job: JSON) -> JSON | None:
    volumes = job["spec"]["template"]["spec"].get("volumes") or []
    return next((v for v in volumes if v["name"] == CACHE_VOLUME), None)


def cache_dir(job: JSON) -> list[str]:
    (runner,) = [c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "pulumi"]
    mounts = [m["mountPath"] for m in runner.get("volumeMounts") or [] if m["name"] == CACHE_VOLUME]
    env = [e["value"] for e in runner.get("env") or [] if e["name"] == "PKOBATCH_CACHE_DIR"]
    return [*mounts, *env]


def wait_job(kube: Kube, namespace: str, stack: str, predicate: Any, what: str) -> JSON:
    found: list[JSON] = []

    def check() -> bool:
        found[:] = [j for j in stack_jobs(kube, namespace, stack) if predicate(j)]
        return bool(found)

    wait_until(check, timeout=120, what=what)
    return found[-1]


def bind(kube: Kube, namespace: str) -> None:
    """What the PersistentVolume binder writes once it has bound the claim."""
    kube.merge_patch(
        PERSISTENTVOLUMECLAIMS,
        CLAIM,
        {"status": {"phase": "Bound", "accessModes": ["ReadWriteMany"]}},
        namespace,
        subresource="status",
    )


def cache_warnings(kube: Kube, namespace: str, text: str) -> list[JSON]:
    return wait_events(
        kube,
        namespace,
        lambda e: e["reason"] == "RunCacheUnavailable" and text in e["note"],
        timeout=60,
        what=f"a RunCacheUnavailable Event saying {text!r}",
    )


def test_each_namespace_gets_its_claim_and_runs_mount_it_once_bound(
    cluster: Any,
    kube: Kube,
    namespace: str,
    second_namespace: str,
    tmp_path: Path,
    controller_rbac: None,
) -> None:
    bind_runner(kube, namespace)
    controller = start_controller(
        cluster, f"{namespace},{second_namespace}", tmp_path / "controller", CACHE_SETTINGS
    )
    try:
        for tenant in (namespace, second_namespace):
            apply_stack(kube, tenant, "app", {"stack": "dev"})
        for tenant in (namespace, second_namespace):
            # The first run of a namespace: no claim yet, so an emptyDir and a Warning.
            first = wait_job(kube, tenant, "app", lambda j: True, f"the first Job in {tenant}")
            assert cache_volume(first) == {"name": CACHE_VOLUME, "emptyDir": {}}
            assert cache_dir(first) == ["/var/cache/pkobatch", "/var/cache/pkobatch"]
            cache_warnings(kube, tenant, "did not exist")
            wait_until(
                lambda t=tenant: kube.get_or_none(PERSISTENTVOLUMECLAIMS, CLAIM, t) is not None,
                timeout=60,
                what=f"the cache claim in {tenant}",
            )
            claim = kube.get(PERSISTENTVOLUMECLAIMS, CLAIM, tenant)
            assert claim["spec"]["storageClassName"] == "shared-files"
            assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
            assert claim["spec"]["resources"]["requests"]["storage"] == "3Gi"
            assert claim["metadata"]["labels"]["pkobatch.io/run-cache"] == "true"
            claims, _ = kube.list_objects(PERSISTENTVOLUMECLAIMS, tenant)
            assert [c["metadata"]["name"] for c in claims] == [CLAIM]

        # Pending (nothing binds it here): the next run still gets an emptyDir, and says why.
        request_reconcile(kube, namespace, "app", "pending")
        cache_warnings(kube, namespace, "is Pending")

        for tenant in (namespace, second_namespace):
            bind(kube, tenant)
            request_reconcile(kube, tenant, "app", "bound")
            mounted = wait_job(
                kube,
                tenant,
                "app",
                lambda j: (cache_volume(j) or {}).get("persistentVolumeClaim") is not None,
                f"a Job in {tenant} mounting the claim",
            )
            # Each namespace's runs mount that namespace's own claim.
            assert mounted["metadata"]["namespace"] == tenant
            assert cache_volume(mounted) == {
                "name": CACHE_VOLUME,
                "persistentVolumeClaim": {"claimName": CLAIM},
            }
            assert cache_dir(mounted) == ["/var/cache/pkobatch", "/var/cache/pkobatch"]

        # Being deleted (the pvc-protection finalizer holds it): an emptyDir and a Warning.
        kube.delete(PERSISTENTVOLUMECLAIMS, CLAIM, namespace)
        request_reconcile(kube, namespace, "app", "deleting")
        cache_warnings(kube, namespace, "is being deleted")
        last = stack_jobs(kube, namespace, "app")[-1]
        assert cache_volume(last) == {"name": CACHE_VOLUME, "emptyDir": {}}
    finally:
        controller.stop()


def test_disabled_cache_leaves_jobs_unchanged_and_creates_no_claim(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path, controller_rbac: None
) -> None:
    bind_runner(kube, namespace)
    controller = start_controller(cluster, namespace, tmp_path / "controller", {})
    try:
        apply_stack(kube, namespace, "app", {"stack": "dev"})
        job = wait_job(kube, namespace, "app", lambda j: True, "the Stack's Job")
        assert cache_volume(job) is None
        assert cache_dir(job) == []
        assert "pkobatch.io/run-cache" not in job["metadata"]["annotations"]
        controller.caught_up()
        claims, _ = kube.list_objects(PERSISTENTVOLUMECLAIMS, namespace)
        assert claims == []
    finally:
        controller.stop()
