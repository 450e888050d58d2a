"""The Helm chart (deploy/helm/pkobatch), rendered by the real ``helm``.

One source of truth: for every kustomize install (base, overlays, components, runner) the
chart renders the same objects in substance with the matching ``ci/*-values.yaml``; what
differs is listed in ``assert_same_objects`` (tests/helpers/deploy_render.py) and nowhere else
(Helm's own labels, the Namespace object Helm does not own, the hash suffix kustomize gives
a generated ConfigMap, the install's labels on the CRD, which Helm applies from ``crds/``
untemplated). The kustomize install is checked against pkobatch's code in
test_kustomize.py, so the chart is too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml
from helpers.deploy_render import (
    CHART,
    CI_VALUES,
    KUSTOMIZE,
    NAMESPACED_DEFAULT,
    REPO,
    SYSTEM_NAMESPACE,
    Obj,
    assert_same_objects,
    helm,
    rendered,
    template,
    user_kustomization,
)
from test_kustomize import names_a_setting

from pkobatch.config import load_settings
from pkobatch.dev.chart import CHART as CHART_DIR
from pkobatch.dev.chart import CRDS, chart_copies, drifted, sync

# --- one source of truth ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("install", "values", "namespace", "crds"),
    [
        ("base", [], SYSTEM_NAMESPACE, True),
        ("overlays/dev", ["dev"], SYSTEM_NAMESPACE, True),
        ("overlays/prod", ["prod"], SYSTEM_NAMESPACE, True),
        ("overlays/namespaced", ["namespaced"], NAMESPACED_DEFAULT, False),
        ("overlays/sharded", ["sharded"], SYSTEM_NAMESPACE, True),
    ],
)
def test_chart_renders_what_kustomize_renders(
    helm_bin: Path, install: str, values: list[str], namespace: str, crds: bool
) -> None:
    assert_same_objects(rendered(install), template(helm_bin, values, namespace, crds=crds))


@pytest.mark.parametrize(
    ("install", "component", "values"),
    [
        ("overlays/prod", "job-template", ["prod", "job-template"]),
        ("base", "monitoring", ["monitoring"]),
        ("overlays/dev", "monitoring", ["dev", "monitoring"]),
        ("base", "push-receiver", ["push-receiver"]),
        ("overlays/prod", "push-receiver", ["prod", "push-receiver"]),
        ("base", "secure-metrics", ["secure-metrics"]),
        ("overlays/prod", "secure-metrics", ["prod", "secure-metrics"]),
        ("base", "run-cache", ["run-cache"]),
        ("overlays/prod", "run-cache", ["prod", "run-cache"]),
    ],
)
def test_chart_values_render_what_the_components_add(
    helm_bin: Path, tmp_path: Path, install: str, component: str, values: list[str]
) -> None:
    kustomized = user_kustomization(
        tmp_path, [KUSTOMIZE / install], [KUSTOMIZE / "components" / component]
    )
    assert_same_objects(kustomized, template(helm_bin, values))


def test_runner_namespaces_get_what_deploy_kustomize_runner_gives(
    helm_bin: Path, tmp_path: Path
) -> None:
    kustomized = user_kustomization(tmp_path, [KUSTOMIZE / "runner"], namespace="team-a")
    charted = template(helm_bin, sets=["runner.namespaces={team-a,team-b}"])
    for namespace in ("team-a", "team-b"):
        in_namespace = [o for o in charted if o["metadata"].get("namespace") == namespace]
        expected = [
            yaml.safe_load(yaml.safe_dump(o).replace("team-a", namespace)) for o in kustomized
        ]
        assert_same_objects(expected, in_namespace)


def test_chart_crds_are_the_generated_ones() -> None:
    """Helm installs crds/ as they are: copies of the repository's crds/ (which a unit test
    keeps equal to what pkobatch generates)."""
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    del generated["kustomization.yaml"]
    charted = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert charted == generated, "run: python -m pkobatch.dev.chart"


def test_the_chart_holds_no_link_and_its_copies_match_their_sources() -> None:
    """Flux's source-controller leaves symbolic links out of a GitRepository's artifact: the
    chart's CRDs, RBAC rules, admission policy, alerts and dashboard are copies of crds/ and
    deploy/kustomize, kept in step by pkobatch.dev.chart."""
    links = [str(p.relative_to(REPO)) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == []
    assert drifted() == [], "run: python -m pkobatch.dev.chart"
    assert {p.name for p in (CHART / "files" / "kustomize").iterdir()} == {
        "controller-clusterrole.yaml",
        "runner-clusterrole.yaml",
        "leader-election-role.yaml",
        "controller-secret-policy.yaml",
        "prometheusrule.yaml",
        "pkobatch-dashboard.json",
    }


def test_drift_is_found_and_sync_repairs_it(tmp_path: Path) -> None:
    for source in {*chart_copies().values(), CRDS / "kustomization.yaml"}:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_bytes((REPO / source).read_bytes())
    assert len(sync(tmp_path)) == len(chart_copies()) == 10
    assert drifted(tmp_path) == []
    rules = tmp_path / CHART_DIR / "files" / "kustomize" / "runner-clusterrole.yaml"
    rules.write_text(rules.read_text() + "# edited\n")
    stale = tmp_path / CHART_DIR / "crds" / "pulumi.com_old.yaml"
    stale.write_text("kind: CustomResourceDefinition\n")
    crd = tmp_path / CHART_DIR / "crds" / "pulumi.com_stacks.yaml"
    crd.unlink()
    crd.symlink_to(tmp_path / CRDS / "pulumi.com_stacks.yaml")
    assert sorted(drifted(tmp_path)) == [
        f"{CHART_DIR}/crds/pulumi.com_old.yaml: has no source",
        f"{CHART_DIR}/crds/pulumi.com_stacks.yaml: not a copy of crds/pulumi.com_stacks.yaml",
        f"{CHART_DIR}/files/kustomize/runner-clusterrole.yaml: differs from "
        "deploy/kustomize/base/runner-clusterrole.yaml",
    ]
    assert sorted(map(str, sync(tmp_path))) == [
        f"{CHART_DIR}/crds/pulumi.com_old.yaml",
        f"{CHART_DIR}/crds/pulumi.com_stacks.yaml",
        f"{CHART_DIR}/files/kustomize/runner-clusterrole.yaml",
    ]
    assert drifted(tmp_path) == [] and not crd.is_symlink()


# --- the chart's own values ---------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [[], *([p.name.removesuffix("-values.yaml")] for p in sorted(CI_VALUES.glob("*-values.yaml")))],
)
def test_helm_lint_passes(helm_bin: Path, values: list[str]) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", SYSTEM_NAMESPACE]
    for name in values:
        args += ["--values", str(CI_VALUES / f"{name}-values.yaml")]
    helm(helm_bin, *args)


def controller_env(objects: Iterable[Obj]) -> dict[str, Obj]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {entry["name"]: entry for entry in container["env"]}


def test_job_defaults_and_settings_become_settings_the_controller_accepts(
    helm_bin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sets = [
        "job.image=registry.example.com/runner:1",
        "job.imagePullPolicy=Always",
        "runner.serviceAccount.name=automation",
        "job.activeDeadline=2h",
        "job.ttlAfterFinished=6h",
        "job.terminationGracePeriod=5m",
        "job.historyLimit=7",
        "job.podSecurityLevel=restricted",
        "leaderElection.leaseDuration=60s",
        "leaderElection.renewDeadline=45s",
        "leaderElection.retryPeriod=10s",
        "controller.namespaces={team-a,team-b}",
        "controller.namespaceSelector=pulumi=enabled",
        "flux.maxUntarSizeBytes=524288000",
        "settings.PKOBATCH_MAX_ACTIVE_JOBS=9",
        "settings.PKOBATCH_RETRY__MAX_FAILURES=5",
        "image.tag=1.2.3",
        "controller.logLevel=warning",
        "runCache.enabled=true",
        "runCache.storageClass=efs",
        "runCache.size=20Gi",
        "runCache.accessMode=ReadWriteOnce",
    ]
    env = controller_env(template(helm_bin, sets=sets))
    names = [name for name in env if name.startswith("PKOBATCH_")]
    assert [name for name in names if not names_a_setting(name)] == []
    for name in [n for n in os.environ if n.startswith("PKOBATCH_")]:
        monkeypatch.delenv(name)
    for name, entry in env.items():
        monkeypatch.setenv(name, entry.get("value", SYSTEM_NAMESPACE))
    settings = load_settings()
    assert settings.job.image == "registry.example.com/runner:1"
    assert settings.job.image_pull_policy == "Always"
    assert settings.job.service_account == "automation"
    assert settings.job.active_deadline.total_seconds() == 7200
    assert settings.job.ttl_after_finished.total_seconds() == 6 * 3600
    assert settings.job.termination_grace_period.total_seconds() == 300
    assert settings.job.history_limit == 7
    assert settings.job.pod_security_level == "restricted"
    assert settings.leader_election.lease_duration.total_seconds() == 60
    assert settings.namespaces == ["team-a", "team-b"]
    assert settings.namespace_selector == "pulumi=enabled"
    assert settings.job.flux_max_untar_size_bytes == 524288000
    assert (settings.max_active_jobs, settings.retry.max_failures) == (9, 5)
    assert settings.log_level == "warning"
    cache = settings.run_cache
    assert (cache.enabled, cache.storage_class, cache.size, cache.access_mode) == (
        True,
        "efs",
        "20Gi",
        "ReadWriteOnce",
    )


def test_the_runs_use_the_runner_image_at_the_controller_images_tag(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        sets=["image.repository=registry.example.com/pkobatch/controller", "image.tag=2.0.0"],
    )
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/pkobatch/controller:2.0.0"
    assert controller_env(objects)["PKOBATCH_JOB__IMAGE"]["value"] == "pkobatch/runner:2.0.0"


def test_namespaced_scope_grants_roles_in_every_watched_namespace(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        ["namespaced"],
        NAMESPACED_DEFAULT,
        crds=False,
        sets=["controller.namespaces={team-a,team-b}", "runner.namespaces={team-b}"],
    )
    assert not [o for o in objects if o["kind"].startswith("Cluster")]
    placed = {(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in objects}
    for namespace in ("team-a", "team-b"):
        for kind, name in [
            ("Role", "pkobatch-controller"),
            ("RoleBinding", "pkobatch-controller"),
            ("Role", "pkobatch-runner"),
            ("ServiceAccount", "pkobatch-runner"),
            ("RoleBinding", "pkobatch-runner"),
        ]:
            assert (kind, name, namespace) in placed
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
    assert controller_env(objects)["PKOBATCH_NAMESPACES"]["value"] == "team-a,team-b"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["rbac.scope=everywhere"], "rbac.scope must be cluster or namespace"),
        (["replicaCount=2", "leaderElection.enabled=false"], "needs leaderElection.enabled"),
        (["settings.MAX_ACTIVE_JOBS=3"], "MAX_ACTIVE_JOBS is not a pkobatch setting"),
        (
            ["rbac.scope=namespace", "runner.namespaces={elsewhere}"],
            "elsewhere is not watched",
        ),
        (["sharding.shards={Blue}"], '"Blue" is not a shard name'),
        (["sharding.shards={blue,blue}"], "blue is listed twice"),
        (["rbac.scope=namespace", "metrics.secure=true"], "metrics.secure needs rbac.scope"),
        (
            ["rbac.scope=namespace", "controller.namespaceSelector=pulumi"],
            "controller.namespaceSelector needs rbac.scope=cluster",
        ),
    ],
)
def test_values_that_cannot_work_are_refused_with_a_reason(
    helm_bin: Path, sets: list[str], message: str
) -> None:
    args = ["template", "pkobatch", str(CHART)]
    for assignment in sets:
        args += ["--set", assignment]
    done = helm(helm_bin, *args, check=False)
    assert done.returncode != 0
    assert message in done.stderr


def test_packaged_chart_renders_what_the_directory_renders(helm_bin: Path, tmp_path: Path) -> None:
    """A chart installed from the package (a registry, a release asset) renders what the
    source directory renders, CRDs, rules, alerts and dashboard included."""
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("pkobatch-*.tgz")
    args = ["--namespace", SYSTEM_NAMESPACE, "--include-crds"]
    args += ["--values", str(CI_VALUES / "monitoring-values.yaml")]
    from_package = helm(helm_bin, "template", "pkobatch", str(package), *args).stdout
    from_directory = helm(helm_bin, "template", "pkobatch", str(CHART), *args).stdout
    assert from_package == from_directory
    assert "kind: PrometheusRule" in from_package and "stacks.pulumi.com" in from_package
