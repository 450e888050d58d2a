"""A statically provisioned hostPath PersistentVolume for the real node's tests (tests/node):
``host_path_volume(kube, name, host_dir, namespace, claim, access_mode)`` reserves it for one
claim, so the node's PersistentVolume binder binds that claim to it."""

from __future__ import annotations

from pathlib import Path

from pkobatch.kube.client import PERSISTENTVOLUMES, Kube


def host_path_volume(
    kube: Kube, name: str, host_dir: Path, namespace: str, claim: str, access_mode: str
) -> None:
    """A statically provisioned PersistentVolume ``name`` on the new directory ``host_dir``
    (writable by the run's user), reserved for the claim ``namespace/claim``."""
    host_dir.mkdir(mode=0o777)
    host_dir.chmod(0o777)  # the run's user (uid 1000) writes there
    kube.create(
        PERSISTENTVOLUMES,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [access_mode],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
    )
