"""The chart's values for platform teams (deploy/helm/pkobatch/values.yaml), each rendered by
the real ``helm``: the controller's and the runners' ServiceAccounts, RBAC switches and extra
rules, the aggregation into the built-in view/edit/admin roles, pod and Deployment metadata,
security contexts, extra volumes and containers, the priority class and the ServiceMonitor's
relabelings. Their defaults render what deploy/kustomize/base renders (test_helm_chart.py);
the aggregation on a real control plane is tests/integration/test_helm_values_on_cluster.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.deploy_render import NAMESPACED_DEFAULT, Obj, helm, template
from test_helm_chart import CHART, controller_env

from pkobatch.cli.diagnostics import CONTROLLER_SELECTOR, controller_deployments

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def named(objects: Iterable[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    found = [
        o
        for o in objects
        if (o["kind"], o["metadata"]["name"]) == (kind, name)
        and namespace in (None, o["metadata"].get("namespace"))
    ]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployments(objects: Iterable[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] == "Deployment"]


def pod_spec(objects: Iterable[Obj]) -> Obj:
    spec: Obj = named(objects, "Deployment", "pkobatch-controller")["spec"]["template"]["spec"]
    return spec


def runner_account_env(objects: Iterable[Obj]) -> str | None:
    """The controller's PKOBATCH_JOB__SERVICE_ACCOUNT (None: unset, the controller's default)."""
    entry = controller_env(objects).get("PKOBATCH_JOB__SERVICE_ACCOUNT")
    return None if entry is None else str(entry["value"])


def controller_container(objects: Iterable[Obj]) -> Obj:
    container: Obj = next(c for c in pod_spec(objects)["containers"] if c["name"] == "controller")
    return container


# --- ServiceAccounts -----------------------------------------------------------------------


def test_the_controller_service_account_takes_its_name_and_annotations(
    helm_bin: Path, tmp_path: Path
) -> None:
    role_arn = "arn:aws:iam::111122223333:role/pkobatch-controller"
    objects = template(
        helm_bin,
        value_files=[
            values_file(
                tmp_path,
                {
                    "serviceAccount": {
                        "name": "infra-pkobatch",
                        "annotations": {"eks.amazonaws.com/role-arn": role_arn},
                    }
                },
            )
        ],
    )
    account = named(objects, "ServiceAccount", "infra-pkobatch", "pkobatch-system")
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role_arn}
    assert not [
        o
        for o in objects
        if o["metadata"]["name"] == "pkobatch-controller" and o["kind"] == "ServiceAccount"
    ]
    assert pod_spec(objects)["serviceAccountName"] == "infra-pkobatch"
    for binding in ("pkobatch-controller", "pkobatch-leader-election"):
        kind = "ClusterRoleBinding" if binding == "pkobatch-controller" else "RoleBinding"
        subjects = named(objects, kind, binding)["subjects"]
        assert subjects == [
            {"kind": "ServiceAccount", "name": "infra-pkobatch", "namespace": "pkobatch-system"}
        ]
    # The admission policy on the controller's Secrets names the same account.
    policy = named(objects, "ValidatingAdmissionPolicy", "pkobatch-controller-secrets")
    (condition,) = policy["spec"]["matchConditions"]
    assert "endsWith(':infra-pkobatch')" in condition["expression"]
    assert "pkobatch-controller'" not in condition["expression"]


def test_an_existing_controller_service_account_is_used_not_created(helm_bin: Path) -> None:
    objects = template(
        helm_bin, sets=["serviceAccount.create=false", "serviceAccount.name=platform-pkobatch"]
    )
    assert [o for o in objects if o["kind"] == "ServiceAccount"] == []
    assert pod_spec(objects)["serviceAccountName"] == "platform-pkobatch"
    subjects = named(objects, "ClusterRoleBinding", "pkobatch-controller")["subjects"]
    assert [s["name"] for s in subjects] == ["platform-pkobatch"]


def test_runner_service_accounts_carry_the_workload_identity_annotations(
    helm_bin: Path, tmp_path: Path
) -> None:
    annotations = {
        "iam.gke.io/gcp-service-account": "runs@project.iam.gserviceaccount.com",
        "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/pkobatch-runs",
    }
    objects = template(
        helm_bin,
        value_files=[
            values_file(
                tmp_path,
                {
                    "runner": {
                        "namespaces": ["team-a", "team-b"],
                        "serviceAccount": {"annotations": annotations},
                    }
                },
            )
        ],
    )
    for namespace in ("team-a", "team-b"):
        account = named(objects, "ServiceAccount", "pkobatch-runner", namespace)
        assert account["metadata"]["annotations"] == annotations
        named(objects, "RoleBinding", "pkobatch-runner", namespace)
    # The controller's own account is not the runs' and gets none of it.
    controller = named(objects, "ServiceAccount", "pkobatch-controller")
    assert "annotations" not in controller["metadata"]


def test_the_runner_service_account_takes_its_name_and_the_runs_use_it(
    helm_bin: Path,
) -> None:
    objects = template(
        helm_bin, sets=["runner.namespaces={team-a}", "runner.serviceAccount.name=tenant-runs"]
    )
    named(objects, "ServiceAccount", "tenant-runs", "team-a")
    binding = named(objects, "RoleBinding", "tenant-runs", "team-a")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "pkobatch-runner",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tenant-runs", "namespace": "team-a"}
    ]
    assert runner_account_env(objects) == "tenant-runs"
    assert not [
        o
        for o in objects
        if o["metadata"]["name"] == "pkobatch-runner" and o["kind"] != "ClusterRole"
    ]
    # By default the controller keeps its own default, pkobatch-runner, as deploy/kustomize does.
    assert runner_account_env(template(helm_bin, sets=["runner.namespaces={team-a}"])) is None


def test_an_existing_runner_service_account_is_bound_not_created(helm_bin: Path) -> None:
    objects = template(
        helm_bin,
        sets=[
            "runner.namespaces={team-a}",
            "runner.serviceAccount.create=false",
            "runner.serviceAccount.name=automation",
        ],
    )
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"] == [
        "pkobatch-controller"
    ]
    subjects = named(objects, "RoleBinding", "automation", "team-a")["subjects"]
    assert [s["name"] for s in subjects] == ["automation"]
    assert runner_account_env(objects) == "automation"


# --- RBAC ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "namespace", "sets"),
    [
        ("cluster", "pkobatch-system", ["runner.namespaces={team-a}"]),
        ("namespace", NAMESPACED_DEFAULT, []),
    ],
)
def test_rbac_create_false_renders_no_role_or_binding(
    helm_bin: Path, scope: str, namespace: str, sets: list[str]
) -> None:
    with_rbac = template(
        helm_bin, namespace=namespace, crds=False, sets=[f"rbac.scope={scope}", *sets]
    )
    without = template(
        helm_bin,
        namespace=namespace,
        crds=False,
        sets=[f"rbac.scope={scope}", "rbac.create=false", *sets],
    )
    assert [o for o in with_rbac if o["kind"] in RBAC_KINDS]
    assert [o["kind"] for o in without if o["kind"] in RBAC_KINDS] == []
    # Everything else stays: the ServiceAccounts the user's own bindings will name included.
    assert sorted(
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""))
        for o in with_rbac
        if o["kind"] not in RBAC_KINDS
    ) == sorted(
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")) for o in without
    )
    assert ("ServiceAccount", "pkobatch-runner") in {
        (o["kind"], o["metadata"]["name"]) for o in without
    }


def test_extra_rules_are_added_to_the_controllers_role(helm_bin: Path, tmp_path: Path) -> None:
    rule = {
        "apiGroups": ["source.example.com"],
        "resources": ["gitmirrors"],
        "verbs": ["get", "list", "watch"],
    }
    files = [values_file(tmp_path, {"rbac": {"extraRules": [rule]}})]
    default_rules = named(template(helm_bin), "ClusterRole", "pkobatch-controller")["rules"]
    rules = named(template(helm_bin, value_files=files), "ClusterRole", "pkobatch-controller")[
        "rules"
    ]
    assert rules == [*default_rules, rule]
    namespaced = template(
        helm_bin,
        ["namespaced"],
        NAMESPACED_DEFAULT,
        crds=False,
        sets=["controller.namespaces={team-a,team-b}"],
        value_files=files,
    )
    for namespace in ("team-a", "team-b"):
        assert named(namespaced, "Role", "pkobatch-controller", namespace)["rules"][-1] == rule
    # Not the runs' role: extra rules are the controller's.
    assert rule not in named(namespaced, "Role", "pkobatch-runner", "team-a")["rules"]


def test_aggregation_roles_extend_view_edit_and_admin_with_stacks_and_programs(
    helm_bin: Path,
) -> None:
    objects = template(helm_bin)
    view = named(objects, "ClusterRole", "pkobatch-view")
    edit = named(objects, "ClusterRole", "pkobatch-edit")

    def aggregated_into(role: Obj) -> set[str]:
        labels = role["metadata"]["labels"]
        return {
            k.removeprefix(AGGREGATE)
            for k, v in labels.items()
            if k.startswith(AGGREGATE) and v == "true"
        }

    assert aggregated_into(view) == {"view", "edit", "admin"}
    assert aggregated_into(edit) == {"edit", "admin"}
    assert {verb for rule in view["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}
    for role in (view, edit):
        groups = {group for rule in role["rules"] for group in rule["apiGroups"]}
        assert groups == {"pulumi.com", "auto.pulumi.com"}
    assert {"create", "update", "patch", "delete"} <= {
        verb for rule in edit["rules"] for verb in rule["verbs"]
    }
    # The controller writes status; edit users do not.
    edited = {r for rule in edit["rules"] for r in rule["resources"]}
    assert {"stacks/status", "workspaces/status", "updates/status"}.isdisjoint(edited)


@pytest.mark.parametrize(
    ("sets", "namespace"),
    [
        (["rbac.aggregateToDefaultRoles=false"], "pkobatch-system"),
        (["rbac.create=false"], "pkobatch-system"),
        (["rbac.scope=namespace"], NAMESPACED_DEFAULT),
    ],
)
def test_aggregation_roles_can_be_left_out(helm_bin: Path, sets: list[str], namespace: str) -> None:
    objects = template(helm_bin, namespace=namespace, crds=False, sets=sets)
    assert not [o for o in objects if o["metadata"]["name"] in ("pkobatch-view", "pkobatch-edit")]


# --- the controller's pods -----------------------------------------------------------------


def test_pod_labels_and_annotations_go_on_every_controller_pod_not_its_selector(
    helm_bin: Path, tmp_path: Path
) -> None:
    values = {
        "sharding": {"shards": ["blue"]},
        "controller": {
            "podLabels": {"team": "platform", "sidecar.istio.io/inject": "false"},
            "podAnnotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
            "deploymentAnnotations": {"reloader.stakater.com/auto": "true"},
        },
    }
    objects = template(helm_bin, value_files=[values_file(tmp_path, values)])
    assert len(deployments(objects)) == 2
    for deployment in deployments(objects):
        pod_meta = deployment["spec"]["template"]["metadata"]
        assert pod_meta["labels"]["team"] == "platform"
        assert pod_meta["labels"]["sidecar.istio.io/inject"] == "false"
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert "team" not in selector
        assert selector.items() <= pod_meta["labels"].items()
        assert pod_meta["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
        assert deployment["metadata"]["annotations"] == {"reloader.stakater.com/auto": "true"}
        assert "reloader.stakater.com/auto" not in pod_meta["annotations"]


def test_pod_labels_that_would_change_the_selector_are_refused(helm_bin: Path) -> None:
    done = helm(
        helm_bin,
        "template",
        "pkobatch",
        str(CHART),
        "--set",
        "controller.podLabels.app\\.kubernetes\\.io/name=other",
        check=False,
    )
    assert done.returncode != 0
    assert "controller.podLabels: app.kubernetes.io/name is a label the Deployment's selector" in (
        done.stderr
    )


def test_security_contexts_keep_secure_defaults_and_drop_what_openshift_assigns(
    helm_bin: Path,
) -> None:
    default = template(helm_bin)
    assert pod_spec(default)["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert controller_container(default)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # OpenShift's restricted-v2 SCC assigns the UID (and GID) from the namespace's range.
    openshift = template(
        helm_bin,
        sets=[
            "controller.podSecurityContext.runAsUser=null",
            "controller.podSecurityContext.runAsGroup=null",
        ],
    )
    assert pod_spec(openshift)["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert (
        controller_container(openshift)["securityContext"]
        == (controller_container(default)["securityContext"])
    )
    changed = template(
        helm_bin,
        sets=[
            "controller.podSecurityContext.fsGroup=2000",
            "controller.securityContext.readOnlyRootFilesystem=false",
        ],
    )
    assert pod_spec(changed)["securityContext"]["fsGroup"] == 2000
    assert controller_container(changed)["securityContext"]["readOnlyRootFilesystem"] is False


def test_extra_volumes_containers_and_priority_class_are_added(
    helm_bin: Path, tmp_path: Path
) -> None:
    ca = {"name": "corporate-ca", "configMap": {"name": "corporate-ca"}}
    mount = {"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}
    init = {"name": "wait-for-proxy", "image": "busybox:1.36", "command": ["true"]}
    sidecar = {"name": "proxy", "image": "registry.example.com/egress-proxy:2"}
    values = {
        "job": {"template": "apiVersion: batch/v1\nkind: Job\n"},
        "controller": {
            "extraVolumes": [ca],
            "extraVolumeMounts": [mount],
            "initContainers": [init],
            "extraContainers": [sidecar],
            "priorityClassName": "platform-critical",
        },
    }
    objects = template(helm_bin, value_files=[values_file(tmp_path, values)])
    pod = pod_spec(objects)
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["initContainers"] == [init]
    assert [c["name"] for c in pod["containers"]] == ["controller", "proxy"]
    assert pod["containers"][1] == sidecar
    # Added to the chart's own volumes and mounts (/tmp, the Job template), not in their place.
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "job-template", "corporate-ca"]
    assert pod["volumes"][-1] == ca
    mounts = controller_container(objects)["volumeMounts"]
    assert [m["name"] for m in mounts] == ["tmp", "job-template", "corporate-ca"]
    assert mounts[-1] == mount
    default = pod_spec(template(helm_bin))
    assert "priorityClassName" not in default and "initContainers" not in default


def test_service_monitor_takes_relabelings_and_metric_relabelings(
    helm_bin: Path, tmp_path: Path
) -> None:
    relabelings = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    metric_relabelings = [{"sourceLabels": ["__name__"], "regex": "python_gc_.*", "action": "drop"}]
    values = {
        "serviceMonitor": {
            "enabled": True,
            "relabelings": relabelings,
            "metricRelabelings": metric_relabelings,
        }
    }
    objects = template(helm_bin, value_files=[values_file(tmp_path, values)])
    (endpoint,) = named(objects, "ServiceMonitor", "pkobatch-controller")["spec"]["endpoints"]
    assert endpoint["relabelings"] == relabelings
    assert endpoint["metricRelabelings"] == metric_relabelings
    (default,) = named(
        template(helm_bin, sets=["serviceMonitor.enabled=true"]),
        "ServiceMonitor",
        "pkobatch-controller",
    )["spec"]["endpoints"]
    assert "relabelings" not in default and "metricRelabelings" not in default


def test_helm_lint_passes_with_every_value_of_this_module_set(
    helm_bin: Path, tmp_path: Path
) -> None:
    container = {"name": "proxy", "image": "registry.example.com/egress-proxy:2"}
    values = {
        "serviceAccount": {"name": "infra-pkobatch", "annotations": {"a.example.com/b": "c"}},
        "rbac": {"extraRules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]},
        "runner": {
            "namespaces": ["team-a"],
            "serviceAccount": {"create": False, "name": "automation", "annotations": {"x": "y"}},
        },
        "controller": {
            "podLabels": {"team": "platform"},
            "podAnnotations": {"a": "b"},
            "deploymentAnnotations": {"c": "d"},
            "podSecurityContext": {"runAsUser": None, "runAsGroup": None},
            "securityContext": {"readOnlyRootFilesystem": False},
            "priorityClassName": "platform-critical",
            "extraVolumes": [{"name": "cache", "emptyDir": {}}],
            "extraVolumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "initContainers": [container],
            "extraContainers": [container | {"name": "sidecar"}],
            "namespaceSelector": "team in (infra,data),!legacy",
        },
        "flux": {"maxUntarSizeBytes": -1},
        "serviceMonitor": {
            "enabled": True,
            "relabelings": [{"targetLabel": "cluster", "replacement": "eu-1"}],
            "metricRelabelings": [{"sourceLabels": ["__name__"], "action": "keep"}],
        },
    }
    path = values_file(tmp_path, values)
    done = helm(helm_bin, "lint", "--strict", str(CHART), "--values", str(path))
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


# --- names -----------------------------------------------------------------------------------

EVERYTHING_ON = [
    "sharding.shards[0]=blue",
    "pushReceiver.enabled=true",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "podDisruptionBudget.enabled=true",
    "job.template=kind: Job",
    "runner.namespaces[0]=team-a",
]
# The names tenants and users bind to (docs/install.md, "Names"): never renamed.
FIXED_NAMESPACED = {("Role", "pkobatch-runner")}


def identities(objects: Iterable[Obj]) -> set[tuple[str, str | None, str]]:
    return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether ``labels`` match a selector of `key=value` and `key in (a,b)` terms, the forms
    the CLI's CONTROLLER_SELECTOR uses."""
    for term in re.split(r",(?![^(]*\))", selector):
        if " in (" in term:
            key, values = term.split(" in (")
            if labels.get(key) not in values.rstrip(")").split(","):
                return False
        else:
            key, value = term.split("=")
            if labels.get(key) != value:
                return False
    return True


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_fullname_override_renames_the_charts_own_objects_not_the_contract(
    helm_bin: Path, scope: str
) -> None:
    sets = [*EVERYTHING_ON, f"rbac.scope={scope}", "controller.namespaces[0]=team-a"]
    default = template(helm_bin, sets=sets)
    renamed = template(helm_bin, sets=[*sets, "fullnameOverride=acme-pko"])

    def own(objects: Iterable[Obj]) -> set[tuple[str, str | None, str]]:
        return {
            identity
            for identity in identities(objects)
            if identity[1] is not None and (identity[0], identity[2]) not in FIXED_NAMESPACED
        }

    assert len(own(default)) >= 12
    assert all(name.startswith("pkobatch-") or name == "pkobatch" for _, _, name in own(default))
    assert own(renamed) == {
        (kind, namespace, "acme-pko" + name.removeprefix("pkobatch"))
        for kind, namespace, name in own(default)
    }
    contract = identities(default) - own(default)
    assert contract == identities(renamed) - own(renamed)
    assert ("ServiceAccount", "team-a", "acme-pko-runner") in identities(renamed)
    assert runner_account_env(renamed) == "acme-pko-runner"
    assert ("CustomResourceDefinition", None, "stacks.pulumi.com") in contract
    # The references follow: ServiceAccount, bound Roles, the job template's ConfigMap.
    spec = named(renamed, "Deployment", "acme-pko-controller")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "acme-pko-controller"
    assert {v.get("configMap", {}).get("name") for v in spec["volumes"]} >= {
        "acme-pko-job-template"
    }
    for binding in (o for o in renamed if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        assert [
            o for o in renamed if (o["kind"], o["metadata"]["name"]) == (ref["kind"], ref["name"])
        ]
        subjects = {s["name"] for s in binding["subjects"]}
        assert subjects <= {"acme-pko-controller", "acme-pko-runner"}, binding


def test_alerts_and_the_cli_find_a_renamed_controller(helm_bin: Path) -> None:
    objects = template(
        helm_bin, sets=[*EVERYTHING_ON, "fullnameOverride=acme-pko", "nameOverride=acme"]
    )
    service = named(objects, "Service", "acme-pko-controller-metrics")
    rules = named(objects, "PrometheusRule", "acme-pko")["spec"]["groups"]
    exprs = [rule["expr"] for group in rules for rule in group["rules"]]
    jobs = {job for expr in exprs for job in re.findall(r'job="([^"]*)"', expr)}
    # Prometheus Operator names the scrape job after the Service.
    assert jobs == {"acme-pko-controller-metrics"}
    monitor = named(objects, "ServiceMonitor", "acme-pko-controller")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )

    found = controller_deployments(deployments(objects))
    assert found.main is not None and found.main["metadata"]["name"] == "acme-pko-controller"
    assert [(shard, d["metadata"]["name"]) for shard, d in found.shards] == [
        ("blue", "acme-pko-controller-blue")
    ]
    for deployment in deployments(objects):
        assert selector_matches(CONTROLLER_SELECTOR, deployment["metadata"]["labels"])
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector_matches(CONTROLLER_SELECTOR, pod_labels)
        assert pod_labels["app.kubernetes.io/name"] == "acme"
    # The metrics Service still selects every controller pod, main and shard.
    for deployment in deployments(objects):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()


def test_a_fullname_too_long_for_the_metrics_service_is_refused(helm_bin: Path) -> None:
    longest = "a" * 40
    template(helm_bin, sets=[f"fullnameOverride={longest}"])
    done = helm(
        helm_bin,
        "template",
        "pkobatch",
        str(CHART),
        "--set",
        f"nameOverride={longest}b",
        check=False,
    )
    assert done.returncode != 0
    assert "is longer than 40 characters" in done.stderr
