"""Programs' artifacts on the real API server: a Program that no Stack uses gets its
status.artifact from the running controller, whose artifact server (on loopback) answers
status.artifact.url with a tarball of that digest holding the Program as Pulumi.yaml; an
edit moves revision, digest and URL on; an idle Program is not written again."""

from __future__ import annotations

import hashlib
import io
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from helpers.controller_harness import ControllerProcess

from pkobatch.dev.processes import free_port, wait_until
from pkobatch.kube.client import PROGRAMS, Kube

SERVICE = "pkobatch-controller.pkobatch-test.svc:80"


def fetch(port: int, url: str) -> tuple[int, bytes]:
    """GET ``url``'s path from the controller's artifact server on loopback (the URL names
    the in-cluster Service, which this machine cannot resolve)."""
    path = urllib.parse.urlsplit(url).path
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def artifact_at(kube: Kube, namespace: str, name: str, generation: int) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def current() -> bool:
        status = kube.get(PROGRAMS, name, namespace).get("status") or {}
        if status.get("observedGeneration") != generation:
            return False
        found.append(status["artifact"])
        return True

    wait_until(current, timeout=60, what=f"status.artifact of generation {generation}")
    return found[-1]


def project_in(tarball: bytes) -> dict[str, Any]:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        assert tar.getnames() == ["Pulumi.yaml"]
        member = tar.extractfile("Pulumi.yaml")
        assert member is not None
        loaded: dict[str, Any] = yaml.safe_load(member.read())
        return loaded


def test_a_program_without_stacks_gets_a_served_artifact_that_follows_its_edits(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path, controller_rbac: None
) -> None:
    port = free_port()
    settings = {
        "PKOBATCH_PROGRAMS__ADDR": f"127.0.0.1:{port}",
        "PKOBATCH_PROGRAMS__SERVICE_NAMESPACE": "pkobatch-test",
        # Every cached object reconciled again every second: an idle Program must not be
        # written by it.
        "PKOBATCH_RESYNC_PERIOD": "1s",
    }
    process = ControllerProcess(cluster, namespace, tmp_path / "controller", env=settings)
    process.start()
    try:
        body = {"variables": {"greeting": "hello"}, "outputs": {"greeting": "${greeting}"}}
        program = {
            "apiVersion": "pulumi.com/v1",
            "kind": "Program",
            "metadata": {"name": "web", "namespace": namespace},
            "program": body,
        }
        kube.create(PROGRAMS, program, namespace)
        first = artifact_at(kube, namespace, "web", 1)
        assert first["revision"] == "1"
        assert first["url"] == f"http://{SERVICE}/programs/{namespace}/web/1"
        assert first["path"] == f"programs/{namespace}/web/1.tar.gz"

        code, tarball = fetch(port, first["url"])
        assert code == 200
        assert first["digest"] == "sha256:" + hashlib.sha256(tarball).hexdigest()
        assert first["size"] == len(tarball)
        assert project_in(tarball) == {"name": "web", "runtime": "yaml", **body}

        # Resyncs every second and the echo of the write itself: no further write.
        version = kube.get(PROGRAMS, "web", namespace)["metadata"]["resourceVersion"]
        time.sleep(5)
        assert kube.get(PROGRAMS, "web", namespace)["metadata"]["resourceVersion"] == version

        edited = {"outputs": {"greeting": "goodbye"}}
        kube.merge_patch(PROGRAMS, "web", {"program": {"variables": None, **edited}}, namespace)
        second = artifact_at(kube, namespace, "web", 2)
        assert second["revision"] == "2"
        assert second["url"] == f"http://{SERVICE}/programs/{namespace}/web/2"
        assert second["digest"] != first["digest"]
        code, tarball = fetch(port, second["url"])
        assert code == 200
        assert second["digest"] == "sha256:" + hashlib.sha256(tarball).hexdigest()
        assert project_in(tarball) == {"name": "web", "runtime": "yaml", **edited}
        assert fetch(port, first["url"])[0] == 404, "an old generation is not served"
    finally:
        process.stop()
