"""The local control plane and node agent (``pkobatch.dev.environment``), and the
per-test namespace: everything here is real (docs/development.md).

Session scope
-------------
``cluster`` -> ``Cluster``: one local control plane (etcd, kube-apiserver,
kube-controller-manager built by ``scripts/tools.sh``) plus the node agent that runs the Job
controller's pods as local processes, with ``crds/`` installed.

    cluster.kubeconfig      Path   admin kubeconfig (client certificate in system:masters)
    cluster.server          str    https://127.0.0.1:<port>
    cluster.kube            Kube   admin client (pkobatch.kube.client)
    cluster.state_dir       Path   control-plane state (pki/, control-plane/*.log, pods/)
    cluster.log_dir         Path   pod output: <log_dir>/<namespace>/<pod>.log
    cluster.pod_logs        ApiPodLogs: pods/log through the API server, which the node
                                   agent serves as a kubelet does (pkobatch.kube.pod_logs)
    cluster.tools           Tools  bin dirs: tools.bin_dir("etcd"|"kubernetes"|"pulumi");
                                   ``tools.pulumi`` (``.yaml``, ``.kubernetes_provider``) is
                                   None when not built; the node agent's pods get
                                   ``tools.pulumi_path()`` first on PATH
    cluster.agent           NodeAgent
    cluster.pulumi_image    str    a stock Pulumi image (the CLI, no pkobatch): its pods get
                                   the Pulumi bin dir on PATH but not this interpreter's
    cluster.pulumi_old_image str  an image whose pods get the old Pulumi CLI (``pulumi_old_bin``,
                                   when built) first on PATH, then the Pulumi bin dirs
    cluster.pulumi_mid_image str  the same with the Pulumi CLI between the two (``pulumi_mid_bin``)
    cluster.service_account_kubeconfig(namespace, name, path) -> Path
                                   kubeconfig with a real TokenRequest token for that SA
    cluster.service_account_kube(namespace, name) -> Kube   (closed at session end)
    cluster.env(**extra) -> dict   os.environ + KUBECONFIG=admin,
                                   for subprocesses (e.g. `python -m pkobatch.main controller`)

``flux_crds`` -> Path: Flux's source CRDs, installed; ``flux_source_controller`` ->
``SourceController`` (tests/helpers/flux_source_controller.py): Flux's real source-controller on
``cluster``.

``real_node_tools`` -> ``Tools`` with the real node's components, after checking all it
needs (built components, runc, root).

``node_cluster`` -> ``Cluster`` whose pods run on the real node (``pkobatch.dev.node``:
kubelet, containerd with runc, kube-proxy, kube-scheduler, in a network namespace of their
own) instead of the node agent: ``node_cluster.node`` is the ``RealNode`` (its images are
imported with ``node.import_image``), ``node_cluster.agent`` is None. pkobatch's CRDs are
installed. It needs root and ``scripts/tools.sh node containerd cni_plugins crictl``: with
``CI=true`` a missing piece fails, locally it skips saying what is missing.

Module scope
------------
``fresh_cluster`` -> ``Cluster``: another control plane and node agent like ``cluster``, but
without pkobatch's CRDs (for tests of installers such as ``helm install``).

Function scope
--------------
``kube``       the admin ``Kube`` (same object as ``cluster.kube``).
``namespace``  a fresh namespace (str) holding ServiceAccount ``pkobatch-runner`` (no
               rights granted); deleted after the test (unless the test deleted it).
``node_namespace``  the same on ``node_cluster``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import delete_namespace
from helpers.sentinels import Leak, planted, report, scan_objects

from fixture_plugins.tools import in_ci, require_tools
from pkobatch.dev import processes
from pkobatch.dev.controlplane import ControlPlane, default_crds_dir, install_crds
from pkobatch.dev.environment import NodeKind, dev_environment
from pkobatch.dev.node import NodeError, RealNode, find_runc
from pkobatch.dev.node_agent import NodeAgent
from pkobatch.dev.tools import NODE_TOOLS, VERSION_CHECK_TOOLS, Tools, available_tools, versions
from pkobatch.kube.client import NAMESPACES, SERVICEACCOUNTS, Kube
from pkobatch.kube.pod_logs import ApiPodLogs

RUNNER_SERVICE_ACCOUNT = "pkobatch-runner"
# The image PKO's examples run: the Pulumi CLI and language hosts, no pkobatch.
PULUMI_IMAGE = "pulumi/pulumi:3.134.1-nonroot"
# The image of PKO's PulumiVersionTooLow test: a CLI before `config set-all --json`.
PULUMI_OLD_IMAGE = f"pulumi/pulumi:{versions()['PULUMI_OLD_VERSION']}-nonroot"
# A CLI with `config set-all --json` but older than today's.
PULUMI_MID_IMAGE = f"pulumi/pulumi:{versions()['PULUMI_MID_VERSION']}-nonroot"


@dataclass
class Cluster:
    control_plane: ControlPlane
    agent: NodeAgent | None  # None on the real node
    kube: Kube
    tools: Tools
    _clients: list[Kube] = field(default_factory=list)
    pulumi_image: str = PULUMI_IMAGE
    pulumi_old_image: str = PULUMI_OLD_IMAGE
    pulumi_mid_image: str = PULUMI_MID_IMAGE
    node: RealNode | None = None  # the real node (``node_cluster``)

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def state_dir(self) -> Path:
        return self.control_plane.state_dir

    @property
    def log_dir(self) -> Path:
        assert self.agent is not None, "pods of the real node log through pods/log"
        return self.agent.log_dir

    @property
    def pod_logs(self) -> ApiPodLogs:
        return ApiPodLogs(self.kube)

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        # Valid for longer than any test session.
        return self.control_plane.service_account_kubeconfig(
            namespace, name, path, expiration_seconds=12 * 3600
        )

    def service_account_kube(self, namespace: str, name: str) -> Kube:
        path = self.state_dir / "sa-kubeconfigs" / f"{namespace}.{name}.{uuid.uuid4().hex}"
        client = Kube.connect(str(self.service_account_kubeconfig(namespace, name, path)))
        self._clients.append(client)
        return client

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(extra)
        return env

    def close(self) -> None:
        for client in self._clients:
            client.close()


@contextlib.contextmanager
def in_process_log(path: Path) -> Iterator[None]:
    """The log of pkobatch code running in this process (the node agent), in a file, so
    the sentinel scan reads it too."""
    logger = logging.getLogger("pkobatch")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, sentinel_session: list[Leak]
) -> Iterator[Cluster]:
    require_tools(("etcd", "kubernetes"))
    tools = available_tools()
    processes.exit_on_termination_signals()
    state = tmp_path_factory.mktemp("cluster")
    with in_process_log(state / "in-process.log"):
        yield from _cluster(state, tools, sentinel_session, crds_dir=default_crds_dir())


@pytest.fixture(scope="module")
def fresh_cluster(
    tmp_path_factory: pytest.TempPathFactory, sentinel_session: list[Leak]
) -> Iterator[Cluster]:
    """A second control plane of its own, without pkobatch's CRDs: for installers (helm)
    that must start from an empty cluster. Stopped after the test module."""
    require_tools(("etcd", "kubernetes"))
    state = tmp_path_factory.mktemp("fresh-cluster")
    yield from _cluster(state, available_tools(), sentinel_session, crds_dir=None)


@pytest.fixture(scope="session")
def real_node_tools() -> Tools:
    """What the real node needs, or fail (CI) / skip (locally) saying what is missing: the
    built components, the host's runc, and root (network namespaces, cgroups, mounts)."""
    require_tools(("etcd", "kubernetes", *NODE_TOOLS))
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, cgroups, mounts)")
    try:
        find_runc()
    except NodeError as exc:
        missing.append(str(exc))
    if missing:
        message = "the real node needs " + "; ".join(missing)
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return available_tools(("etcd", "kubernetes", "pulumi", *NODE_TOOLS))


