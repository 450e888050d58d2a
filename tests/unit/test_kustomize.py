"""The kustomize install (deploy/kustomize), rendered by the real `kubectl kustomize`.

Every overlay is built the way users build it, then checked for what a broken install would
get wrong: missing objects, selectors that select nothing, env the controller rejects,
RBAC that forbids a call pkobatch makes or grants one it does not make.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.deploy_render import (
    KUSTOMIZE,
    NAMESPACED_DEFAULT,
    SYSTEM_NAMESPACE,
    Obj,
    kustomize,
    rendered,
    user_kustomization,
)

from pkobatch.config import Settings, load_settings
from pkobatch.controller.job_builder import builtin_template, parse_template
from pkobatch.kube.rbac import (
    CONTROLLER_API_CALLS,
    CONTROLLER_OWN_NAMESPACE_RESOURCES,
    RUNNER_API_CALLS,
    ApiCall,
)

REPO = Path(__file__).resolve().parents[2]
CLUSTER_WIDE = ("base", "overlays/dev", "overlays/prod")
ALL_INSTALLS = (*CLUSTER_WIDE, "overlays/namespaced")
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def only(objects: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(objects: Iterable[Obj]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def controller_container(objects: Iterable[Obj]) -> Obj:
    pod = only(objects, "Deployment", "pkobatch-controller")["spec"]["template"]["spec"]
    containers: list[Obj] = pod["containers"]
    return next(c for c in containers if c["name"] == "controller")


def env_of(objects: Iterable[Obj]) -> dict[str, Obj]:
    return {entry["name"]: entry for entry in controller_container(objects)["env"]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def granted(role: Obj) -> set[ApiCall]:
    """Every (group, resource, verb) a Role or ClusterRole allows."""
    calls: set[ApiCall] = set()
    for rule in role.get("rules", []):
        assert "nonResourceURLs" not in rule, f"{role['metadata']['name']}: {rule}"
        assert "resourceNames" not in rule, f"{role['metadata']['name']}: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                calls.update((group, resource, verb) for verb in rule["verbs"])
    return calls


def roles(objects: Iterable[Obj]) -> Iterator[Obj]:
    return (o for o in objects if o["kind"] in ("Role", "ClusterRole"))


# --- what each install contains ----------------------------------------------------------

CONTROLLER_OBJECTS = {
    ("ServiceAccount", "pkobatch-controller"),
    ("Deployment", "pkobatch-controller"),
    ("Service", "pkobatch-controller-metrics"),
    ("Service", "pkobatch-controller"),
    ("Role", "pkobatch-leader-election"),
    ("RoleBinding", "pkobatch-leader-election"),
}


@pytest.mark.parametrize("install", CLUSTER_WIDE)
def test_cluster_wide_install_contains_crd_controller_and_rbac(install: str) -> None:
    assert kinds(rendered(install)) >= CONTROLLER_OBJECTS | {
        ("Namespace", SYSTEM_NAMESPACE),
        ("CustomResourceDefinition", "stacks.pulumi.com"),
        ("CustomResourceDefinition", "programs.pulumi.com"),
        ("ClusterRole", "pkobatch-controller"),
        ("ClusterRoleBinding", "pkobatch-controller"),
        ("ClusterRole", "pkobatch-runner"),
        ("ValidatingAdmissionPolicy", "pkobatch-controller-secrets"),
        ("ValidatingAdmissionPolicyBinding", "pkobatch-controller-secrets"),
    }


def test_namespaced_install_has_no_cluster_scoped_objects() -> None:
    objects = rendered("overlays/namespaced")
    assert kinds(objects) >= CONTROLLER_OBJECTS | {
        ("Role", "pkobatch-controller"),
        ("RoleBinding", "pkobatch-controller"),
        ("Role", "pkobatch-runner"),
        ("RoleBinding", "pkobatch-runner"),
        ("ServiceAccount", "pkobatch-runner"),
    }
    assert [o["kind"] for o in objects if o["kind"] in CLUSTER_SCOPED_KINDS] == []


def test_crds_directory_installs_only_the_crds() -> None:
    """What a cluster admin applies before namespaced installs (`kubectl apply -k crds/`)."""
    assert kinds(kustomize(REPO / "crds")) == {
        ("CustomResourceDefinition", "stacks.pulumi.com"),
        ("CustomResourceDefinition", "programs.pulumi.com"),
        ("CustomResourceDefinition", "workspaces.auto.pulumi.com"),
        ("CustomResourceDefinition", "updates.auto.pulumi.com"),
    }


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("pulumi.com_stacks.yaml", "stacks.pulumi.com"),
        ("pulumi.com_programs.yaml", "programs.pulumi.com"),
        ("auto.pulumi.com_workspaces.yaml", "workspaces.auto.pulumi.com"),
        ("auto.pulumi.com_updates.yaml", "updates.auto.pulumi.com"),
    ],
)
def test_crd_is_the_generated_one_from_crds_directory(file: str, name: str) -> None:
    generated = yaml.safe_load((REPO / "crds" / file).read_text())
    installed = only(rendered("base"), "CustomResourceDefinition", name)
    assert installed["spec"] == generated["spec"]


@pytest.mark.parametrize(
    ("install", "namespace"),
    [
        *((install, SYSTEM_NAMESPACE) for install in CLUSTER_WIDE),
        ("overlays/namespaced", NAMESPACED_DEFAULT),
    ],
)
def test_namespaced_objects_and_subjects_share_the_install_namespace(
    install: str, namespace: str
) -> None:
    objects = rendered(install)
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED_KINDS:
            assert obj["metadata"].get("namespace") == namespace, kinds([obj])
        for subject in obj.get("subjects", []):
            assert subject["namespace"] == namespace, kinds([obj])


# --- the controller Deployment -----------------------------------------------------------


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_selectors_match_the_controller_pods(install: str) -> None:
    objects = rendered(install)
    deployment = only(objects, "Deployment", "pkobatch-controller")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    for service in (o for o in objects if o["kind"] == "Service"):
        assert selects(service["spec"]["selector"], pod_labels), service["metadata"]["name"]
    for budget in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        assert selects(budget["spec"]["selector"]["matchLabels"], pod_labels)
    for spread in deployment["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        assert selects(spread["labelSelector"]["matchLabels"], pod_labels)


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_controller_pods_do_not_look_like_run_pods(install: str) -> None:
    """The controller lists pods labelled managed-by=pkobatch; its own must not match."""
    deployment = only(rendered(install), "Deployment", "pkobatch-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels.get("app.kubernetes.io/managed-by") != "pkobatch"


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_controller_runs_locked_down(install: str) -> None:
    objects = rendered(install)
    pod = only(objects, "Deployment", "pkobatch-controller")["spec"]["template"]["spec"]
    container = controller_container(objects)
    assert pod["serviceAccountName"] == "pkobatch-controller"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == ["pkobatch", "controller"]
    assert {"requests", "limits"} <= container["resources"].keys()


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_probes_metrics_and_program_artifacts_use_the_ports_the_controller_listens_on(
    install: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered(install)
    container = controller_container(objects)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    settings = settings_from(objects, monkeypatch)
    assert ports["health"] == int(settings.health_addr.rpartition(":")[2])
    assert ports["metrics"] == int(settings.metrics_addr.rpartition(":")[2])
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = container[probe]["httpGet"]
        assert (http["path"], ports[http["port"]]) == (path, 8081)
    service_port = only(objects, "Service", "pkobatch-controller-metrics")["spec"]["ports"][0]
    assert ports[service_port["targetPort"]] == 8080
    # status.artifact.url names the Service in front of the port the artifacts are served on.
    programs = settings.programs
    assert programs.enabled
    assert ports["programs"] == int(programs.addr.rpartition(":")[2])
    (port,) = only(objects, "Service", programs.service)["spec"]["ports"]
    assert (ports[port["targetPort"]], port["port"]) == (ports["programs"], programs.service_port)
    (entry,) = (e for e in container["env"] if e["name"] == "PKOBATCH_PROGRAMS__SERVICE_NAMESPACE")
    assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def settings_from(objects: Iterable[Obj], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings the controller would load from the Deployment's environment."""
    return deployment_settings(only(objects, "Deployment", "pkobatch-controller"), monkeypatch)


