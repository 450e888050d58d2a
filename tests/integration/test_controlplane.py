"""The local control plane of ``pkobatch.dev`` that the ``cluster`` fixture and ``pkobatch dev``
run (tests of the test harness's own git server: test_harness_git_server.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers.dev_env import alive

from pkobatch.dev.controlplane import ControlPlane, ControlPlaneError
from pkobatch.dev.processes import wait_until
from pkobatch.dev.tools import ToolsMissing, find_tools, versions
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    NAMESPACES,
    PODS,
    SECRETS,
    Forbidden,
    Kube,
    Unauthorized,
)


def test_real_kubernetes_version(kube: Kube, cluster: Any) -> None:
    version = kube.request("GET", "/version")

    assert version["gitVersion"] == cluster.tools.bin_dir("kubernetes").name.split("-", 1)[1]


def test_default_namespaces_and_controllers_exist(kube: Kube) -> None:
    names = {n["metadata"]["name"] for n in kube.list_objects(NAMESPACES)[0]}

    assert {"default", "kube-system", "kube-public"} <= names


def test_service_account_client_is_subject_to_rbac(cluster: Any, namespace: str) -> None:
    client = cluster.service_account_kube(namespace, "pkobatch-runner")

    with pytest.raises(Forbidden) as raised:
        client.list_objects(SECRETS, namespace)

    assert f"system:serviceaccount:{namespace}:pkobatch-runner" in raised.value.message


def test_unknown_credentials_are_rejected(cluster: Any, tmp_path: Path) -> None:
    config = cluster.kubeconfig.read_text()
    forged = tmp_path / "forged"
    # Same server and CA without the client certificate: anonymous, who may read nothing.
    forged.write_text(
        config.replace("client-certificate-data", "unused-a").replace("client-key-data", "unused-b")
    )
    client = Kube.connect(str(forged))
    try:
        with pytest.raises((Forbidden, Unauthorized)):
            client.list_objects(NAMESPACES)
    finally:
        client.close()


def test_namespace_deletion_completes(kube: Kube) -> None:
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
    kube.delete(NAMESPACES, "gone")

    wait_until(
        lambda: kube.get_or_none(NAMESPACES, "gone") is None,
        timeout=120,
        what="namespace deletion",
    )


def test_missing_tools_name_the_build_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PKOBATCH_TOOLS_DIR", str(tmp_path))

    with pytest.raises(ToolsMissing) as raised:
        find_tools(("etcd", "pulumi"))

    message = str(raised.value)
    assert "scripts/tools.sh etcd pulumi" in message
    assert str(tmp_path / f"etcd-{versions()['ETCD_VERSION']}") in message


def test_components_restart_with_their_data_and_clients_keep_working(
    cluster: Any, tmp_path: Path, python_job: Any
) -> None:
    # Its own control plane: restarting the shared one would disturb every other test.
    control_plane = ControlPlane(tmp_path / "cp", cluster.tools)
    control_plane.start()
    client = control_plane.admin()
    try:
        client.create(
            CONFIGMAPS,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kept"}},
            "default",
        )
        for name, kill in (
            ("etcd", True),
            ("kube-apiserver", True),
            ("kube-controller-manager", False),
        ):
            before = control_plane.pids[name]

            control_plane.restart_component(name, kill=kill, down_seconds=1)

            assert control_plane.pids[name] != before
            assert not alive(before)
            assert control_plane.exited() == {}
            # The client made before the restarts still works, and etcd kept its data.
            assert client.get(CONFIGMAPS, "kept", "default")["metadata"]["name"] == "kept"

        # The restarted kube-controller-manager still runs the Job controller.
        client.create(JOBS, python_job("after-restart", "pass"), "default")
        wait_until(
            lambda: bool(
                client.list_objects(PODS, "default", label_selector="job-name=after-restart")[0]
            ),
            timeout=120,
            what="the Job controller to create a pod",
        )
        assert (
            "restarting kube-apiserver"
            in (control_plane.log_dir / "kube-apiserver.log").read_text()
        )
    finally:
        client.close()
        control_plane.stop()


def test_a_crashed_component_is_reported_and_started_again(cluster: Any, tmp_path: Path) -> None:
    control_plane = ControlPlane(tmp_path / "cp", cluster.tools)
    control_plane.start()
    try:
        os.kill(control_plane.pids["kube-apiserver"], signal.SIGKILL)
        wait_until(lambda: "kube-apiserver" in control_plane.exited(), timeout=60, what="the crash")
        with pytest.raises(ControlPlaneError, match="kube-apiserver exited"):
            control_plane.check_alive()
        with pytest.raises(ControlPlaneError, match="is running"):
            control_plane.start_component("etcd")

        control_plane.start_component("kube-apiserver")

        control_plane.check_alive()
        client = control_plane.admin()
        try:
            assert client.get_or_none(NAMESPACES, "default") is not None
        finally:
            client.close()
    finally:
        control_plane.stop()
    assert control_plane.pids == {}
