"""Runs on real containers: the controller (a host process, tests/controller_harness.py)
makes each run's Job, the kubelet runs its pod — an init container copies the runner bundle
from ``runner_bundle_image`` and the run container executes it in ``pulumi_yaml_image``
(tests/fixture_plugins/node_images.py) — and the runner writes its result through the
``kubernetes`` Service with its ServiceAccount's token. Each test asserts what the Stack's
status says when the kubelet, the kernel or the Job controller act on the run."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    create_secret,
    install_controller_rbac,
    last_update,
    literal,
    ready,
    secret,
    settled,
    stack_jobs,
    wait_stack,
)
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import PULUMI_YAML_PROGRAM, RUNNER_BUNDLE_PATH, NodeImage

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import NAMESPACES, PODS, Resource

pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
PASSPHRASE = "not-a-secret-of-this-test"
PERSISTENTVOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
PERSISTENTVOLUMECLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")


@pytest.fixture
def node_controller(
    node_cluster: Cluster,
    node_namespace: str,
    tmp_path: Path,
    pulumi_yaml_image: str,
    runner_bundle_image: str,
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
        },
    )
    process.start()
    yield process
    process.stop()


def yaml_stack(image: str, **workspace: Any) -> JSON:
    """A Stack of the YAML program baked into ``image``, its state on a ``file://`` backend
    in the pod's ``/tmp``."""
    return {
        "stack": "dev",
        "config": {"greeting": "kia ora"},
        "envRefs": {
            "PULUMI_BACKEND_URL": literal("file:///tmp"),
            "PULUMI_CONFIG_PASSPHRASE": secret("pulumi", "passphrase"),
            "PULUMI_SKIP_UPDATE_CHECK": literal("true"),
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": literal("true"),
        },
        "workspaceTemplate": {
            "spec": {
                "image": image,
                "imagePullPolicy": "Never",
                "local": {"dir": PULUMI_YAML_PROGRAM},
                "env": [{"name": "HOME", "value": "/tmp"}],
                **workspace,
            }
        },
    }


def run_pods(node_cluster: Cluster, namespace: str, job: JSON) -> list[JSON]:
    pods, _ = node_cluster.kube.list_objects(
        PODS, namespace, label_selector=f"job-name={job['metadata']['name']}"
    )
    return pods


def wait_run_pod(
    node_cluster: Cluster, namespace: str, stack: str, done: Callable[[JSON], bool], what: str
) -> JSON:
    """The first pod of the Stack's Jobs for which ``done(pod)`` holds, waiting for it."""
    found: list[JSON] = []

    def check() -> bool:
        for job in stack_jobs(node_cluster.kube, namespace, stack):
            found[:] = [p for p in run_pods(node_cluster, namespace, job) if done(p)]
            if found:
                return True
        return False

    wait_until(check, timeout=600, what=f"{what} (Stack {stack})")
    return found[0]


def ended(pod: JSON) -> bool:
    """The pod has ended. (The runner writes its result, which the controller folds at
    once, before its container exits: a Ready Stack's pod may still run.)"""
    return pod["status"].get("phase") in ("Succeeded", "Failed")


def run_container_running(pod: JSON) -> bool:
    return any(
        s["name"] == "pulumi" and "running" in (s.get("state") or {})
        for s in pod["status"].get("containerStatuses") or []
    )