def deployment_settings(deployment: Obj, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings the controller of ``deployment`` would load from its pods' environment (the
    downward API's values: the pod's namespace, its labels; a missing label is empty)."""
    namespace = deployment["metadata"]["namespace"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for name in [name for name in os.environ if name.startswith("PKOBATCH_")]:
        monkeypatch.delenv(name)
    container = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "controller"
    )
    for entry in container["env"]:
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        if path == "metadata.namespace":
            monkeypatch.setenv(entry["name"], namespace)
        else:
            label = path.removeprefix("metadata.labels['").removesuffix("']")
            assert path == f"metadata.labels['{label}']", path
            monkeypatch.setenv(entry["name"], pod_labels.get(label, ""))
    return load_settings()


def names_a_setting(variable: str) -> bool:
    model: Any = Settings
    for part in variable.removeprefix("PKOBATCH_").lower().split("__"):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation
    return True


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_controller_env_is_valid_settings(install: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = rendered(install)
    unknown = [name for name in env_of(objects) if name.startswith("PKOBATCH_")]
    assert [name for name in unknown if not names_a_setting(name)] == []
    settings = settings_from(objects, monkeypatch)
    assert (
        settings.leader_election.lease_namespace
        == only(objects, "Deployment")["metadata"]["namespace"]
    )


def test_dev_runs_one_replica_with_debug_text_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = rendered("overlays/dev")
    settings = settings_from(objects, monkeypatch)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert (settings.log_level, settings.log_format) == ("debug", "text")
    assert settings.leader_election.enabled is False


def test_prod_runs_two_replicas_with_leader_election_and_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = rendered("overlays/prod")
    settings = settings_from(objects, monkeypatch)
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert settings.leader_election.enabled is True
    assert only(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    resources = controller_container(objects)["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"]
    assert "cpu" in resources["limits"]


def test_namespaced_controller_watches_its_own_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from(rendered("overlays/namespaced"), monkeypatch)
    assert settings.namespaces == [NAMESPACED_DEFAULT]


def deployments(objects: Iterable[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}


def test_sharded_install_runs_one_controller_per_shard_on_its_own_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = rendered("overlays/sharded")
    controllers = deployments(objects)
    chosen = {
        name: (settings.stack_selector, settings.lease_name)
        for name, deployment in controllers.items()
        for settings in [deployment_settings(deployment, monkeypatch)]
    }
    assert chosen == {
        "pkobatch-controller": ("!pkobatch.io/shard", "pkobatch-controller"),
        "pkobatch-controller-blue": ("pkobatch.io/shard=blue", "pkobatch-controller-blue"),
        "pkobatch-controller-green": ("pkobatch.io/shard=green", "pkobatch-controller-green"),
    }
    service = only(objects, "Service", "pkobatch-controller-metrics")
    for name, deployment in controllers.items():
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(service["spec"]["selector"], pod_labels), name
        # Each Deployment's selector matches its own pods only.
        for other, owner in controllers.items():
            matches = selects(owner["spec"]["selector"]["matchLabels"], pod_labels)
            assert matches == (other == name), (other, name)


def test_a_shard_runs_the_main_controllers_pod_with_only_its_shard_settings_added() -> None:
    controllers = deployments(rendered("overlays/sharded"))

    def pod_without_sharding(deployment: Obj) -> Obj:
        pod = yaml.safe_load(yaml.safe_dump(deployment["spec"]["template"]["spec"]))
        for container in pod["containers"]:
            container["env"] = [
                e
                for e in container["env"]
                if e["name"] not in ("PKOBATCH_SHARD", "PKOBATCH_SHARDED")
            ]
        return pod

    main = pod_without_sharding(controllers["pkobatch-controller"])
    for name in ("pkobatch-controller-blue", "pkobatch-controller-green"):
        assert pod_without_sharding(controllers[name]) == main, name


def test_a_shard_built_without_its_name_label_serves_only_unlabelled_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forgetting the label must not make an unsharded controller that takes every Stack:
    it becomes a standby of the main controller (same selector, same Lease)."""
    settings = deployment_settings(only(rendered("shard"), "Deployment"), monkeypatch)
    assert (settings.stack_selector, settings.lease_name) == (
        "!pkobatch.io/shard",
        "pkobatch-controller",
    )


