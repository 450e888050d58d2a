"""Fixtures of the real node's tier (``node_cluster``: tests/fixture_plugins/cluster.py;
its images: tests/fixture_plugins/node_images.py).

``wait_pod(namespace, name, done, timeout=300)`` -> the pod on ``node_cluster`` once
``done(pod)`` is true.

``node_controller`` -> ``ControllerProcess`` (tests/helpers/controller_harness.py): the controller
as a host process for the test's namespace, its injected runs copying the runner bundle from
``runner_bundle_image``, with the runner's RBAC and the Secret ``pulumi`` (``PASSPHRASE``)
that ``yaml_stack`` (fixture_plugins/node_images.py) refers to; a module overrides
``node_controller_settings`` to give it more settings.

``state_volume`` -> the pod volume of a PersistentVolumeClaim ``state`` bound to a hostPath
PersistentVolume (``helpers.host_path_volume``) at ``tmp_path/state`` (writable by the run's
user), where a ``file://`` backend outlives the run's pod; the PersistentVolume is deleted
after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import PASSPHRASE, RUNNER_BUNDLE_PATH
from helpers.controller_harness import (
    ControllerProcess,
    bind_runner,
    create_secret,
    install_controller_rbac,
)
from helpers.host_path_volume import host_path_volume

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import PERSISTENTVOLUMECLAIMS, PERSISTENTVOLUMES, PODS, Kube

JSON = dict[str, Any]


@pytest.fixture
def wait_pod(node_cluster: Cluster) -> Callable[..., JSON]:
    kube: Kube = node_cluster.kube

    def wait(namespace: str, name: str, done: Callable[[JSON], bool], timeout: float = 300) -> JSON:
        found: list[JSON] = []

        def check() -> bool:
            pod = kube.get(PODS, name, namespace)
            found[:] = [pod]
            return done(pod)

        wait_until(check, timeout=timeout, what=f"pod {namespace}/{name}")
        return found[0]

    return wait


@pytest.fixture
def node_controller_settings() -> dict[str, str]:
    """More settings of ``node_controller`` (``PKOBATCH_*`` variables)."""
    return {}


@pytest.fixture
def node_controller(
    node_cluster: Cluster,
    node_namespace: str,
    tmp_path: Path,
    pulumi_yaml_image: str,
    runner_bundle_image: str,
    node_controller_settings: dict[str, str],
) -> Iterator[ControllerProcess]:
    """The controller for the test's namespace, its injected runs using the test images."""
    kube = node_cluster.kube
    install_controller_rbac(kube)
    bind_runner(kube, node_namespace)
    create_secret(kube, node_namespace, "pulumi", {"passphrase": PASSPHRASE})
    process = ControllerProcess(
        node_cluster,
        node_namespace,
        tmp_path / "controller",
        env={
            "PKOBATCH_JOB__BUNDLE_IMAGE": runner_bundle_image,
            "PKOBATCH_JOB__RUNNER_BUNDLE": RUNNER_BUNDLE_PATH,
            "PKOBATCH_JOB__IMAGE_PULL_POLICY": "Never",
            "PKOBATCH_JOB__TERMINATION_GRACE_PERIOD": "5s",
            **node_controller_settings,
        },
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def state_volume(node_cluster: Cluster, node_namespace: str, tmp_path: Path) -> Iterator[JSON]:
    kube = node_cluster.kube
    namespace = node_namespace
    name = f"state-{namespace}"
    host_path_volume(kube, name, tmp_path / "state", namespace, "state", "ReadWriteOnce")
    kube.create(
        PERSISTENTVOLUMECLAIMS,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "state"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        namespace,
    )
    wait_until(
        lambda: (
            kube.get(PERSISTENTVOLUMECLAIMS, "state", namespace).get("status", {}).get("phase")
            == "Bound"
        ),
        timeout=120,
        what="the state PersistentVolumeClaim to be bound",
    )
    yield {"name": "state", "persistentVolumeClaim": {"claimName": "state"}}
    kube.delete(PERSISTENTVOLUMES, name)
