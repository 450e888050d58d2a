"""Runs on real containers: the controller (a host process, tests/helpers/controller_harness.py)
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
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import PASSPHRASE, NodeImage, yaml_stack
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    condition,
    last_update,
    literal,
    ready,
    settled,
    stack_jobs,
    wait_events,
    wait_stack,
)

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import NAMESPACES, PODS

pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]


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


def test_a_namespaces_restricted_level_admits_the_restricted_profile_and_refuses_baseline(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    """``workspaceTemplate.spec.securityProfile`` on a real kubelet, under the API server's
    Pod Security admission: ``restricted`` runs; ``baseline`` passes pkobatch's own check
    (``PKOBATCH_JOB__POD_SECURITY_LEVEL``, ``baseline`` by default) but its pod is refused,
    and the Stack says so instead of waiting for a pod until the Job's deadline."""
    kube = node_cluster.kube
    enforce = "pod-security.kubernetes.io/enforce"
    kube.merge_patch(NAMESPACES, node_namespace, {"metadata": {"labels": {enforce: "restricted"}}})
    apply_stack(
        kube, node_namespace, "strict", yaml_stack(pulumi_yaml_image, securityProfile="restricted")
    )
    apply_stack(
        kube, node_namespace, "relaxed", yaml_stack(pulumi_yaml_image, securityProfile="baseline")
    )

    strict = wait_stack(kube, node_namespace, "strict", ready, timeout=600)
    relaxed = wait_stack(
        kube,
        node_namespace,
        "relaxed",
        lambda s: last_update(s).get("state") == "failed",
        timeout=600,
    )

    assert strict["status"]["outputs"]["message"] == "kia ora from YAML"
    pod = wait_run_pod(node_cluster, node_namespace, "strict", ended, "the run's pod to end")
    assert pod["status"]["phase"] == "Succeeded"
    # The kubelet reports the user the run container ran as.
    (run,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "pulumi"]
    assert run["user"]["linux"]["uid"] != 0
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]

    update = last_update(relaxed)
    assert update["reason"] == "PodCreationFailed", update
    message = update["message"]
    assert "the Job controller cannot create its pod" in message
    assert 'violates PodSecurity "restricted:latest"' in message
    assert "allowPrivilegeEscalation != false" in message and "runAsNonRoot != true" in message
    assert "use spec.workspaceTemplate.spec.securityProfile restricted" in message
    assert condition(relaxed, "Ready")["status"] == "False"
    # The words are the API server's, from the Job controller's Event about the run's Job.
    (refused, *_) = wait_events(
        kube,
        node_namespace,
        lambda e: e["reason"] == "FailedCreate" and e["regarding"]["name"] == update["name"],
    )
    assert 'violates PodSecurity "restricted:latest"' in refused["note"]


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


