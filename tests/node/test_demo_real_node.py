"""`pkobatch dev demo --node real`, the README demo's option (``scripts/demo.sh --node real``
passes it on): pkobatch installed from its own images with ``kubectl apply -k``, the demo
Stack Ready with its run in a container of the runner image on the real node, the run's
state on the node's PersistentVolume; the environment keeps running until ``dev down``,
which leaves nothing of the node behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_plugins.images import Images
from helpers.dev_env import pkobatch, row
from test_real_node_dev import NOTHING_LEFT, what_is_left

from pkobatch.api.constants import CONDITION_READY, RUN_CONTAINER_NAME
from pkobatch.api.objects import true_condition
from pkobatch.api.status import last_update
from pkobatch.dev.demo import NAMESPACE, STACK
from pkobatch.dev.node_demo import CONTROLLER_NAMESPACE
from pkobatch.dev.tools import Tools
from pkobatch.kube.client import NODES, PODS, STACKS, Kube

pytestmark = pytest.mark.timeout(3600)

# Tools and images cached, the demo takes a few minutes; a slow, shared machine gets far more.
DEMO_TIMEOUT = 2400

JSON = dict[str, Any]


@pytest.fixture
def state(tmp_path: Path, real_node_tools: Tools, built_images: Images) -> Iterator[Path]:
    state = tmp_path / "dev"
    yield state
    pkobatch("dev", "down", "--state-dir", str(state), check=False)


def the_pod(kube: Kube, namespace: str, label_selector: str) -> JSON:
    pods, _ = kube.list_objects(PODS, namespace, label_selector=label_selector)
    (pod,) = pods
    return dict(pod)


def test_the_real_node_demo_runs_the_stack_in_a_container_of_the_runner_image(
    state: Path, built_images: Images
) -> None:
    result = pkobatch(
        "dev", "demo", "--node", "real", "--state-dir", str(state),
        check=False, timeout=DEMO_TIMEOUT,
    )  # fmt: skip

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert row(out, "Ready", "True (ProcessingCompleted)")
    assert row(out, "message", "kia ora from a real container")
    assert row(out, "token", "[secret]")
    assert "demo-token-" not in out + result.stderr
    assert f"pkobatch dev down --state-dir {state}" in out
    assert out.rstrip().endswith("demo complete")

    status = json.loads(pkobatch("dev", "status", "--state-dir", str(state), "-o", "json").stdout)
    assert status["state"] == "running" and status["node"] == "real"
    assert status["controller"]["state"] == "disabled"  # the controller is a pod, not a process
    kube = Kube.connect(status["kubeconfig"])
    try:
        stack = kube.get(STACKS, STACK, NAMESPACE)
        assert true_condition(stack, CONDITION_READY) is not None, stack.get("status")
        job = last_update(stack["status"])["name"]
        run = the_pod(kube, NAMESPACE, f"job-name={job}")
        controller = the_pod(kube, CONTROLLER_NAMESPACE, "app.kubernetes.io/component=controller")
        nodes, _ = kube.list_objects(NODES, None)
    finally:
        kube.close()
    (node,) = nodes
    assert run["status"]["phase"] == "Succeeded"
    assert run["spec"]["nodeName"] == node["metadata"]["name"]
    (container,) = [
        s for s in run["status"]["containerStatuses"] if s["name"] == RUN_CONTAINER_NAME
    ]
    assert container["image"] == built_images["runner"].reference
    assert container["containerID"].startswith("containerd://")
    assert container["state"]["terminated"]["exitCode"] == 0
    # The printed pod is that pod.
    assert row(out, "node", node["metadata"]["name"])
    assert row(out, "image", built_images["runner"].reference)
    assert f"kubectl -n {NAMESPACE} logs job/{job} " in out
    (controller_container,) = controller["status"]["containerStatuses"]
    assert controller_container["image"] == built_images["controller"].reference
    assert controller_container["ready"] is True
    # The stack's state is on the node's PersistentVolume, a directory of the host.
    assert list((state / "demo" / "state" / ".pulumi" / "stacks").rglob("dev.json*"))

    pkobatch("dev", "down", "--state-dir", str(state))
    assert what_is_left(state) == NOTHING_LEFT
