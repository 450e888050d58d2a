"""pkobatch's images (tests/fixture_plugins/images.py) imported into the real node's containerd
and run by its kubelet as the install and the Job builder run them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fixture_plugins.cluster import Cluster
from fixture_plugins.images import Images
from fixture_plugins.node_images import NodeImage
from test_real_node import WaitPod, phase_is

from pkobatch import __version__
from pkobatch.config import JobSettings
from pkobatch.controller.run_pod import (
    INJECTED_BUNDLE,
    INJECTED_RUNNER,
    RESTRICTED_SECURITY_CONTEXT,
)
from pkobatch.kube.client import PODS

JSON = dict[str, Any]
DEPLOYMENT = (
    Path(__file__).resolve().parents[2] / "deploy/kustomize/base/controller/deployment.yaml"
)


def run_to_the_end(cluster: Cluster, namespace: str, pod: JSON, wait_pod: WaitPod) -> str:
    """Create the pod, wait until it has ended, and return its log; it must have succeeded."""
    cluster.kube.create(PODS, pod, namespace)
    name = pod["metadata"]["name"]
    done = wait_pod(namespace, name, phase_is("Succeeded", "Failed"))
    output: str = cluster.pod_logs.read(namespace, name)
    assert done["status"]["phase"] == "Succeeded", (done["status"], output)
    return output


def test_the_controller_image_runs_as_its_deployment_runs_it(
    node_cluster: Cluster, node_namespace: str, built_images: Images, wait_pod: WaitPod
) -> None:
    assert node_cluster.node is not None
    node_cluster.node.import_image(built_images["controller"].archive)
    # The Deployment's pod (image, user, read-only root, /tmp) with `--help` as its command.
    template = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    (container,) = template["containers"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller-help"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": template["securityContext"],
            "volumes": template["volumes"],
            "containers": [
                {
                    "name": "controller",
                    "image": container["image"],
                    "imagePullPolicy": "Never",
                    "command": [*container["command"], "--help"],
                    "securityContext": container["securityContext"],
                    "volumeMounts": container["volumeMounts"],
                }
            ],
        },
    }
    output = run_to_the_end(node_cluster, node_namespace, pod, wait_pod)
    assert "Run the Stack controller" in output


def test_the_runner_image_runs_pkobatch_and_pulumi_as_a_run_does(
    node_cluster: Cluster, node_namespace: str, built_images: Images, wait_pod: WaitPod
) -> None:
    assert node_cluster.node is not None
    node_cluster.node.import_image(built_images["runner"].archive)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runner-versions"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "pulumi",
                    "image": JobSettings().image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "pkobatch --version && pulumi version && id -u"],
                    "securityContext": RESTRICTED_SECURITY_CONTEXT,
                }
            ],
        },
    }
    output = run_to_the_end(node_cluster, node_namespace, pod, wait_pod)
    assert f"pkobatch, version {__version__}" in output
    assert output.split()[-1] == "1000"


def test_the_runner_bundle_image_injects_the_runner_into_an_image_without_pkobatch(
    node_cluster: Cluster,
    node_namespace: str,
    built_images: Images,
    busybox_image: NodeImage,
    wait_pod: WaitPod,
) -> None:
    """The init container and volume the Job builder adds for a run in another image, here
    the tests' busybox image (no C library, no pkobatch), from the runner-bundle image."""
    assert node_cluster.node is not None
    node_cluster.node.import_image(built_images["runner-bundle"].archive)
    mount = {"name": "pkobatch-runner", "mountPath": str(Path(INJECTED_BUNDLE).parent)}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "injected-runner"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "volumes": [{"name": "pkobatch-runner", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "pkobatch-runner",
                    "image": built_images["runner-bundle"].name,
                    "imagePullPolicy": "Never",
                    "command": ["cp", "-R", JobSettings().runner_bundle, INJECTED_BUNDLE],
                    "volumeMounts": [mount],
                    "securityContext": RESTRICTED_SECURITY_CONTEXT,
                }
            ],
            "containers": [
                {
                    "name": "pulumi",
                    "image": busybox_image.name,
                    "imagePullPolicy": "Never",
                    "command": [INJECTED_RUNNER, "--version"],
                    "volumeMounts": [{**mount, "readOnly": True}],
                }
            ],
        },
    }
    output = run_to_the_end(node_cluster, node_namespace, pod, wait_pod)
    assert __version__ in output