# --- RBAC against pkobatch/kube/rbac.py --------------------------------------------------


def controller_roles(objects: Iterable[Obj]) -> tuple[Obj, Obj]:
    """(the controller's main role, its leader-election Role)."""
    objects = list(objects)
    main = next(o for o in roles(objects) if o["metadata"]["name"] == "pkobatch-controller")
    return main, only(objects, "Role", "pkobatch-leader-election")


def own_namespace(call: ApiCall) -> bool:
    return (call[0], call[1]) in CONTROLLER_OWN_NAMESPACE_RESOURCES


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_controller_role_grants_exactly_the_calls_the_controller_makes(install: str) -> None:
    main, _ = controller_roles(rendered(install))
    needed = {call for call in CONTROLLER_API_CALLS if not own_namespace(call)}
    have = granted(main)
    assert sorted(needed - have) == [], "missing: add these to the controller role"
    assert sorted(have - needed) == [], "not in CONTROLLER_API_CALLS: remove (least privilege)"


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_leader_election_role_grants_exactly_the_lease_calls(install: str) -> None:
    _, leader_election = controller_roles(rendered(install))
    assert granted(leader_election) == {c for c in CONTROLLER_API_CALLS if own_namespace(c)}


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_runner_role_grants_exactly_the_calls_a_run_makes(install: str) -> None:
    runner = next(o for o in roles(rendered(install)) if o["metadata"]["name"] == "pkobatch-runner")
    assert granted(runner) == set(RUNNER_API_CALLS)


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_secrets_are_only_ever_read_by_name_or_created(install: str) -> None:
    # The controller: get for git credentials for polling, create for a run's Secret of inline
    # secret values. The runner, bound per namespace: also update and delete (the Secret of
    # spec.exportOutputs). No role lists or watches Secrets.
    for role in roles(rendered(install)):
        verbs = {
            verb for group, resource, verb in granted(role) if (group, resource) == ("", "secrets")
        }
        allowed = {"get", "create"}
        if role["metadata"]["name"] == "pkobatch-runner":
            allowed |= {"update", "delete"}
        assert verbs <= allowed, role["metadata"]["name"]


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_every_binding_binds_an_installed_role_to_an_installed_service_account(
    install: str,
) -> None:
    objects = rendered(install)
    installed = kinds(objects)
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert bindings
    for binding in bindings:
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in installed
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert ("ServiceAccount", subject["name"]) in installed


