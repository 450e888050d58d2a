"""The real node (pkobatch.dev.node) does what a cluster's node does: it registers and is
Ready, kube-scheduler places pods on their requests, a pod runs in a container of its image
with its own network and PID namespaces and its user, it reaches the API server through the
``kubernetes`` Service with its ServiceAccount token, and the kernel's OOM killer ends a
container over its memory limit, which the kubelet reports as ``OOMKilled``."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import NodeImage

from pkobatch.dev.node import NODE_NAME
from pkobatch.dev.node_network import POD_CIDR, SERVICE_CIDR
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import versions
from pkobatch.kube.client import EVENTS, JOBS, NODES, PODS, ROLEBINDINGS, ROLES

JSON = dict[str, Any]
WaitPod = Callable[..., JSON]


def busybox_pod(name: str, image: NodeImage, script: str, **spec: Any) -> JSON:
    container: JSON = {
        "name": "main",
        "image": image.name,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **spec,
        },
    }


def phase_is(*phases: str) -> Callable[[JSON], bool]:
    return lambda pod: (pod.get("status") or {}).get("phase") in phases


def condition(obj: JSON, kind: str) -> JSON:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return {}


def test_the_node_registers_and_is_ready(node_cluster: Cluster) -> None:
    assert node_cluster.node is not None
    node = node_cluster.kube.get(NODES, NODE_NAME)
    assert condition(node, "Ready").get("status") == "True"
    assert not (node.get("spec") or {}).get("taints")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == node_cluster.node.network.node_address
    info = node["status"]["nodeInfo"]
    pinned = versions()
    assert info["kubeletVersion"] == pinned["KUBERNETES_VERSION"]
    assert info["kubeProxyVersion"] in ("", pinned["KUBERNETES_VERSION"])
    assert (
        info["containerRuntimeVersion"]
        == f"containerd://{pinned['CONTAINERD_VERSION'].removeprefix('v')}"
    )


def test_the_scheduler_places_pods_on_their_requests(
    node_cluster: Cluster, node_namespace: str, busybox_image: NodeImage, wait_pod: WaitPod
) -> None:
    kube = node_cluster.kube
    too_big = {"resources": {"requests": {"cpu": "1000"}}}
    fits = {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
    kube.create(
        PODS, busybox_pod("too-big", busybox_image, "true", container=too_big), node_namespace
    )
    kube.create(PODS, busybox_pod("fits", busybox_image, "true", container=fits), node_namespace)

    placed = wait_pod(node_namespace, "fits", phase_is("Succeeded"))
    assert placed["spec"]["nodeName"] == NODE_NAME
    events, _ = kube.list_objects(EVENTS, node_namespace, field_selector="reason=Scheduled")
    scheduled = [e for e in events if e["regarding"]["name"] == "fits"]
    assert [e["reportingController"] for e in scheduled] == ["default-scheduler"]

    pending = wait_pod(
        node_namespace,
        "too-big",
        lambda pod: condition(pod, "PodScheduled").get("reason") == "Unschedulable",
    )
    assert pending["status"]["phase"] == "Pending"
    assert "nodeName" not in pending["spec"]
    assert "Insufficient cpu" in condition(pending, "PodScheduled")["message"]


def test_a_pod_runs_in_a_container_of_its_image(
    node_cluster: Cluster, node_namespace: str, busybox_image: NodeImage, wait_pod: WaitPod
) -> None:
    kube = node_cluster.kube
    host_path = node_cluster.state_dir  # exists on the host, not in the image
    script = (
        "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); "
        "echo ip=$(ip -4 -o addr show eth0 | awk '{print $4}'); "
        f"echo marker=$(cat {busybox_image.marker}); "
        f"if [ -e {host_path} ]; then echo host=visible; else echo host=hidden; fi; "
        "echo hostname=$(hostname); echo uid=$(id -u)"
    )
    pod = busybox_pod("isolated", busybox_image, script, securityContext={"runAsUser": 65534})
    kube.create(PODS, pod, node_namespace)

    done = wait_pod(node_namespace, "isolated", phase_is("Succeeded", "Failed"))
    output = node_cluster.pod_logs.read(node_namespace, "isolated")
    assert done["status"]["phase"] == "Succeeded", output
    seen = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    # PID 1 is the container's own command: a PID namespace of its own.
    assert seen["pid1"].strip() == f"/bin/sh -c {script}"
    pod_ip = done["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_CIDR)
    assert seen["ip"] == f"{pod_ip}/{ipaddress.ip_network(POD_CIDR).prefixlen}"
    assert seen["marker"] == busybox_image.marker_text
    assert seen["host"] == "hidden"
    assert seen["hostname"] == "isolated"
    assert seen["uid"] == "65534"


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    node_cluster: Cluster, node_namespace: str, busybox_image: NodeImage, wait_pod: WaitPod
) -> None:
    """kubectl in the pod uses the in-cluster configuration, as clients in pods do: the
    ``kubernetes`` Service's address from the environment the kubelet sets, the projected
    ServiceAccount token, and the CA it verifies the API server with."""
    kube = node_cluster.kube
    rbac = "rbac.authorization.k8s.io"
    reader = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
    role = {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": {"name": "pod-reader"}}
    kube.create(ROLES, {**role, "rules": [reader]}, node_namespace)
    kube.create(
        ROLEBINDINGS,
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "default-reads-pods"},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "pod-reader"},
            "subjects": [
                {"kind": "ServiceAccount", "name": "default", "namespace": node_namespace}
            ],
        },
        node_namespace,
    )
    script = (
        "echo service=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; "
        "echo user=$(kubectl auth whoami -o jsonpath='{.status.userInfo.username}'); "
        "echo uid=$(kubectl get pod $POD_NAME -o jsonpath='{.metadata.uid}')"
    )
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "HOME", "value": "/tmp"},  # kubectl's cache
    ]
    pod = busybox_pod("caller", busybox_image, script, container={"env": env})
    kube.create(PODS, pod, node_namespace)

    done = wait_pod(node_namespace, "caller", phase_is("Succeeded", "Failed"))
    output = node_cluster.pod_logs.read(node_namespace, "caller")
    assert done["status"]["phase"] == "Succeeded", output
    seen = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    service_ip = next(ipaddress.ip_network(SERVICE_CIDR).hosts())
    assert seen["service"] == f"{service_ip}:443", output
    assert seen["user"] == f"system:serviceaccount:{node_namespace}:default", output
    assert seen["uid"] == done["metadata"]["uid"], output


def test_a_job_over_its_memory_limit_is_oom_killed(
    node_cluster: Cluster, node_namespace: str, busybox_image: NodeImage
) -> None:
    kube = node_cluster.kube
    limits = {"memory": "32Mi"}
    hog = busybox_pod(
        "hog",
        busybox_image,
        "exec tail /dev/zero",  # keeps all it reads: no line ever ends
        container={"resources": {"requests": limits, "limits": limits}},
    )
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "hog"},
        "spec": {"backoffLimit": 0, "template": {"spec": hog["spec"]}},
    }
    kube.create(JOBS, job, node_namespace)

    def job_failed() -> bool:
        job_status = condition(kube.get(JOBS, "hog", node_namespace), "Failed")
        return job_status.get("status") == "True"

    wait_until(job_failed, timeout=300, what=f"Job {node_namespace}/hog to fail")
    pods, _ = kube.list_objects(PODS, node_namespace, label_selector="job-name=hog")
    terminated = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled"
    assert terminated["exitCode"] == 137
