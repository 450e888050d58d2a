"""The Helm chart on a fresh local control plane, with the real ``helm``: install of the
packaged chart (``helm package``, the ``.tgz`` a release publishes), a Stack to Ready, every
metric the alerts and the dashboard name exported, upgrade with a run in flight, uninstall;
a namespaced release installed from the chart's directory; and the chart pushed to a real
OCI registry (distribution's ``registry`` on loopback, ``helm push``) and installed from it,
as users install what the release workflow pushes.

The chart's Deployment cannot start a pod here (there is no container runtime, and no
ReplicaSet controller), so the test runs what that pod would run, taken from the release's
manifest (``helm get manifest``): the container's command (``pkobatch controller``) and its
environment exactly as rendered (``fieldRef`` metadata.namespace resolved to the release
namespace), with the credentials of the chart's ServiceAccount (a real TokenRequest token
in a kubeconfig instead of the mounted token), so the chart's RBAC, leader election Role and
admission policy are what the controller meets. Settings a pod on a real node would not
need are passed as chart values, so they are in the rendered environment too: the runner
command of the local node agent (``PKOBATCH_JOB__COMMAND``), the loopback git host, short
retry and polling intervals, and free ports for metrics and health.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.controller_harness import (
    INSECURE_HTTP_GIT_HOSTS,
    LOOPBACK_GIT_HOST,
    apply_stack,
    create_secret,
    free_port,
    last_update,
    ready,
    stack_jobs,
    stack_spec,
    wait_stack,
)
from helpers.deploy_render import (
    CHART,
    CI_VALUES,
    KUBECTL,
    KUSTOMIZE,
    REPO,
    assert_same_objects,
    helm,
    rendered,
)
from helpers.promql_names import metric_names

from pkobatch import __version__
from pkobatch.dev.environment import LOCAL_JOB_COMMAND
from pkobatch.dev.processes import spawn, stop, wait_until
from pkobatch.kube.client import (
    CLUSTERROLES,
    CRDS,
    DEPLOYMENTS,
    JOBS,
    NAMESPACES,
    PODS,
    STACKS,
    Kube,
)

JSON = dict[str, Any]
RELEASE = "pkobatch"
RELEASE_NAMESPACE = "pkobatch-system"
TENANT = "team-a"
# Series Prometheus makes itself (not the controller): the scrape's own health.
PROMETHEUS_SERIES = {"up"}


class ChartController:
    """The process the chart's controller pod would run, from the release's manifest."""

    def __init__(
        self, cluster: Any, helm_bin: Path, work_dir: Path, namespace: str = RELEASE_NAMESPACE
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.helm_bin = helm_bin
        self.work_dir = work_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = 0

    def manifest(self) -> list[JSON]:
        done = helm_on(
            self.cluster, self.helm_bin, "get", "manifest", RELEASE, namespace=self.namespace
        )
        return [o for o in yaml.safe_load_all(done.stdout) if o]

    def deployment(self) -> JSON:
        return next(o for o in self.manifest() if o["kind"] == "Deployment")

    def start(self) -> None:
        deployment = self.deployment()
        pod = deployment["spec"]["template"]["spec"]
        container = next(c for c in pod["containers"] if c["name"] == "controller")
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("PKOBATCH_") and name != "KUBECONFIG"
        }
        for entry in container["env"]:
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            else:
                assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
                env[entry["name"]] = deployment["metadata"]["namespace"]
        self.metrics_port = int(env["PKOBATCH_METRICS_ADDR"].rpartition(":")[2])
        # In a pod the client reads the ServiceAccount's mounted token; here the same
        # ServiceAccount's token comes in a kubeconfig.
        env["KUBECONFIG"] = str(
            self.cluster.service_account_kubeconfig(
                self.namespace,
                pod["serviceAccountName"],
                self.work_dir / f"controller-{self.starts}.kubeconfig",
            )
        )
        command = [str(Path(sys.executable).parent / container["command"][0])]
        command += container["command"][1:] + container.get("args", [])
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.work_dir / f"controller-{self.starts}.log"
        self.starts += 1
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.log_path = log_path
        wait_until(self._leading, timeout=120, what="the chart's controller to lead")

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    def _leading(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the controller exited:\n{self.log_path.read_text()[-3000:]}")
        try:
            text = self.scrape()
        except OSError:
            return False
        return 'leader_election_master_status{name="pkobatch-controller"} 1.0' in text

    def stop(self) -> None:
        """SIGTERM, as the kubelet does when a rollout or an uninstall removes the pod."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def helm_on(
    cluster: Any, helm_bin: Path, *args: str, namespace: str = RELEASE_NAMESPACE
) -> subprocess.CompletedProcess[str]:
    return helm(
        helm_bin,
        *args,
        "--namespace",
        namespace,
        "--kubeconfig",
        str(cluster.kubeconfig),
        env={**os.environ, "HELM_CACHE_HOME": str(cluster.state_dir / "helm-cache")},
    )


