"""pkobatch installed the way users install it, on the real node: docs/install.md's
kustomization that names mirrored images (``kubectl apply -k``) and its ``helm install`` with
image values, run as written with the registry swapped for the images built here
(``pkobatch.dev.images``, imported into the node's containerd). The controller then runs as a
pod of its own image: it holds its Lease, serves metrics on its Service, and ``pkobatch check``
passes against the cluster."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from fixture_plugins.cluster import Cluster
from fixture_plugins.images import unavailable
from fixture_plugins.node_images import NodeImage
from test_real_node import busybox_pod, phase_is  # the tier's pod helpers

from pkobatch.dev.images import BuilderMissing, BuiltImage, build_images
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import LEASES, NAMESPACES, PODS, NotFound, Resource

pytestmark = pytest.mark.timeout(1800)

JSON = dict[str, Any]
WaitPod = Callable[..., JSON]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
INSTALL_DOC: Final = REPO_ROOT / "docs" / "install.md"
CONTROLLER_NAMESPACE: Final = "pkobatch-system"
CONTROLLER: Final = "pkobatch-controller"
# What docs/install.md calls the user's registry; the tests put the local images' there.
DOC_REGISTRY: Final = "registry.example.com/"
# Generous: a rollout pulls nothing, but the 2-core machine is shared with builds.
TIMEOUT: Final = 600
COMMAND_TIMEOUT: Final = 420
SERVICES: Final = Resource("", "v1", "services", "Service")


def doc_block(language: str, *needles: str) -> str:
    """The one fenced ``language`` block of docs/install.md that holds every needle."""
    blocks = re.findall(rf"```{language}\n(.*?)```", INSTALL_DOC.read_text(), re.S)
    (found,) = [b for b in blocks if all(n in b for n in needles)]
    return str(found)


def local_registry(image: BuiltImage) -> str:
    """The prefix that turns docs/install.md's ``registry.example.com/pkobatch/controller``
    into the built image's name, as a user swaps in their own registry."""
    registry, found, _ = image.reference.rpartition("pkobatch/controller")
    assert found, image.reference
    return registry


@pytest.fixture(scope="module")
def controller_image(node_cluster: Cluster) -> BuiltImage:
    """The controller image (jobs/Dockerfile, target controller), built here and imported into
    the node's containerd."""
    try:
        built = build_images(["controller"], progress=True)["controller"]
    except BuilderMissing as exc:
        unavailable(str(exc))
    assert node_cluster.node is not None
    node_cluster.node.import_image(built.archive)
    return built


def run(
    argv: list[str], cluster: Cluster, *, input: str | None = None, helm: Path | None = None
) -> str:
    """``argv`` in the checkout with the admin kubeconfig, and the built ``kubectl`` (and
    ``helm``) first on ``PATH``; on failure, the message shows what the controller's
    namespace holds."""
    tools = [kubectl_of(cluster), *([helm] if helm else [])]
    path = os.pathsep.join([*(str(t.parent) for t in tools), os.environ["PATH"]])
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            env=cluster.env(PATH=path),
            cwd=REPO_ROOT,
            input=input,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} still ran after {exc.timeout} s\n{installed(cluster)}")
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}\n{installed(cluster)}"
    return str(done.stdout)


def sh(commands: str, cluster: Cluster, *, helm: Path | None = None) -> str:
    """Commands of the docs as a user's shell runs them."""
    return run(["bash", "-euo", "pipefail", "-c", commands], cluster, helm=helm)


