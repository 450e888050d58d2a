"""Stacks run as users run them, on the real node: the controller installed as a pod by
docs/install.md's ``kubectl apply -k`` (test_install.py), every run a Job of the repository's
runner image (``pkobatch/runner``, built by ``pkobatch.dev.images``) that the kubelet runs
in a container, its state on a ``file://`` backend on a hostPath PersistentVolume
(``state_volume``).

The YAML Stack's program is a Program object (``pulumi.com/v1``): a ConfigMap and a
Deployment of the tests' busybox image, whose pod becomes ready ``readyAfter`` seconds after
it starts (the Kubernetes provider waits for the rollout, so a run lasts that long). The
Python Stack's program is the ``files`` test program in a git repository that ``git daemon``
serves on the host's address of the node's link, which pods reach; the runner runs it with
the Pulumi SDK of its own image.

One install for the module; each test has its own namespace, state and Stack."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
from fixture_plugins.cluster import Cluster
from fixture_plugins.git import GitRepo, GitServer
from fixture_plugins.images import Images
from fixture_plugins.node_images import NodeImage
from helpers.controller_harness import (
    apply_stack,
    bind_runner,
    create_secret,
    last_update,
    literal,
    ready,
    secret,
    stack_jobs,
    wait_stack,
)
from test_install import (
    CONTROLLER_NAMESPACE,
    apply_kustomization,
    controller_pod,
    delete_kustomization,
    run,
    write_kustomization,
)

from pkobatch.api.constants import OPERATION_LABEL
from pkobatch.config import JobSettings
from pkobatch.dev.processes import free_port, wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    PODS,
    PROGRAMS,
    ROLEBINDINGS,
    ROLES,
    STACKS,
)

pytestmark = pytest.mark.timeout(2400)

JSON = dict[str, Any]
# Generous: each run starts a container of a large image on a 2-core machine shared with builds.
TIMEOUT: Final = 600
PASSPHRASE: Final = "not-a-secret-of-this-test"
STATE_DIR: Final = "/state"
APP: Final = "web"
# What the runner's ServiceAccount needs beyond the pkobatch-runner ClusterRole for the
# program's objects: the provider applies, reads and deletes them and watches the rollout
# (its Deployment await watches PersistentVolumeClaims too, and waits forever if forbidden).
PROGRAM_RULES: Final[list[JSON]] = [
    {
        "apiGroups": ["", "apps"],
        "resources": [
            "configmaps",
            "deployments",
            "replicasets",
            "pods",
            "events",
            "persistentvolumeclaims",
        ],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    }
]


@pytest.fixture(scope="module")
def installed_controller(
    node_cluster: Cluster, built_images: Images, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """pkobatch installed by docs/install.md's kustomization (the controller's and the runs'
    images named in the local registry, both imported into the node's containerd); the runs'
    image. Removed after the module."""
    assert node_cluster.node is not None
    for target in ("controller", "runner"):
        node_cluster.node.import_image(built_images[target].archive)
    directory = tmp_path_factory.mktemp("kustomization")
    write_kustomization(directory, built_images["controller"])
    apply_kustomization(node_cluster, directory)
    yield built_images["runner"].reference
    delete_kustomization(node_cluster, directory)


@pytest.fixture
def tenant(node_cluster: Cluster, node_namespace: str, installed_controller: str) -> str:
    """The test's namespace made ready for Stacks as docs/install.md says (the runner's
    ServiceAccount bound to the ``pkobatch-runner`` ClusterRole), with the rights the
    programs' objects need and the backend's passphrase."""
    kube = node_cluster.kube
    bind_runner(kube, node_namespace)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role"}
    kube.create(
        ROLES, {**role, "metadata": {"name": "objects"}, "rules": PROGRAM_RULES}, node_namespace
    )
    kube.create(
        ROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "objects"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "objects"},
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": JobSettings().service_account,
                    "namespace": node_namespace,
                }
            ],
        },
        node_namespace,
    )
    create_secret(kube, node_namespace, "pulumi", {"passphrase": PASSPHRASE})
    return node_namespace


@pytest.fixture(scope="module")
def git_daemon(node_cluster: Cluster, git_server: GitServer) -> Iterator[str]:
    """``git daemon`` serving the test git server's repositories (``git_repo``), read-only
    and without credentials, on the host's address of the node's link; its ``git://`` base
    URL. Stopped after the module."""
    assert node_cluster.node is not None
    address = node_cluster.node.network.host_address
    port = free_port()
    log = node_cluster.state_dir / "git-daemon.log"
    with log.open("wb") as output:
        daemon = subprocess.Popen(
            [
                "git",
                "daemon",
                "--export-all",
                "--reuseaddr",
                f"--base-path={git_server.root}",
                f"--listen={address}",
                f"--port={port}",
                str(git_server.root),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"git://{address}:{port}"

    def accepts() -> bool:
        assert daemon.poll() is None, log.read_text()
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=5):
            return True
        return False

    try:
        wait_until(accepts, timeout=60, what=f"git daemon on {url}")
        yield url
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def stack_spec(state_volume: JSON, **source: Any) -> JSON:
    """A Stack of ``source`` run in the runner image (the controller's default), its state on
    the ``state`` PersistentVolume."""
    return {
        "stack": "dev",
        **source,
        "envRefs": {
            "PULUMI_BACKEND_URL": literal(f"file://{STATE_DIR}"),
            "PULUMI_CONFIG_PASSPHRASE": secret("pulumi", "passphrase"),
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": literal("true"),
        },
        "jobTemplate": {
            "spec": {
                "volumes": [state_volume],
                "containers": [
                    {"name": "pulumi", "volumeMounts": [{"name": "state", "mountPath": STATE_DIR}]}
                ],
            }
        },
    }


def deployment_program(namespace: str, busybox: NodeImage) -> JSON:
    """A ConfigMap and a Deployment whose pod turns ready ``readyAfter`` seconds after it
    starts (a readiness probe on a file its command makes)."""
    labels = {"app.kubernetes.io/name": APP}
    container = {
        "name": APP,
        "image": busybox.name,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "sleep ${readyAfter}; touch /tmp/ready; exec sleep 3600"],
        "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "periodSeconds": 1},
        "envFrom": [{"configMapRef": {"name": "${settings.metadata.name}"}}],
    }
    return {
        "configuration": {
            "message": {"type": "String", "default": "hello"},
            "readyAfter": {"type": "String", "default": "0"},
        },
        "resources": {
            "settings": {
                "type": "kubernetes:core/v1:ConfigMap",
                "properties": {
                    "metadata": {"name": f"{APP}-settings", "namespace": namespace},
                    "data": {"message": "${message}"},
                },
            },
            APP: {
                "type": "kubernetes:apps/v1:Deployment",
                "properties": {
                    "metadata": {"name": APP, "namespace": namespace, "labels": labels},
                    "spec": {
                        "replicas": 1,
                        "selector": {"matchLabels": labels},
                        "template": {
                            "metadata": {"labels": labels},
                            "spec": {"terminationGracePeriodSeconds": 1, "containers": [container]},
                        },
                    },
                },
            },
        },
        "outputs": {
            "configMap": "${settings.metadata.name}",
            "deployment": f"${{{APP}.metadata.name}}",
            "message": "${settings.data.message}",
        },
    }


def create_yaml_stack(
    cluster: Cluster,
    namespace: str,
    name: str,
    busybox: NodeImage,
    state_volume: JSON,
    config: dict[str, str],
    **spec: Any,
) -> None:
    """Program ``name`` (``deployment_program``) and Stack ``name`` that runs it."""
    program = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": name},
        "program": deployment_program(namespace, busybox),
    }
    cluster.kube.create(PROGRAMS, program, namespace)
    source = {"programRef": {"name": name}, "config": config}
    apply_stack(cluster.kube, namespace, name, stack_spec(state_volume, **source, **spec))


def wait_ready(cluster: Cluster, namespace: str, name: str) -> JSON:
    """The Stack once Ready; on a timeout the message shows its pods and their logs."""
    try:
        return wait_stack(cluster.kube, namespace, name, ready, timeout=TIMEOUT)
    except AssertionError as exc:
        pods, _ = cluster.kube.list_objects(PODS, namespace)
        shown = []
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            try:
                log = cluster.pod_logs.read(namespace, pod_name)[-3000:]
            except Exception as error:
                log = str(error)
            shown.append(f"--- pod {pod_name}: {pod.get('status')}\n{log}")
        raise AssertionError("\n".join([str(exc), *shown])) from exc


def app_pods(cluster: Cluster, namespace: str) -> list[JSON]:
    pods, _ = cluster.kube.list_objects(
        PODS, namespace, label_selector=f"app.kubernetes.io/name={APP}"
    )
    return pods


def assert_app_runs_on_the_node(cluster: Cluster, namespace: str) -> None:
    """The program's objects exist and the Deployment's one pod runs, ready, on the node."""
    assert cluster.node is not None
    assert cluster.kube.get(CONFIGMAPS, f"{APP}-settings", namespace)["data"] == {
        "message": "hello"
    }
    deployment = cluster.kube.get(DEPLOYMENTS, APP, namespace)
    assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
    (pod,) = [p for p in app_pods(cluster, namespace) if not p["metadata"].get("deletionTimestamp")]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["nodeName"] == cluster.node.node_name
    (container,) = pod["status"]["containerStatuses"]
    assert container["ready"] is True
    assert "running" in container["state"]


def assert_app_gone(cluster: Cluster, namespace: str) -> None:
    assert cluster.kube.get_or_none(CONFIGMAPS, f"{APP}-settings", namespace) is None
    assert cluster.kube.get_or_none(DEPLOYMENTS, APP, namespace) is None


def pkobatch(cluster: Cluster, namespace: str, *argv: str) -> str:
    """The ``pkobatch`` CLI against the cluster; it must exit 0."""
    return run([sys.executable, "-m", "pkobatch.main", "-n", namespace, *argv], cluster)


def assert_runs_in(image: str, cluster: Cluster, namespace: str, stack: str) -> None:
    """Every run of ``stack`` ran in ``image``."""
    for job in stack_jobs(cluster.kube, namespace, stack):
        containers = job["spec"]["template"]["spec"]["containers"]
        assert [c["image"] for c in containers if c["name"] == "pulumi"] == [image]


def test_a_yaml_stack_runs_its_deployment_on_the_node_and_the_cli_operates_it(
    node_cluster: Cluster,
    installed_controller: str,
    tenant: str,
    busybox_image: NodeImage,
    state_volume: JSON,
) -> None:
    kube = node_cluster.kube
    create_yaml_stack(node_cluster, tenant, "app", busybox_image, state_volume, {})

    stack = wait_ready(node_cluster, tenant, "app")

    assert stack["status"]["outputs"] == {
        "configMap": f"{APP}-settings",
        "deployment": APP,
        "message": "hello",
    }
    assert last_update(stack)["state"] == "succeeded"
    assert_app_runs_on_the_node(node_cluster, tenant)
    assert_runs_in(installed_controller, node_cluster, tenant, "app")

    refreshed = pkobatch(node_cluster, tenant, "refresh", "app", "--wait")
    assert refreshed.startswith(f"refresh succeeded: {tenant}/app (run "), refreshed
    request = kube.get(STACKS, "app", tenant)["status"]["operationRequest"]
    assert (request["operation"], request["state"]) == ("refresh", "Succeeded"), request
    refresh_job = request["jobName"]

    # The refresh's log, read through the API server's pods/log from the node's kubelet.
    logs = pkobatch(node_cluster, tenant, "logs", "app", "--run", refresh_job)
    assert "kubernetes:apps/v1:Deployment" in logs, logs

    previewed = pkobatch(node_cluster, tenant, "preview", "app", "--wait")
    assert previewed.startswith(f"preview succeeded: {tenant}/app (run "), previewed
    request = kube.get(STACKS, "app", tenant)["status"]["operationRequest"]
    assert (request["operation"], request["state"]) == ("preview", "Succeeded"), request
    assert request["jobName"] != refresh_job
    assert_app_runs_on_the_node(node_cluster, tenant)

    destroyed = pkobatch(node_cluster, tenant, "destroy", "app", "--yes", "--wait")
    assert destroyed.startswith(f"destroy succeeded: {tenant}/app (run "), destroyed
    stack = kube.get(STACKS, "app", tenant)
    assert (last_update(stack)["type"], last_update(stack)["state"]) == ("destroy", "succeeded")
    assert_app_gone(node_cluster, tenant)
    assert_runs_in(installed_controller, node_cluster, tenant, "app")


def test_a_python_stack_from_git_runs_with_the_runner_image_sdk(
    node_cluster: Cluster,
    installed_controller: str,
    tenant: str,
    state_volume: JSON,
    git_daemon: str,
    git_repo: Callable[..., GitRepo],
) -> None:
    repo = git_repo("files")
    source = {
        "projectRepo": f"{git_daemon}/{repo.bare.name}",
        "commit": repo.commit,
        "config": {"directory": "/tmp/files", "content": "kia ora"},
    }
    apply_stack(node_cluster.kube, tenant, "files", stack_spec(state_volume, **source))

    stack = wait_ready(node_cluster, tenant, "files")

    assert stack["status"]["outputs"]["contents"] == ["kia ora 0", "kia ora 1"]
    assert stack["status"]["projectInfo"]["runtime"] == "python"
    assert last_update(stack)["lastSuccessfulCommit"] == repo.commit
    assert_runs_in(installed_controller, node_cluster, tenant, "files")


def test_deleting_a_stack_with_destroy_on_finalize_destroys_its_objects_first(
    node_cluster: Cluster, tenant: str, busybox_image: NodeImage, state_volume: JSON
) -> None:
    kube = node_cluster.kube
    create_yaml_stack(
        node_cluster, tenant, "app", busybox_image, state_volume, {}, destroyOnFinalize=True
    )
    wait_ready(node_cluster, tenant, "app")
    assert_app_runs_on_the_node(node_cluster, tenant)

    kube.delete(STACKS, "app", tenant)
    # The Stack's Jobs go with it (they are its dependents): note their operations meanwhile.
    operations: set[str] = set()

    def gone() -> bool:
        stack = kube.get_or_none(STACKS, "app", tenant)
        if stack is not None:
            jobs = stack_jobs(kube, tenant, "app")
            operations.update(j["metadata"]["labels"].get(OPERATION_LABEL, "") for j in jobs)
            # The Stack stays while its objects do: the destroy runs first.
            if kube.get_or_none(DEPLOYMENTS, APP, tenant) is not None:
                assert stack["metadata"].get("deletionTimestamp")
        return stack is None

    wait_until(gone, timeout=TIMEOUT, what="the Stack to be destroyed and deleted")

    assert_app_gone(node_cluster, tenant)
    assert "destroy" in operations, operations


def test_a_new_controller_pod_adopts_the_run_of_a_deleted_one(
    node_cluster: Cluster, tenant: str, busybox_image: NodeImage, state_volume: JSON
) -> None:
    kube = node_cluster.kube
    # The run waits for a rollout that takes a minute: the controller is deleted meanwhile.
    create_yaml_stack(
        node_cluster, tenant, "app", busybox_image, state_volume, {"readyAfter": "60"}
    )
    wait_until(
        lambda: kube.get_or_none(DEPLOYMENTS, APP, tenant) is not None,
        timeout=TIMEOUT,
        what="the run to create the Deployment",
    )
    (job,) = stack_jobs(kube, tenant, "app")
    old = controller_pod(node_cluster)["metadata"]["name"]
    stack = kube.get(STACKS, "app", tenant)
    assert not ready(stack)
    assert stack["status"]["currentUpdate"]["name"] == job["metadata"]["name"]

    kube.delete(PODS, old, CONTROLLER_NAMESPACE)
    # The run was still going when its controller went.
    assert kube.get(JOBS, job["metadata"]["name"], tenant)["status"].get("active") == 1

    def replaced() -> bool:
        pods, _ = kube.list_objects(
            PODS, CONTROLLER_NAMESPACE, label_selector="app.kubernetes.io/component=controller"
        )
        return [p["metadata"]["name"] for p in pods] not in ([], [old])

    wait_until(replaced, timeout=TIMEOUT, what="the Deployment's new controller pod")
    stack = wait_ready(node_cluster, tenant, "app")

    assert controller_pod(node_cluster)["metadata"]["name"] != old
    assert [j["metadata"]["name"] for j in stack_jobs(kube, tenant, "app")] == [
        job["metadata"]["name"]
    ]
    update = last_update(stack)
    assert (update["name"], update["state"]) == (job["metadata"]["name"], "succeeded")
    assert stack["status"]["outputs"]["deployment"] == APP
    assert_app_runs_on_the_node(node_cluster, tenant)