@pytest.mark.parametrize("install", ALL_INSTALLS)
def test_controller_grants_go_to_the_controller_only(install: str) -> None:
    for binding in rendered(install):
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding") and binding["roleRef"][
            "name"
        ] in ("pkobatch-controller", "pkobatch-leader-election"):
            assert [s["name"] for s in binding["subjects"]] == ["pkobatch-controller"]


# --- how users build on it ---------------------------------------------------------------


def test_tenant_namespace_binds_the_runner_role(tmp_path: Path) -> None:
    objects = user_kustomization(tmp_path, [KUSTOMIZE / "runner"], namespace="team-a")
    assert kinds(objects) == {
        ("ServiceAccount", "pkobatch-runner"),
        ("RoleBinding", "pkobatch-runner"),
    }
    binding = only(objects, "RoleBinding")
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pkobatch-runner", "namespace": "team-a"}
    ]
    assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in kinds(rendered("base"))


def test_namespaced_install_follows_a_users_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = user_kustomization(
        tmp_path, [KUSTOMIZE / "overlays" / "namespaced"], namespace="team-b"
    )
    assert {o["metadata"]["namespace"] for o in objects} == {"team-b"}
    subjects = [s for o in objects for s in o.get("subjects", [])]
    assert subjects
    assert {s["namespace"] for s in subjects} == {"team-b"}
    assert settings_from(objects, monkeypatch).namespaces == ["team-b"]


def test_cluster_wide_install_follows_a_users_namespace(tmp_path: Path) -> None:
    objects = user_kustomization(tmp_path, [KUSTOMIZE / "overlays" / "prod"], namespace="platform")
    assert ("Namespace", "platform") in kinds(objects)
    binding = only(objects, "ClusterRoleBinding", "pkobatch-controller")
    assert binding["subjects"][0]["namespace"] == "platform"


@pytest.mark.parametrize(
    ("install", "namespace"), [("overlays/prod", None), ("overlays/namespaced", "ops")]
)
def test_job_template_component_mounts_the_template_the_controller_reads(
    install: str, namespace: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = user_kustomization(
        tmp_path,
        [KUSTOMIZE / install],
        [KUSTOMIZE / "components" / "job-template"],
        namespace=namespace,
    )
    template_file = Path(settings_from(objects, monkeypatch).job.template_file)
    container = controller_container(objects)
    mount = next(m for m in container["volumeMounts"] if m["name"] == "job-template")
    assert template_file.parent == Path(mount["mountPath"])
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "job-template")
    config_map = only(objects, "ConfigMap", volume["configMap"]["name"])
    assert (
        config_map["metadata"]["namespace"] == only(objects, "Deployment")["metadata"]["namespace"]
    )
    template = parse_template(config_map["data"][template_file.name], str(template_file))
    assert template["spec"]["template"]["spec"]["nodeSelector"] == {
        "example.com/pool": "automation"
    }


def test_job_template_example_is_the_default_plus_its_site_specific_lines() -> None:
    """When the built-in template changes, this example must change with it."""
    path = KUSTOMIZE / "components" / "job-template" / "job-template.yaml"
    example = parse_template(path.read_text(), str(path))
    pod_spec = example["spec"]["template"]["spec"]
    for site_specific in ("nodeSelector", "tolerations"):
        del pod_spec[site_specific]
    assert example == builtin_template()