def create_secrets(kube: Kube, namespace: str, git_server: Any, pulumi_env: Any) -> None:
    """The Secrets stack_spec names: git credentials and the Pulumi passphrase."""
    values = {
        "git": {"username": git_server.username, "password": git_server.password},
        "pulumi": {"passphrase": pulumi_env.passphrase, "token": "a-token"},
    }
    for name, data in values.items():
        create_secret(kube, namespace, name, data)


def monitored_metrics() -> set[str]:
    """Every metric the PrometheusRule's alerts and the Grafana dashboard query."""
    monitoring = KUSTOMIZE / "components" / "monitoring"
    rule = yaml.safe_load((monitoring / "prometheusrule.yaml").read_text())
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    dashboard = yaml.safe_load((monitoring / "pkobatch-dashboard.json").read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return set().union(*(metric_names(expr) for expr in exprs))


def exported_series(text: str) -> set[str]:
    """Names of the series with at least one sample in an exposition."""
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


@pytest.fixture
def chart_controller(
    fresh_cluster: Any, helm_bin: Path, tmp_path: Path
) -> Iterator[ChartController]:
    controller = ChartController(fresh_cluster, helm_bin, tmp_path / "controller")
    yield controller
    controller.stop()


def install_values(
    *, log_level: str = "info", metrics_port: int, health_port: int, runner: bool = True
) -> list[str]:
    """The chart values of this test: the tenant namespace (``runner``), and what a run on the
    local node agent needs (see the module docstring)."""
    settings = {
        "PKOBATCH_JOB__COMMAND": LOCAL_JOB_COMMAND,
        INSECURE_HTTP_GIT_HOSTS: LOOPBACK_GIT_HOST,
        "PKOBATCH_RETRY__BASE": "1s",
        "PKOBATCH_POLL_INTERVAL": "2s",
        "PKOBATCH_JOB__TERMINATION_GRACE_PERIOD": "20s",
    }
    args = ["--set", f"runner.namespaces={{{TENANT}}}"] if runner else []
    args += [
        "--set",
        f"metrics.port={metrics_port}",
        "--set",
        f"health.port={health_port}",
        "--set",
        f"controller.logLevel={log_level}",
    ]
    for name, value in settings.items():
        # --set-json: a comma in the runner command must not split the value.
        args += ["--set-json", f"settings.{name}={json.dumps(value)}"]
    return args


def test_helm_lifecycle_install_reconcile_upgrade_uninstall(
    fresh_cluster: Any,
    helm_bin: Path,
    chart_controller: ChartController,
    git_repo: Callable[..., Any],
    git_server: Any,
    pulumi_env: Any,
    pulumi_bin: Path,
    tmp_path: Path,
) -> None:
    kube = fresh_cluster.kube
    # What the release workflow publishes: the package holds copies of everything the
    # chart reads, so it installs with nothing of the checkout beside it.
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path / "dist"))
    (package,) = (tmp_path / "dist").glob("pkobatch-*.tgz")
    assert package.name == f"pkobatch-{__version__}.tgz"
    assert kube.get_or_none(CRDS, "stacks.pulumi.com") is None, "the cluster is not fresh"
    kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    create_secrets(kube, TENANT, git_server, pulumi_env)
    ports = {"metrics_port": free_port(), "health_port": free_port()}

    # -- install: CRDs from crds/, the controller's objects, the tenant's runner ---------
    helm_on(
        fresh_cluster,
        helm_bin,
        "install",
        RELEASE,
        str(package),
        "--create-namespace",
        *install_values(**ports),
    )
    for crd in ("stacks.pulumi.com", "programs.pulumi.com"):
        assert kube.get_or_none(CRDS, crd) is not None
    chart_controller.start()

    # -- a Stack reaches Ready under the chart's RBAC and settings ------------------------
    repo = git_repo()
    apply_stack(kube, TENANT, "installed", stack_spec(repo, pulumi_env))
    stack = wait_stack(kube, TENANT, "installed", ready, timeout=600, what="Stack Ready")
    assert last_update(stack)["state"] == "succeeded"
    assert sorted(p.name for p in pulumi_env.files_dir.iterdir())

    # -- every metric the alerts and the dashboard name is exported ----------------------
    text = chart_controller.scrape()
    missing = monitored_metrics() - exported_series(text) - PROMETHEUS_SERIES
    assert missing == set(), f"named by the rules or the dashboard, not exported: {missing}"
    assert (
        'controller_runtime_reconcile_total{controller="stack-controller",result="success"}' in text
    )
    assert f'stacks_failing{{name="installed",namespace="{TENANT}"}} 0.0' in text
    assert "stacks_active 1.0" in text

    # -- upgrade with a run in flight: the Job keeps running and its result counts -------
    slow = stack_spec(
        repo,
        pulumi_env,
        config={"directory": str(pulumi_env.files_dir / "slow"), "sleepSeconds": "25"},
    )
    apply_stack(kube, TENANT, "slow", slow)
    running: list[JSON] = []

    def job_running() -> bool:
        jobs = stack_jobs(kube, TENANT, "slow")
        pods = kube.list_objects(PODS, TENANT, label_selector="pkobatch.io/stack=slow")[0]
        running[:] = jobs
        return bool(jobs) and any((p.get("status") or {}).get("phase") == "Running" for p in pods)

    wait_until(job_running, timeout=300, what="the slow Stack's run to be running")
    job = running[0]
    helm_on(
        fresh_cluster,
        helm_bin,
        "upgrade",
        RELEASE,
        str(package),
        *install_values(log_level="debug", **ports),
    )
    deployment = kube.get(DEPLOYMENTS, "pkobatch-controller", RELEASE_NAMESPACE)
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PKOBATCH_LOG_LEVEL", "value": "debug"} in env
    # What a rollout does: the old pod stops, a new one starts with the new template.
    chart_controller.stop()
    chart_controller.start()
    after = kube.get(JOBS, job["metadata"]["name"], TENANT)
    assert after["metadata"]["uid"] == job["metadata"]["uid"]
    stack = wait_stack(kube, TENANT, "slow", ready, timeout=600, what="slow Stack Ready")
    assert last_update(stack)["name"] == job["metadata"]["name"]
    assert [j["metadata"]["uid"] for j in stack_jobs(kube, TENANT, "slow")] == [
        job["metadata"]["uid"]
    ]

    # -- uninstall: the controller goes, Stacks, CRDs and cloud resources stay -----------
    helm_on(fresh_cluster, helm_bin, "uninstall", RELEASE)
    chart_controller.stop()
    assert kube.get_or_none(CLUSTERROLES, "pkobatch-controller") is None
    assert kube.get_or_none(DEPLOYMENTS, "pkobatch-controller", RELEASE_NAMESPACE) is None
    for crd in ("stacks.pulumi.com", "programs.pulumi.com"):
        assert kube.get_or_none(CRDS, crd) is not None, "helm never deletes crds/"
    for name in ("installed", "slow"):
        kept = kube.get(STACKS, name, TENANT)
        assert ready(kept), f"{name} lost its status"
        assert kept["metadata"].get("deletionTimestamp") is None
    # The program's resources (files it manages) are untouched: nothing ran a destroy.
    assert (pulumi_env.files_dir / "slow").is_dir() and any(
        (pulumi_env.files_dir / "slow").iterdir()
    )