def installed(cluster: Cluster) -> str:
    """The pods and events of the controller's namespace, for a failure's message."""
    listed = subprocess.run(
        [
            str(kubectl_of(cluster)),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-n",
            CONTROLLER_NAMESPACE,
            "get",
            "pods,events",
            "-o",
            "wide",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return listed.stdout + listed.stderr


def kubectl_of(cluster: Cluster) -> Path:
    return Path(cluster.tools.binary("node", "kubectl"))


def wait_namespace_gone(cluster: Cluster, name: str) -> None:
    wait_until(
        lambda: cluster.kube.get_or_none(NAMESPACES, name) is None,
        timeout=TIMEOUT,
        what=f"namespace {name} deleted",
    )


def controller_pod(cluster: Cluster) -> JSON:
    pods, _ = cluster.kube.list_objects(
        PODS, CONTROLLER_NAMESPACE, label_selector="app.kubernetes.io/component=controller"
    )
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    return dict(running[0])


def assert_controller_runs(
    cluster: Cluster,
    image: BuiltImage,
    namespace: str,
    busybox_image: NodeImage,
    wait_pod: WaitPod,
) -> None:
    """The controller pod runs the built image on the node, holds its Lease, serves metrics
    on its Service, and ``pkobatch check`` passes."""
    pod = controller_pod(cluster)
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] is True
    assert status["image"] == image.reference
    assert pod["spec"]["nodeName"]

    pod_name = pod["metadata"]["name"]

    def holds_lease() -> bool:
        lease = cluster.kube.get_or_none(LEASES, CONTROLLER, CONTROLLER_NAMESPACE)
        holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
        return holder.startswith(f"{pod_name}_")

    wait_until(holds_lease, timeout=TIMEOUT, what=f"pod {pod_name} holding its Lease")

    # The Service's address exists only inside the node's network: a pod reads it.
    service = cluster.kube.get(SERVICES, f"{CONTROLLER}-metrics", CONTROLLER_NAMESPACE)
    address = f"http://{service['spec']['clusterIP']}:8080/metrics"
    scraper = busybox_pod("scrape-metrics", busybox_image, f"wget -qO- {address}")
    cluster.kube.create(PODS, scraper, namespace)
    scraped = wait_pod(
        namespace, "scrape-metrics", phase_is("Succeeded", "Failed"), timeout=TIMEOUT
    )
    metrics = cluster.pod_logs.read(namespace, "scrape-metrics")
    assert scraped["status"]["phase"] == "Succeeded", metrics
    assert "controller_runtime_reconcile_total" in metrics

    checked = run(
        [
            sys.executable,
            "-m",
            "pkobatch.main",
            "-o",
            "json",
            "check",
            "--controller-namespace",
            CONTROLLER_NAMESPACE,
        ],
        cluster,
    )
    results = {c["check"]: c for c in json.loads(checked)}
    assert [c for c in results.values() if c["result"] == "fail"] == []
    assert results["controller leader"]["result"] == "ok"
    assert pod_name in results["controller leader"]["detail"]


def write_kustomization(directory: Path, controller: BuiltImage) -> None:
    """docs/install.md's kustomization in ``directory``, on deploy/kustomize/base (one
    replica: the one controller pod the tests check is the leader) and the local registry
    (its runs' image too: the runner image of the same registry)."""
    text = doc_block("yaml", "kind: Kustomization", "images:")
    base = os.path.relpath(REPO_ROOT / "deploy" / "kustomize" / "base", directory)
    text = text.replace("../pkobatch/deploy/kustomize/overlays/prod", base)
    text = text.replace(DOC_REGISTRY, local_registry(controller))
    (directory / "kustomization.yaml").write_text(text)


def apply_kustomization(cluster: Cluster, directory: Path) -> None:
    """The commands of docs/install.md's cluster-wide install, on the kustomization in
    ``directory``."""
    install = doc_block("sh", "kubectl apply -k", "rollout status")
    sh(install.replace("deploy/kustomize/overlays/prod", str(directory)), cluster)


def delete_kustomization(cluster: Cluster, directory: Path) -> None:
    """Remove what the kustomization in ``directory`` installed but the CRDs, which the
    session's other tests use."""
    kubectl = kubectl_of(cluster)
    rendered = run([str(kubectl), "kustomize", str(directory)], cluster)
    installed = [
        d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "CustomResourceDefinition"
    ]
    run(
        [str(kubectl), "delete", "--ignore-not-found", "--wait", "-f", "-"],
        cluster,
        input=yaml.safe_dump_all(installed),
    )
    wait_namespace_gone(cluster, CONTROLLER_NAMESPACE)


@pytest.fixture
def kustomization(
    node_cluster: Cluster, controller_image: BuiltImage, tmp_path: Path
) -> Iterator[Path]:
    """``write_kustomization`` in the test's directory; what it installs is removed after
    the test."""
    write_kustomization(tmp_path, controller_image)
    yield tmp_path
    delete_kustomization(node_cluster, tmp_path)


def test_kubectl_apply_k_installs_a_controller_that_runs_as_a_pod(
    node_cluster: Cluster,
    node_namespace: str,
    controller_image: BuiltImage,
    kustomization: Path,
    busybox_image: NodeImage,
    wait_pod: WaitPod,
) -> None:
    overlay = yaml.safe_load((kustomization / "kustomization.yaml").read_text())
    assert overlay["images"][0]["newName"] + ":" + overlay["images"][0]["newTag"] == (
        controller_image.reference
    )
    apply_kustomization(node_cluster, kustomization)
    assert_controller_runs(node_cluster, controller_image, node_namespace, busybox_image, wait_pod)


@pytest.fixture
def helm_release(node_cluster: Cluster, helm_bin: Path) -> Iterator[None]:
    yield
    sh(
        f"helm uninstall pkobatch --namespace {CONTROLLER_NAMESPACE} --wait --timeout {TIMEOUT}s",
        node_cluster,
        helm=helm_bin,
    )
    with contextlib.suppress(NotFound):
        node_cluster.kube.delete(NAMESPACES, CONTROLLER_NAMESPACE)
    wait_namespace_gone(node_cluster, CONTROLLER_NAMESPACE)


def test_helm_install_with_image_values_runs_the_controller_as_a_pod(
    node_cluster: Cluster,
    node_namespace: str,
    controller_image: BuiltImage,
    helm_bin: Path,
    helm_release: None,
    busybox_image: NodeImage,
    wait_pod: WaitPod,
) -> None:
    install = doc_block("sh", "helm install", "image.repository").replace(
        DOC_REGISTRY, local_registry(controller_image)
    )
    label = re.search(r"`(kubectl label namespace pkobatch-system [^`]+)`", INSTALL_DOC.read_text())
    assert label is not None
    sh(install, node_cluster, helm=helm_bin)
    sh(label.group(1), node_cluster)
    sh(
        f"kubectl -n {CONTROLLER_NAMESPACE} rollout status deployment/{CONTROLLER}",
        node_cluster,
    )
    assert_controller_runs(node_cluster, controller_image, node_namespace, busybox_image, wait_pod)
