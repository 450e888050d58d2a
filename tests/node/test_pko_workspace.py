"""PKO's workspace behaviours (issue 27) on the real node: the controller (a host process,
``node_controller``) makes each run's Job, the kubelet runs its pod in real containers — the
runner bundle injected from ``runner_bundle_image``, the run in an image with the Pulumi CLI
and the YAML test program (tests/fixture_plugins/node_images.py).

- PKO's dynamic environment: an init container (PKO's manifest shape) appends
  ``PULUMI_CONFIG_PASSPHRASE=...`` to ``$PULUMI_ENV`` on the ``share`` volume; the run's
  state, kept on a PersistentVolume, opens with that passphrase only;
- the CLI version check: with Pulumi CLI v3.197.0 the only CLI on the run image's PATH,
  structured config stalls as ``PulumiVersionTooLow`` naming the minimum after one run, and
  string config reaches Ready; with the CLI between that minimum and today's, both run;
- a ServiceAccount with no RoleBinding at all: the result reaches the controller in the
  termination message the kubelet writes into the pod's status; a feature that needs rights
  stalls naming them, with exactly one run and no update;
- a run stuck on a missing Secret (``CreateContainerConfigError`` from the kubelet) is
  replaced by the fixed spec's run within 30 s of the fix.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fixture_plugins.cluster import Cluster
from fixture_plugins.node_images import NodeImage, yaml_stack
from helpers.controller_harness import (
    ControllerProcess,
    applied_at,
    apply_stack,
    condition,
    create_secret,
    last_update,
    literal,
    pulumi_env_writer,
    ready,
    seconds,
    stack_jobs,
    wait_events,
    wait_other_job,
    wait_stack,
    wait_version_too_low,
)
from helpers.sentinels import plant
from test_run_behaviour import run_pods, wait_run_pod  # the tier's run-pod helpers

from pkobatch.api.constants import RUN_CONTAINER_NAME
from pkobatch.api.run import result_in_message
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import versions
from pkobatch.kube.client import CONFIGMAPS, SERVICEACCOUNTS, Kube

pytestmark = pytest.mark.timeout(1800)
JSON = dict[str, Any]
# A PKO manifest's ServiceAccount: nothing of pkobatch's is bound to it (PKO #805).
PKO_ACCOUNT = "pko-workspace"


def run_result(kube: Kube, namespace: str, job: JSON) -> JSON:
    """The result ConfigMap's ``result.json`` of ``job``."""
    result: JSON = json.loads(
        kube.get(CONFIGMAPS, job["metadata"]["name"], namespace)["data"]["result.json"]
    )
    return result


def pko_account_stack(kube: Kube, namespace: str, image: str) -> JSON:
    """``yaml_stack(image)`` run under a new ServiceAccount with no RoleBinding at all."""
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PKO_ACCOUNT}}
    kube.create(SERVICEACCOUNTS, body, namespace)
    spec = yaml_stack(image)
    spec["serviceAccountName"] = PKO_ACCOUNT
    return spec


