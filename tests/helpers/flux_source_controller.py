"""Flux's real source-controller on the local control plane, for tests of spec.fluxSource.

Built by ``scripts/tools.sh source_controller`` (v1.9.6, see pkobatch/dev/versions.env) with
its CRDs from the module's ``config/crd/bases`` (``crd/`` next to the binary), which this
installs. It runs as a local process with the admin kubeconfig, leader election off, its
artifact storage in a temporary directory served (and advertised) on loopback, so
``status.artifact.url`` is reachable by the runner's pods (local processes here).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkobatch.dev import processes
from pkobatch.dev.controlplane import install_crds

FLUX_NAMESPACE = "flux-system"


@dataclass
class SourceController:
    storage: Path
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def source_controller(cluster: Any, directory: Path, state: Path) -> Iterator[SourceController]:
    install_crds(cluster.kube, directory / "crd", timeout=120)
    storage = state / "storage"
    storage.mkdir(parents=True)
    storage_port, metrics_port, health_port = (processes.free_port() for _ in range(3))
    log = state / "source-controller.log"
    process = processes.spawn(
        [
            str(directory / "source-controller"),
            f"--storage-path={storage}",
            f"--storage-addr=127.0.0.1:{storage_port}",
            f"--storage-adv-addr=127.0.0.1:{storage_port}",
            f"--metrics-addr=127.0.0.1:{metrics_port}",
            f"--health-addr=127.0.0.1:{health_port}",
            "--enable-leader-election=false",
            "--log-level=debug",
        ],
        log=log,
        env=cluster.env(RUNTIME_NAMESPACE=FLUX_NAMESPACE),
    )
    try:
        processes.wait_until(
            lambda: process.poll() is None and _healthy(health_port),
            timeout=120,
            what=f"source-controller to be ready (log: {log})",
        )
        yield SourceController(storage, log)
    finally:
        processes.stop(process)
