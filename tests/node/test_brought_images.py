"""The injected runner in the images users bring (issue 21, item 5), on real containers: the
controller (a host process) sets ``workspaceTemplate.spec.image`` to an image that has the
Pulumi CLI and the YAML language host and nothing of pkobatch's — a Debian image without
Python, an image whose C library is musl, an image with no shell and no ``cp``
(``brought_image``, tests/fixture_plugins/node_images.py) — the init container copies the
runner bundle in from ``runner_bundle_image``, and the kubelet runs the run in that image.

The program outputs the ``/etc/os-release`` it reads, so the Stack's status says which
image's root filesystem the run saw.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import BroughtImage, yaml_stack
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    last_update,
    ready,
    settled,
    stack_jobs,
    wait_stack,
)

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import PODS

pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
GLIBC = ("libc.so.6", "ld-linux-x86-64.so.2")


def basenames(image: BroughtImage) -> set[str]:
    return {path.rpartition("/")[2] for path in image.paths}


def assert_brings_only_what_it_should(image: BroughtImage) -> None:
    """What the image holds, from its layers: the Pulumi CLI and YAML host always; Python
    never; glibc and a shell only in the Debian image; musl only in the musl image."""
    names = basenames(image)
    assert {"usr/bin/pulumi", "usr/bin/pulumi-language-yaml"} <= image.paths
    assert [p for p in image.paths if re.fullmatch(r"(usr/)?(local/)?bin/python.*", p)] == []
    assert ("usr/bin/sh" in image.paths or "bin/sh" in image.paths) == (image.kind == "debian")
    assert any(name in names for name in GLIBC) == (image.kind == "debian")
    assert ("usr/bin/cp" in image.paths or "bin/cp" in image.paths) == (image.kind == "debian")
    assert ("lib/ld-musl-x86_64.so.1" in image.paths) == (image.kind == "musl")


def run_pods(node_cluster: Cluster, namespace: str, stack: str) -> list[JSON]:
    pods: list[JSON] = []
    for job in stack_jobs(node_cluster.kube, namespace, stack):
        found, _ = node_cluster.kube.list_objects(
            PODS, namespace, label_selector=f"job-name={job['metadata']['name']}"
        )
        pods += found
    return pods


def test_a_stack_is_ready_in_each_image_users_bring(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    brought_image: BroughtImage,
) -> None:
    assert_brings_only_what_it_should(brought_image)
    kube = node_cluster.kube

    apply_stack(kube, node_namespace, "brought", yaml_stack(brought_image.name))
    stack = wait_stack(kube, node_namespace, "brought", ready, timeout=600)

    outputs = stack["status"]["outputs"]
    assert outputs["message"] == "kia ora from YAML"
    assert outputs["osRelease"] == brought_image.os_release
    assert last_update(stack)["state"] == "succeeded"
    assert settled(stack)
    # The run container ran the image brought, to its end, with the bundle copied in.
    pods: list[JSON] = []

    def ended() -> bool:
        pods[:] = run_pods(node_cluster, node_namespace, "brought")
        return bool(pods) and all(p["status"].get("phase") == "Succeeded" for p in pods)

    wait_until(ended, timeout=300, what="the run's pod to succeed")
    (pod,) = pods
    (run,) = [c for c in pod["spec"]["containers"] if c["name"] == "pulumi"]
    assert run["image"] == brought_image.name
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "pulumi"]
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["image"].endswith(brought_image.name)