@pytest.fixture(scope="session")
def node_cluster(
    tmp_path_factory: pytest.TempPathFactory, sentinel_session: list[Leak], real_node_tools: Tools
) -> Iterator[Cluster]:
    tools = real_node_tools
    processes.exit_on_termination_signals()
    state = tmp_path_factory.mktemp("node")
    with in_process_log(state / "in-process.log"):
        yield from _cluster(
            state, tools, sentinel_session, crds_dir=default_crds_dir(), node="real"
        )


def _cluster(
    state: Path,
    tools: Tools,
    leaks: list[Leak],
    *,
    crds_dir: Path | None = None,
    node: NodeKind = "agent",
) -> Iterator[Cluster]:
    pulumi_path = tools.pulumi_path()
    image_paths = {PULUMI_IMAGE: pulumi_path}
    older = available_tools(VERSION_CHECK_TOOLS)
    for image, cli in ((PULUMI_OLD_IMAGE, older.pulumi_old), (PULUMI_MID_IMAGE, older.pulumi_mid)):
        if cli is not None:
            # Its own CLI first; the plugins (and the Python dynamic-provider host) from the rest.
            image_paths[image] = [str(cli), *pulumi_path]
    with dev_environment(
        state,
        tools,
        crds_dir=crds_dir,
        # The agent runs at most this many at once; a kubelet takes them as its capacity.
        max_pods=8 if node == "agent" else 32,
        image_paths=image_paths,
        node=node,
    ) as environment:
        result = Cluster(
            environment.control_plane,
            environment.agent,
            environment.kube,
            tools,
            node=environment.node,
        )
        yield result
        leaks.extend(scan_objects(environment.kube, planted()))
        result.close()


@pytest.fixture
def kube(cluster: Cluster) -> Kube:
    return cluster.kube


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _test_namespace(cluster.kube, request.node.name)


@pytest.fixture
def node_namespace(node_cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _test_namespace(node_cluster.kube, request.node.name)


def _test_namespace(kube: Kube, test_name: str) -> Iterator[str]:
    name = _namespace_name(test_name)
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kube.create(
        SERVICEACCOUNTS,
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": RUNNER_SERVICE_ACCOUNT},
        },
        name,
    )
    # Pods naming no ServiceAccount need "default", which a controller creates shortly.
    processes.wait_until(
        lambda: kube.get_or_none(SERVICEACCOUNTS, "default", name) is not None,
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )
    yield name
    try:
        leaks = scan_objects(kube, planted(), name)
    finally:
        delete_namespace(kube, name)
    if leaks:
        pytest.fail(report(leaks, f"objects of namespace {name}"), pytrace=False)


@pytest.fixture(scope="session")
def flux_crds(cluster: Cluster) -> Path:
    """Flux's source CRDs (GitRepository, OCIRepository, Bucket, ...) from the built
    source-controller's module, installed; their directory."""
    directory = require_tools(("source_controller",)).bin_dir("source_controller") / "crd"
    install_crds(cluster.kube, directory, timeout=120)
    return directory


@pytest.fixture(scope="session")
def flux_source_controller(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """``SourceController`` (tests/helpers/flux_source_controller.py): Flux's real source-controller
    running against the local control plane, its CRDs installed, artifacts on loopback."""
    from helpers.flux_source_controller import source_controller

    directory = require_tools(("source_controller",)).bin_dir("source_controller")
    state = tmp_path_factory.mktemp("source-controller")
    with source_controller(cluster, directory, state) as running:
        yield running