def test_a_run_is_admitted_and_succeeds_in_a_restricted_namespace(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    enforce = "pod-security.kubernetes.io/enforce"
    kube.merge_patch(NAMESPACES, node_namespace, {"metadata": {"labels": {enforce: "restricted"}}})
    apply_stack(kube, node_namespace, "greeting", yaml_stack(pulumi_yaml_image))

    stack = wait_stack(kube, node_namespace, "greeting", ready, timeout=600)

    outputs = stack["status"]["outputs"]
    assert outputs["message"] == "kia ora from YAML"
    assert kube.get(NAMESPACES, node_namespace)["metadata"]["labels"][enforce] == "restricted"
    pod = wait_run_pod(node_cluster, node_namespace, "greeting", ended, "the run's pod to end")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["containers"][0]["image"] == pulumi_yaml_image
    assert condition(stack, "Ready")["status"] == "True"
    assert last_update(stack)["state"] == "succeeded"
    assert settled(stack)


def test_a_run_with_a_read_only_root_filesystem_still_works(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    spec = yaml_stack(pulumi_yaml_image)
    read_only = {"name": "pulumi", "securityContext": {"readOnlyRootFilesystem": True}}
    spec["jobTemplate"] = {"spec": {"containers": [read_only]}}
    apply_stack(kube, node_namespace, "sealed", spec)

    stack = wait_stack(kube, node_namespace, "sealed", ready, timeout=600)

    assert stack["status"]["outputs"]["message"] == "kia ora from YAML"
    pod = wait_run_pod(node_cluster, node_namespace, "sealed", ended, "the run's pod to end")
    (run,) = [c for c in pod["spec"]["containers"] if c["name"] == "pulumi"]
    assert run["securityContext"]["readOnlyRootFilesystem"] is True
    # The writable place the run got: /tmp on an emptyDir, not the image's root.
    assert {"name": "pkobatch-tmp", "mountPath": "/tmp"} in run["volumeMounts"]
    assert pod["status"]["phase"] == "Succeeded"


def test_a_run_image_never_loaded_is_named_and_fixing_it_recovers(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    missing = "pkobatch-test/never-loaded:1"
    apply_stack(kube, node_namespace, "typo", yaml_stack(missing))

    stack = wait_stack(
        kube, node_namespace, "typo", lambda s: last_update(s).get("state") == "failed"
    )

    update = last_update(stack)
    assert update["reason"] == "ImagePullFailed", update
    assert "could not start for 30 seconds" in update["message"]
    assert f"its image {missing} cannot be pulled (ErrImageNeverPull" in update["message"]

    apply_stack(kube, node_namespace, "typo", yaml_stack(pulumi_yaml_image))
    fixed = wait_stack(kube, node_namespace, "typo", ready, timeout=600)
    assert fixed["status"]["outputs"]["message"] == "kia ora from YAML"


FIFO_DIR = "/passphrase"
FIFO = f"{FIFO_DIR}/fifo"


def waiting_for_passphrase(image: str, busybox: NodeImage, **extra: Any) -> JSON:
    """A Stack whose run waits, mid-run, for as long as nobody writes its passphrase: Pulumi
    (and the runner, which reads it to scrub it) reads it from a FIFO
    (``PULUMI_CONFIG_PASSPHRASE_FILE``) that an init container makes in an ``emptyDir``;
    each read blocks until a writer comes (``feed_passphrase``)."""
    spec = yaml_stack(image, **extra)
    del spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]
    spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE_FILE"] = literal(FIFO)
    mount = {"name": "passphrase", "mountPath": FIFO_DIR}
    spec["jobTemplate"] = {
        "spec": {
            "volumes": [{"name": "passphrase", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "make-fifo",
                    "image": busybox.name,
                    "imagePullPolicy": "Never",
                    "command": ["mkfifo", "-m", "0666", FIFO],
                    "volumeMounts": [mount],
                    "securityContext": {"runAsUser": 1000, "allowPrivilegeEscalation": False},
                }
            ],
            "containers": [{"name": "pulumi", "volumeMounts": [mount]}],
        }
    }
    return spec


def test_a_run_past_its_timeout_is_stopped_and_recorded_as_such(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
    busybox_image: NodeImage,
) -> None:
    kube = node_cluster.kube
    spec = waiting_for_passphrase(pulumi_yaml_image, busybox_image)
    spec["timeoutSeconds"] = 45
    apply_stack(kube, node_namespace, "slow", spec)
    pod = wait_run_pod(
        node_cluster, node_namespace, "slow", run_container_running, "the run container to run"
    )

    stack = wait_stack(
        kube, node_namespace, "slow", lambda s: last_update(s).get("state") == "failed"
    )

    update = last_update(stack)
    assert update["reason"] == "DeadlineExceeded", update
    assert "exceeded its deadline" in update["message"], update
    (job,) = [
        j
        for j in stack_jobs(kube, node_namespace, "slow")
        if j["metadata"]["name"] == pod["metadata"]["labels"]["job-name"]
    ]
    assert job["spec"]["activeDeadlineSeconds"] == 45
    failed = condition(job, "Failed")
    assert (failed.get("status"), failed.get("reason")) == ("True", "DeadlineExceeded")
    # The Job controller stopped the pod that was still running its run.
    wait_until(
        lambda: all(
            p["metadata"].get("deletionTimestamp") or p["status"]["phase"] in ("Failed",)
            for p in run_pods(node_cluster, node_namespace, job)
        ),
        timeout=300,
        what="the run's pod to be stopped",
    )


@contextlib.contextmanager
def feed_passphrase(node_cluster: Cluster, namespace: str, stack: str) -> Iterator[None]:
    """Write the passphrase to the FIFO of every run pod of ``stack`` on the node (its
    ``emptyDir`` is a directory of the kubelet's) each time a reader waits on it."""
    assert node_cluster.node is not None
    pods_dir = node_cluster.node.kubelet_dir / "pods"
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.2):
            for job in stack_jobs(node_cluster.kube, namespace, stack):
                for pod in run_pods(node_cluster, namespace, job):
                    volume = pods_dir / pod["metadata"]["uid"] / "volumes"
                    fifo = volume / "kubernetes.io~empty-dir" / "passphrase" / "fifo"
                    with contextlib.suppress(OSError):  # ENXIO: no reader waits
                        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                        try:
                            os.write(descriptor, PASSPHRASE.encode())
                        finally:
                            os.close(descriptor)

    feeder = threading.Thread(target=feed, name="feed-passphrase", daemon=True)
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join(timeout=60)


@pytest.fixture
def state_volume(node_cluster: Cluster, node_namespace: str, tmp_path: Path) -> Iterator[JSON]:
    """A PersistentVolumeClaim ``state`` bound to a hostPath PersistentVolume at
    ``tmp_path/state``, where a ``file://`` backend outlives the run's pod: the pod volume
    that mounts it. The PersistentVolume is deleted after the test."""
    kube = node_cluster.kube
    namespace = node_namespace
    host_dir = tmp_path / "state"
    host_dir.mkdir(mode=0o777)
    host_dir.chmod(0o777)  # the run's user (uid 1000) writes there
    name = f"state-{namespace}"
    kube.create(
        PERSISTENTVOLUMES,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(host_dir), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": "state"},
            },
        },
    )
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


