"""The Helm chart (deploy/helm/pkobatch), rendered by the real ``helm``.

One source of truth: for every kustomize install (base, overlays, components, runner) the
chart renders the same objects in substance with the matching ``ci/*-values.yaml``; what
differs is listed here and nowhere else (Helm's own labels, the Namespace object Helm does
not own, the hash suffix kustomize gives a generated ConfigMap, the install's labels on the
CRD, which Helm applies from ``crds/`` untemplated). The kustomize install is
checked against pkobatch's code in test_kustomize.py, so the chart is too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_render import (
    CHART,
    CI_VALUES,
    KUSTOMIZE,
    NAMESPACED_DEFAULT,
    REPO,
    SYSTEM_NAMESPACE,
    Obj,
    helm,
    rendered,
    template,
    user_kustomization,
)
from test_kustomize import names_a_setting

from pkobatch.config import load_settings

HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
# Annotations the chart adds to restart the controller when its input changes (kustomize
# does the same with the ConfigMap's hash suffix).
HELM_ANNOTATIONS = ("checksum/job-template",)
# Cluster-scoped kinds kustomize's built-in schema does not know: it gives them the
# kustomization's namespace, which the API server ignores for them.
CLUSTER_SCOPED_WITHOUT_SCHEMA = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
GENERATED_NAME = re.compile(r"^(pkobatch-job-template)-[a-z0-9]{10}$")


def _generated(name: str) -> str:
    match = GENERATED_NAME.match(name)
    return match.group(1) if match else name


def normalized(obj: Obj) -> Obj:
    """The object in substance: without Helm's bookkeeping labels, kustomize's name hashes,
    and with the controller's env as a name-keyed mapping (order carries no meaning)."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    meta = obj["metadata"]
    meta["name"] = _generated(meta["name"])
    if obj["kind"] in CLUSTER_SCOPED_WITHOUT_SCHEMA:
        meta.pop("namespace", None)
    if obj["kind"] == "ValidatingAdmissionPolicy":
        # CEL ignores whitespace; kustomize re-folds long expressions differently.
        for item in [*obj["spec"].get("validations", []), *obj["spec"].get("matchConditions", [])]:
            item["expression"] = " ".join(item["expression"].split())
    ignored = HELM_LABELS
    if obj["kind"] == "CustomResourceDefinition":
        # Helm installs crds/ files as they are (never templated): no labels of the install.
        ignored = (*HELM_LABELS, "app.kubernetes.io/part-of")
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in ignored}
    meta.pop("labels", None)
    if labels:
        meta["labels"] = labels
    if obj["kind"] == "Deployment":
        template_meta = obj["spec"]["template"]["metadata"]
        annotations = {
            k: v
            for k, v in (template_meta.pop("annotations", None) or {}).items()
            if k not in HELM_ANNOTATIONS
        }
        if annotations:
            template_meta["annotations"] = annotations
        pod = obj["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = _generated(volume["configMap"]["name"])
        # Lists merged by name: their order carries no meaning.
        pod["volumes"] = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for field in ("env", "volumeMounts"):
                container[field] = {e["name"]: e for e in container.get(field, [])}
    if obj["kind"] == "ConfigMap" and "job-template.yaml" in obj.get("data", {}):
        # Text of a YAML file: compare what it says, not its trailing newline.
        obj["data"]["job-template.yaml"] = yaml.safe_load(obj["data"]["job-template.yaml"])
    return obj


def by_key(objects: Iterable[Obj]) -> dict[tuple[str, str, str], Obj]:
    keyed: dict[tuple[str, str, str], Obj] = {}
    for obj in objects:
        meta = normalized(obj)["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in keyed, f"rendered twice: {key}"
        keyed[key] = normalized(obj)
    return keyed


def assert_same_objects(kustomized: Iterable[Obj], charted: Iterable[Obj]) -> None:
    from_kustomize = by_key(kustomized)
    from_chart = by_key(charted)
    # The one object only kustomize installs: Helm does not own the release namespace
    # (`helm install --create-namespace`; docs/install.md says how to label it).
    only_kustomize = {k for k in from_kustomize.keys() - from_chart.keys()}
    assert {k[0] for k in only_kustomize} <= {"Namespace"}, (
        f"kustomize renders objects the chart does not: {sorted(only_kustomize)}; "
        "add them to deploy/helm/pkobatch/templates"
    )
    for key in only_kustomize:
        del from_kustomize[key]
    assert sorted(from_chart.keys() - from_kustomize.keys()) == [], (
        "the chart renders objects kustomize does not"
    )
    for key, obj in from_kustomize.items():
        differences = [
            f"  {path}: kustomize {value!r}, chart {charted!r}"
            for path, value, charted in differing_fields(obj, from_chart[key])
        ]
        assert differences == [], (
            f"{key} differs between deploy/kustomize and deploy/helm/pkobatch (change both):\n"
            + "\n".join(differences)
        )


def fields(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from fields(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from fields(item, f"{path}[{index}]")
    else:
        yield path, value


def differing_fields(left: Obj, right: Obj) -> list[tuple[str, Any, Any]]:
    """Every leaf path where the two objects differ (absent on one side shows as None)."""
    left_fields, right_fields = dict(fields(left)), dict(fields(right))
    return [
        (path, left_fields.get(path), right_fields.get(path))
        for path in sorted(left_fields.keys() | right_fields.keys())
        if left_fields.get(path, ...) != right_fields.get(path, ...)
    ]


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
    """Helm installs crds/ as they are: symbolic links to the repository's crds/ (which a
    unit test keeps equal to what pkobatch generates); `helm package` copies their content."""
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    del generated["kustomization.yaml"]
    charted = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert charted == generated, (
        "deploy/helm/pkobatch/crds/ must link every CRD of crds/: "
        "ln -s ../../../../crds/<file> deploy/helm/pkobatch/crds/"
    )


def test_chart_reads_rbac_rules_and_monitoring_from_deploy_kustomize() -> None:
    """One source: the chart's RBAC rules, admission policy, alerts and dashboard are read
    from deploy/kustomize through links, never copied."""
    linked = CHART / "files" / "kustomize"
    for path in linked.iterdir():
        assert path.is_symlink(), f"{path} must link into deploy/kustomize"
        assert path.resolve().is_relative_to(KUSTOMIZE), path
    assert {p.name for p in linked.iterdir()} == {
        "controller-clusterrole.yaml",
        "runner-clusterrole.yaml",
        "leader-election-role.yaml",
        "controller-secret-policy.yaml",
        "prometheusrule.yaml",
        "pkobatch-dashboard.json",
    }


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
        "job.serviceAccount=automation",
        "job.activeDeadline=2h",
        "job.ttlAfterFinished=6h",
        "job.terminationGracePeriod=5m",
        "job.historyLimit=7",
        "job.podSecurityLevel=restricted",
        "leaderElection.leaseDuration=60s",
        "leaderElection.renewDeadline=45s",
        "leaderElection.retryPeriod=10s",
        "controller.namespaces={team-a,team-b}",
        "settings.PKOBATCH_MAX_ACTIVE_JOBS=9",
        "settings.PKOBATCH_RETRY__MAX_FAILURES=5",
        "image.tag=1.2.3",
        "controller.logLevel=warning",
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
    assert (settings.max_active_jobs, settings.retry.max_failures) == (9, 5)
    assert settings.log_level == "warning"


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


def test_packaged_chart_carries_the_linked_files(helm_bin: Path, tmp_path: Path) -> None:
    """`helm package` copies what crds/ and files/kustomize/ link to: a chart installed from
    the package (a registry, a release asset) renders what the source directory renders."""
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("pkobatch-*.tgz")
    args = ["--namespace", SYSTEM_NAMESPACE, "--include-crds"]
    args += ["--values", str(CI_VALUES / "monitoring-values.yaml")]
    from_package = helm(helm_bin, "template", "pkobatch", str(package), *args).stdout
    from_directory = helm(helm_bin, "template", "pkobatch", str(CHART), *args).stdout
    assert from_package == from_directory
    assert "kind: PrometheusRule" in from_package and "stacks.pulumi.com" in from_package