def test_namespaced_release_runs_its_namespaces_stacks_with_roles_only(
    fresh_cluster: Any,
    helm_bin: Path,
    git_repo: Callable[..., Any],
    git_server: Any,
    pulumi_env: Any,
    pulumi_bin: Path,
    tmp_path: Path,
) -> None:
    """rbac.scope=namespace (ci/namespaced-values.yaml) after a cluster admin applied crds/:
    no cluster-scoped object, and the controller runs its namespace's Stacks to Ready."""
    kube = fresh_cluster.kube
    namespace = "team-ns"
    admin = subprocess.run(
        [
            str(KUBECTL),
            "--kubeconfig",
            str(fresh_cluster.kubeconfig),
            "apply",
            "-k",
            str(REPO / "crds"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert admin.returncode == 0, admin.stderr
    kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    create_secrets(kube, namespace, git_server, pulumi_env)
    ports = {"metrics_port": free_port(), "health_port": free_port()}
    helm_on(
        fresh_cluster,
        helm_bin,
        "install",
        RELEASE,
        str(CHART),
        "--skip-crds",
        "--values",
        str(CI_VALUES / "namespaced-values.yaml"),
        *install_values(runner=False, **ports),
        namespace=namespace,
    )
    controller = ChartController(fresh_cluster, helm_bin, tmp_path / "controller", namespace)
    assert not [o for o in controller.manifest() if o["kind"].startswith("Cluster")]
    controller.start()
    try:
        apply_stack(kube, namespace, "tenant", stack_spec(git_repo(), pulumi_env))
        wait_stack(kube, namespace, "tenant", ready, timeout=600, what="Stack Ready")
    finally:
        controller.stop()
        helm_on(fresh_cluster, helm_bin, "uninstall", RELEASE, namespace=namespace)


@pytest.fixture
def oci_registry(registry_bin: Path, tmp_path: Path) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a real OCI registry (plain HTTP, no auth) storing in tmp_path,
    on a port the kernel chose: the registry logs the address it listens on."""
    config = tmp_path / "registry" / "config.yml"
    config.parent.mkdir()
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "log": {"level": "info"},
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "registry" / "data")}},
                "http": {"addr": "127.0.0.1:0"},
            }
        )
    )
    log = tmp_path / "registry" / "registry.log"
    # No trace exporter: its default (OTLP) would send spans to localhost:4318.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
    server = spawn([str(registry_bin), "serve", str(config)], log=log, env=env)
    listening: list[str] = []

    def serving() -> bool:
        if server.poll() is not None:
            raise AssertionError(f"the registry exited:\n{log.read_text()[-3000:]}")
        listening[:] = re.findall(r"listening on (127\.0\.0\.1:\d+)", log.read_text())
        return bool(listening)

    try:
        wait_until(serving, timeout=60, what="the OCI registry to listen")
        yield listening[0]
    finally:
        stop(server)


def test_chart_pushed_to_an_oci_registry_installs_the_kustomize_base(
    fresh_cluster: Any, helm_bin: Path, oci_registry: str, tmp_path: Path
) -> None:
    """``helm package``, ``helm push`` to a registry and ``helm install`` from it, as
    docs/install.md tells users: the objects installed (the release's manifest and the chart's
    ``crds/``) are the kustomize base's, each is on the API server, and the chart pulled from
    the registry renders exactly what the source directory renders."""
    helm_env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
    }
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path / "dist"))
    (package,) = (tmp_path / "dist").glob("pkobatch-*.tgz")
    pushed = helm(
        helm_bin, "push", str(package), f"oci://{oci_registry}/charts", "--plain-http", env=helm_env
    )
    assert f"Pushed: {oci_registry}/charts/pkobatch:{__version__}" in pushed.stderr + pushed.stdout
    reference = f"oci://{oci_registry}/charts/pkobatch"
    pull = ["--version", __version__, "--plain-http"]

    helm_on(fresh_cluster, helm_bin, "install", RELEASE, reference, *pull, "--create-namespace")
    try:
        manifest = helm_on(fresh_cluster, helm_bin, "get", "manifest", RELEASE).stdout
        # Helm applies crds/ untemplated and outside the release's manifest: the files of
        # the chart as pulled from the registry. (`helm show crds` joins them without a
        # document separator.)
        pulled = tmp_path / "pulled"
        helm(helm_bin, "pull", reference, *pull, "--untar", "--untardir", str(pulled), env=helm_env)
        crds = [path.read_text() for path in sorted((pulled / "pkobatch" / "crds").glob("*.yaml"))]
        installed = [o for o in yaml.safe_load_all("\n---\n".join([manifest, *crds])) if o]
        assert_same_objects(rendered("base"), installed)
        on_server = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(fresh_cluster.kubeconfig), "get", "-f", "-"],
            input=yaml.safe_dump_all(installed),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert on_server.returncode == 0, f"installed objects missing:\n{on_server.stderr}"

        args = ["--namespace", RELEASE_NAMESPACE, "--include-crds"]
        args += ["--values", str(CI_VALUES / "monitoring-values.yaml")]
        from_registry = helm(
            helm_bin, "template", RELEASE, reference, *pull, *args, env=helm_env
        ).stdout
        from_directory = helm(helm_bin, "template", RELEASE, str(CHART), *args).stdout
        assert from_registry == from_directory
    finally:
        helm_on(fresh_cluster, helm_bin, "uninstall", RELEASE)