def write_if_read(fifo: Path, text: str) -> None:
    """Write ``text`` to ``fifo`` if a reader waits on it (else ENXIO: nothing happens)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(descriptor, text.encode())
        finally:
            os.close(descriptor)


@contextlib.contextmanager
def feeding(name: str, fifos: Callable[[], list[Path]], text: str) -> Iterator[None]:
    """Write ``text`` to each of ``fifos()`` whenever a reader waits on it, until the block
    ends."""
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.2):
            for fifo in fifos():
                write_if_read(fifo, text)

    feeder = threading.Thread(target=feed, name=name, daemon=True)
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join(timeout=60)


def feed_passphrase(
    node_cluster: Cluster, namespace: str, stack: str
) -> contextlib.AbstractContextManager[None]:
    """Write the passphrase to the FIFO of every run pod of ``stack`` on the node (its
    ``emptyDir`` is a directory of the kubelet's) each time a reader waits on it."""
    assert node_cluster.node is not None
    pods_dir = node_cluster.node.kubelet_dir / "pods"

    def fifos() -> list[Path]:
        return [
            pods_dir
            / pod["metadata"]["uid"]
            / "volumes"
            / "kubernetes.io~empty-dir"
            / "passphrase"
            / "fifo"
            for job in stack_jobs(node_cluster.kube, namespace, stack)
            for pod in run_pods(node_cluster, namespace, job)
        ]

    return feeding("feed-passphrase", fifos, PASSPHRASE)


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


def pulumi_locks(state_dir: Path) -> list[Path]:
    """Every file under the ``file://`` backend's lock directory (a lock and its ``.attrs``)."""
    return [p for p in (state_dir / ".pulumi" / "locks").rglob("*") if p.is_file()]


GATE_PROGRAM = """name: pkobatch-test-gate
description: pkobatch test program - its update waits until a line is written to {gate}
runtime: yaml
variables:
  gate:
    fn::readFile: {gate}
outputs:
  gate: ${{gate}}
"""


def test_a_run_killed_by_a_reboot_of_its_nodes_runtime_is_interrupted_and_run_again(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
    state_volume: JSON,
    tmp_path: Path,
) -> None:
    """A reboot, as far as the runtime sees it: the kubelet and containerd stop, every shim
    and container process is killed, both start again. The update was holding the stack's
    lock on a ``file://`` backend (a PersistentVolume) when it died: the Stack records the
    run as interrupted, the retry removes the stale lock and succeeds, and no lock is
    left."""
    kube = node_cluster.kube
    node = node_cluster.node
    assert node is not None
    state_dir = tmp_path / "state"
    program = state_dir / "program"
    program.mkdir()
    # The program reads a FIFO of the volume: the update (holding the lock) waits for a writer.
    gate = state_dir / "gate"
    os.mkfifo(gate, 0o666)
    gate.chmod(0o666)
    (program / "Pulumi.yaml").write_text(GATE_PROGRAM.format(gate="/state/gate"))
    spec = yaml_stack(pulumi_yaml_image)
    spec["envRefs"]["PULUMI_BACKEND_URL"] = literal("file:///state")
    spec["workspaceTemplate"]["spec"]["local"] = {"dir": "/state/program"}
    mount = {"name": "state", "mountPath": "/state"}
    spec["jobTemplate"] = {
        "spec": {
            "volumes": [state_volume],
            "containers": [{"name": "pulumi", "volumeMounts": [mount]}],
        }
    }
    apply_stack(kube, node_namespace, "rebooted", spec)
    wait_until(lambda: pulumi_locks(state_dir), timeout=600, what="the update to take its lock")
    (first,) = stack_jobs(kube, node_namespace, "rebooted")
    (killed,) = run_pods(node_cluster, node_namespace, first)

    node.crash_runtime()
    # The killed update's lock stays until the retry, at least 10 s after the failure.
    stale = pulumi_locks(state_dir)
    assert stale, "the killed update left no lock: it did not hold one"

    stack = wait_stack(
        kube,
        node_namespace,
        "rebooted",
        lambda s: last_update(s).get("name") == first["metadata"]["name"],
        timeout=600,
    )
    update = last_update(stack)
    pod = kube.get(PODS, killed["metadata"]["name"], node_namespace)
    assert (update["state"], update["reason"]) == ("failed", "Interrupted"), (update, pod["status"])
    assert "was lost by its node (Unknown, exit code 255" in update["message"], update
    assert "it will be retried" in update["message"]
    wait_events(
        kube,
        node_namespace,
        lambda e: e["reason"] == "StackUpdateFailure" and "was lost by its node" in e["note"],
        timeout=120,
        what="the Event of the interrupted run",
    )

    with feeding("open-gate", lambda: [gate], "open\n"):
        again = wait_stack(kube, node_namespace, "rebooted", ready, timeout=900)

    assert again["status"]["outputs"]["gate"] == "open\n"
    jobs = stack_jobs(kube, node_namespace, "rebooted")
    assert len(jobs) == 2 and jobs[0]["metadata"]["name"] == first["metadata"]["name"]
    assert pulumi_locks(state_dir) == []
    assert all(not path.exists() for path in stale)
    wait_events(
        kube,
        node_namespace,
        lambda e: e["reason"] == "StaleLockRemoved" and first["metadata"]["name"] in e["note"],
        timeout=120,
        what="the StaleLockRemoved Event",
    )


def memory_limited(image: str, limit: str) -> JSON:
    return yaml_stack(image, resources={"limits": {"memory": limit}, "requests": {"memory": limit}})


def test_a_run_whose_pulumi_is_oom_killed_says_so_and_is_retried(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    """At 64Mi the kernel kills the largest process of the run's container. That is usually
    the Pulumi CLI (already its ``pulumi version``), and the runner survives: it reads the
    container's memory cgroup and reports the kill. Under load the runner's own interpreter
    can be the largest at that moment; then the pod's status reports it. Either way the run
    says OOMKilled with the limit it met and what to raise. (At 12Mi to 40Mi nothing was
    killed: each run was still running after 4 minutes, its processes thrashing; the Job's
    deadline ends it.)"""
    kube = node_cluster.kube
    apply_stack(kube, node_namespace, "hungry", memory_limited(pulumi_yaml_image, "64Mi"))

    stack = wait_stack(
        kube,
        node_namespace,
        "hungry",
        lambda s: last_update(s).get("state") == "failed",
        timeout=600,
    )

    update = last_update(stack)
    (first,) = [
        j
        for j in stack_jobs(kube, node_namespace, "hungry")
        if j["metadata"]["name"] == update["name"]
    ]
    (pod,) = run_pods(node_cluster, node_namespace, first)
    assert update["reason"] == "OOMKilled", (update, pod["status"])
    # containerd marks the container OOMKilled for any OOM kill in it.
    (container,) = pod["status"]["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled", pod["status"]
    assert "its memory limit of 64Mi" in update["message"], update
    if update["message"].startswith("the run ran out of memory: the kernel killed"):
        # The runner's words: it outlived the kill, exited by itself, and its result was
        # written and trusted.
        assert (
            "(OOMKilled); raise spec.workspaceTemplate.spec.resources.limits.memory"
            in (update["message"])
        )
        assert terminated["exitCode"] == 1, pod["status"]
    else:
        # The runner itself was killed: the pod's status is the only witness.
        assert update["message"].startswith("the run's container pulumi ran out of memory"), update
        assert "raise limits.memory in spec.workspaceTemplate" in update["message"], update
        assert terminated["exitCode"] == 137, pod["status"]
    # Retried by policy: the next run follows the backoff and fails the same way.
    retried = wait_stack(
        kube,
        node_namespace,
        "hungry",
        lambda s: int(last_update(s).get("failures") or 0) >= 1,
        timeout=600,
    )
    assert last_update(retried)["reason"] == "OOMKilled"
    assert len(stack_jobs(kube, node_namespace, "hungry")) >= 2

    apply_stack(kube, node_namespace, "hungry", memory_limited(pulumi_yaml_image, "512Mi"))
    fixed = wait_stack(kube, node_namespace, "hungry", ready, timeout=600)
    assert fixed["status"]["outputs"]["message"] == "kia ora from YAML"
