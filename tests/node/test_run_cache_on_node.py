"""The run cache on a real node (kubelet, containerd, the PersistentVolume binder): the
claim the controller creates binds to a statically provisioned hostPath PersistentVolume,
the kubelet mounts it into the runs at ``PKOBATCH_CACHE_DIR``, and what one run leaves there
(its Pulumi home, where plugins are kept) is on the volume when the next run, of another
Stack of the namespace, mounts it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import yaml_stack
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    last_update,
    ready,
    request_reconcile,
    stack_jobs,
    wait_events,
    wait_stack,
)
from helpers.host_path_volume import host_path_volume

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import PERSISTENTVOLUMECLAIMS, PERSISTENTVOLUMES, PODS

JSON = dict[str, Any]
CLAIM = "pkobatch-run-cache"


@pytest.fixture
def node_controller_settings() -> dict[str, str]:
    # No class, and no more than the PersistentVolume below (1Gi) holds: the claim binds to
    # that volume, which names it.
    return {
        "PKOBATCH_RUN_CACHE__ENABLED": "true",
        "PKOBATCH_RUN_CACHE__STORAGE_CLASS": "",
        "PKOBATCH_RUN_CACHE__SIZE": "1Gi",
    }


@pytest.fixture
def cache_dir(node_cluster: Cluster, node_namespace: str, tmp_path: Path) -> Iterator[Path]:
    """A hostPath PersistentVolume reserved for the namespace's cache claim; its directory."""
    kube = node_cluster.kube
    host_dir = tmp_path / "run-cache"
    name = f"run-cache-{node_namespace}"
    host_path_volume(kube, name, host_dir, node_namespace, CLAIM, "ReadWriteMany")
    yield host_dir
    kube.delete(PERSISTENTVOLUMES, name)


def claim_volume(job: JSON) -> JSON:
    [volume] = [
        v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "pkobatch-cache"
    ]
    return dict(volume)


def test_runs_of_a_namespace_share_its_cache_volume(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
    cache_dir: Path,
) -> None:
    kube = node_cluster.kube
    apply_stack(kube, node_namespace, "first", yaml_stack(pulumi_yaml_image))
    wait_stack(kube, node_namespace, "first", ready, timeout=600)
    # The namespace's first run created the claim and ran on an emptyDir.
    [before] = stack_jobs(kube, node_namespace, "first")
    assert claim_volume(before) == {"name": "pkobatch-cache", "emptyDir": {}}
    wait_events(
        kube,
        node_namespace,
        lambda e: e["reason"] == "RunCacheUnavailable" and "did not exist" in e["note"],
        what="the warning of the run without its cache",
    )
    wait_until(
        lambda: (
            (kube.get(PERSISTENTVOLUMECLAIMS, CLAIM, node_namespace).get("status") or {}).get(
                "phase"
            )
            == "Bound"
        ),
        timeout=120,
        what="the cache claim bound to the hostPath volume",
    )
    assert list(cache_dir.iterdir()) == []

    request_reconcile(kube, node_namespace, "first", "with-cache")
    wait_stack(
        kube,
        node_namespace,
        "first",
        lambda s: ready(s) and last_update(s).get("reconcileRequest") == "with-cache",
        timeout=600,
    )
    with_cache = stack_jobs(kube, node_namespace, "first")[-1]
    assert claim_volume(with_cache) == {
        "name": "pkobatch-cache",
        "persistentVolumeClaim": {"claimName": CLAIM},
    }
    # The run's Pulumi home (PULUMI_HOME=$PKOBATCH_CACHE_DIR/pulumi-home) is on the volume.
    pulumi_home = cache_dir / "pulumi-home"
    assert pulumi_home.is_dir()
    assert pulumi_home.stat().st_uid == 1000
    written = sorted(str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*"))

    apply_stack(kube, node_namespace, "second", yaml_stack(pulumi_yaml_image))
    stack = wait_stack(kube, node_namespace, "second", ready, timeout=600)
    assert last_update(stack)["state"] == "succeeded"
    [job] = stack_jobs(kube, node_namespace, "second")
    assert claim_volume(job)["persistentVolumeClaim"] == {"claimName": CLAIM}
    pods, _ = kube.list_objects(
        PODS, node_namespace, label_selector=f"job-name={job['metadata']['name']}"
    )
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
    # What the first Stack's run left is still there, beside what this one added.
    after = {str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*")}
    assert set(written) <= after, written