def test_a_run_keeps_running_through_a_restart_of_kubelet_and_containerd(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
    busybox_image: NodeImage,
    state_volume: JSON,
    tmp_path: Path,
) -> None:
    """What the kubelet does: containerd's shims keep the containers running while both are
    down, and the restarted kubelet takes the running pod back — the same container, not
    restarted — so the run finishes and nothing is recorded as interrupted. A later run on
    the same ``file://`` backend (a PersistentVolume) finds no stale lock."""
    kube = node_cluster.kube
    assert node_cluster.node is not None
    state_dir = tmp_path / "state"
    spec = waiting_for_passphrase(pulumi_yaml_image, busybox_image)
    spec["envRefs"]["PULUMI_BACKEND_URL"] = literal("file:///state")
    template = spec["jobTemplate"]["spec"]
    template["volumes"].append(state_volume)
    template["containers"][0]["volumeMounts"].append({"name": "state", "mountPath": "/state"})
    apply_stack(kube, node_namespace, "steady", spec)
    before = wait_run_pod(
        node_cluster, node_namespace, "steady", run_container_running, "the run container to run"
    )

    node_cluster.node.restart_runtime()

    def same_container_running() -> bool:
        pod = kube.get(PODS, before["metadata"]["name"], node_namespace)
        (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "pulumi"]
        assert pod["metadata"]["uid"] == before["metadata"]["uid"]
        assert status["restartCount"] == 0 and "terminated" not in status["state"], status
        return "running" in status["state"] and status["ready"] is True

    wait_until(same_container_running, timeout=300, what="the kubelet to report the run again")
    with feed_passphrase(node_cluster, node_namespace, "steady"):
        stack = wait_stack(kube, node_namespace, "steady", ready, timeout=600)
        assert stack["status"]["outputs"]["message"] == "kia ora from YAML"
        (job,) = stack_jobs(kube, node_namespace, "steady")
        assert job["metadata"]["name"] == before["metadata"]["labels"]["job-name"]
        assert last_update(stack)["state"] == "succeeded"

        spec["config"]["greeting"] = "haere mai"
        apply_stack(kube, node_namespace, "steady", spec)
        again = wait_stack(kube, node_namespace, "steady", ready, timeout=600)

    assert again["status"]["outputs"]["message"] == "haere mai from YAML"
    assert len(stack_jobs(kube, node_namespace, "steady")) == 2
    locks = state_dir / ".pulumi" / "locks"
    assert [p for p in locks.rglob("*") if p.is_file()] == []
    assert list((state_dir / ".pulumi" / "stacks").rglob("dev.json*"))