def test_an_init_container_writing_pulumi_env_gives_the_run_its_passphrase(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
    busybox_image: NodeImage,
    state_volume: JSON,
    pulumi_bin: Path,
    tmp_path: Path,
) -> None:
    kube = node_cluster.kube
    passphrase = plant("node-dynamic-env-passphrase")
    create_secret(kube, node_namespace, "vault", {"passphrase": passphrase})
    spec = yaml_stack(pulumi_yaml_image)
    del spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]  # only the dynamic environment has it
    spec["envRefs"]["PULUMI_BACKEND_URL"] = literal("file:///state")
    spec["workspaceTemplate"]["spec"]["podTemplate"] = {
        "spec": {
            "volumes": [state_volume],
            "initContainers": [
                pulumi_env_writer(
                    busybox_image.name,
                    "vault",
                    imagePullPolicy="Never",
                    securityContext={"runAsUser": 1000, "allowPrivilegeEscalation": False},
                )
            ],
            "containers": [
                {
                    "name": RUN_CONTAINER_NAME,
                    "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                }
            ],
        }
    }
    apply_stack(kube, node_namespace, "dynamic-env", spec)

    stack = wait_stack(kube, node_namespace, "dynamic-env", ready, timeout=600)

    assert stack["status"]["outputs"]["message"] == "kia ora from YAML"
    [job] = stack_jobs(kube, node_namespace, "dynamic-env")
    [pod] = run_pods(node_cluster, node_namespace, job)
    [init] = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == "extra"]
    assert init["state"]["terminated"]["exitCode"] == 0
    log = node_cluster.pod_logs.read(node_namespace, pod["metadata"]["name"], container="extra")
    assert "Wrote dynamic environment variables" in log

    # The state the run left on the PersistentVolume opens with the init container's
    # passphrase, and with no other.
    def export(with_passphrase: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{pulumi_bin}{os.pathsep}{os.environ['PATH']}",
            "PULUMI_HOME": str(tmp_path / "pulumi-home"),
            "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_CONFIG_PASSPHRASE": with_passphrase,
        }
        stack_name = "organization/pkobatch-test-yaml/dev"
        return subprocess.run(
            ["pulumi", "stack", "export", "--show-secrets", "--stack", stack_name],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    exported = export(passphrase)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert json.loads(exported.stdout)["deployment"]["resources"]
    wrong = export("not-the-dynamic-one")
    assert wrong.returncode != 0
    assert "passphrase" in wrong.stderr.lower()


def test_an_old_cli_on_the_runs_path_stalls_structured_config_and_runs_string_config(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_old_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    old = versions()["PULUMI_OLD_VERSION"]
    apply_stack(kube, node_namespace, "strings", yaml_stack(pulumi_old_yaml_image))
    structured = yaml_stack(pulumi_old_yaml_image)
    structured["config"]["count"] = 3  # an integer: structured config
    apply_stack(kube, node_namespace, "structured", structured)

    wait_version_too_low(kube, node_namespace, "structured", old)

    stack = wait_stack(kube, node_namespace, "strings", ready, timeout=600)
    assert stack["status"]["outputs"]["message"] == "kia ora from YAML"
    [job] = stack_jobs(kube, node_namespace, "strings")
    assert run_result(kube, node_namespace, job)["pulumiVersion"].removeprefix("v") == old
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == pulumi_old_yaml_image
    node_controller.caught_up()
    assert len(stack_jobs(kube, node_namespace, "structured")) == 1


def test_a_cli_between_json_config_and_todays_runs_string_then_structured_config(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_mid_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    mid = versions()["PULUMI_MID_VERSION"]
    spec = yaml_stack(pulumi_mid_yaml_image)
    apply_stack(kube, node_namespace, "app", spec)

    stack = wait_stack(kube, node_namespace, "app", ready, timeout=600)
    assert stack["status"]["outputs"]["message"] == "kia ora from YAML"

    spec["config"]["count"] = 3
    apply_stack(kube, node_namespace, "app", spec)
    stack = wait_stack(kube, node_namespace, "app", ready, timeout=600)
    assert stack["status"]["outputs"]["count"] == 3
    assert last_update(stack)["generation"] == 2
    jobs = stack_jobs(kube, node_namespace, "app")
    assert len(jobs) == 2
    for job in jobs:
        assert run_result(kube, node_namespace, job)["pulumiVersion"].removeprefix("v") == mid


def test_a_run_whose_service_account_has_no_role_binding_reaches_ready_once(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    spec = pko_account_stack(kube, node_namespace, pulumi_yaml_image)
    apply_stack(kube, node_namespace, "app", spec)

    stack = wait_stack(kube, node_namespace, "app", ready, timeout=600)

    update = last_update(stack)
    assert update["state"] == "succeeded" and update["failures"] == 0
    assert stack["status"]["outputs"]["message"] == "kia ora from YAML"
    [job] = stack_jobs(kube, node_namespace, "app")  # exactly one update run
    [pod] = run_pods(node_cluster, node_namespace, job)
    assert pod["spec"]["serviceAccountName"] == PKO_ACCOUNT
    [run] = [s for s in pod["status"]["containerStatuses"] if s["name"] == RUN_CONTAINER_NAME]
    # The result itself, in the termination message the kubelet copied into the pod's status;
    # the controller wrote the result ConfigMap from it, owned by the Job.
    carried = json.loads(result_in_message(run["state"]["terminated"]["message"]))
    assert carried["state"] == "succeeded" and carried["outputs"]["message"] == "kia ora from YAML"
    result = kube.get(CONFIGMAPS, job["metadata"]["name"], node_namespace)
    [owner] = result["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])
    assert json.loads(result["data"]["result.json"]) == carried
    log = node_cluster.pod_logs.read(
        node_namespace, pod["metadata"]["name"], container=RUN_CONTAINER_NAME
    )
    assert "the result is in the container's termination message" in log


def test_exports_without_the_rights_they_need_stall_naming_them_after_one_run(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    spec = pko_account_stack(kube, node_namespace, pulumi_yaml_image)
    spec["exportOutputs"] = {"configMap": {"name": "app-outputs"}}
    apply_stack(kube, node_namespace, "app", spec)

    stack = wait_stack(
        kube,
        node_namespace,
        "app",
        lambda s: condition(s, "Stalled").get("reason") == "MissingPermission",
        timeout=600,
    )

    message = condition(stack, "Stalled")["message"]
    for verb in ("create", "get", "update"):
        needed = f"{verb} configmaps in namespace {node_namespace} (for spec.exportOutputs)"
        assert needed in message, message
    update = last_update(stack)
    assert update["failures"] == 0
    # The pre-check stopped the run before Pulumi: no outputs, nothing exported.
    assert "outputs" not in stack["status"] or not stack["status"]["outputs"]
    assert kube.get_or_none(CONFIGMAPS, "app-outputs", node_namespace) is None
    node_controller.caught_up()
    assert len(stack_jobs(kube, node_namespace, "app")) == 1


def test_a_fixed_spec_replaces_a_run_stuck_on_a_missing_secret_within_30_seconds(
    node_cluster: Cluster,
    node_namespace: str,
    node_controller: ControllerProcess,
    pulumi_yaml_image: str,
) -> None:
    kube = node_cluster.kube
    broken = yaml_stack(pulumi_yaml_image)
    # PKO's scenario: the workspace's env names a Secret that does not exist.
    missing = {"secretKeyRef": {"name": "absent", "key": "x"}}
    broken["workspaceTemplate"]["spec"]["env"].append({"name": "EXTRA", "valueFrom": missing})
    apply_stack(kube, node_namespace, "app", broken)

    def config_error(pod: JSON) -> bool:
        return any(
            ((s.get("state") or {}).get("waiting") or {}).get("reason")
            == "CreateContainerConfigError"
            for s in pod["status"].get("containerStatuses") or ()
        )

    stuck_pod = wait_run_pod(
        node_cluster,
        node_namespace,
        "app",
        config_error,
        "the kubelet's CreateContainerConfigError",
    )
    stuck = stuck_pod["metadata"]["labels"]["job-name"]

    fixed_at = applied_at(apply_stack(kube, node_namespace, "app", yaml_stack(pulumi_yaml_image)))
    replacement = wait_other_job(kube, node_namespace, "app", stuck)
    # PKO's own test allows 30 s from the fix to the fixed spec's run (the start limit that
    # would otherwise end the stuck run is 5 minutes).
    created = replacement["metadata"]["creationTimestamp"]
    assert seconds(created) - fixed_at <= 30, (fixed_at, created)
    stack = wait_stack(kube, node_namespace, "app", ready, timeout=600)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["generation"] == 2
    assert update["name"] == replacement["metadata"]["name"]
    wait_events(
        kube,
        node_namespace,
        lambda e: f"run {stuck} had not started when the Stack's spec changed" in e.get("note", ""),
        timeout=120,
    )
    wait_until(
        lambda: (
            [j["metadata"]["name"] for j in stack_jobs(kube, node_namespace, "app")]
            == [replacement["metadata"]["name"]]
        ),
        timeout=120,
        what="the stuck run's Job to be deleted",
    )
