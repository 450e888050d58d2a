"""pkobatch's strategic merge of pod templates against the API server's own.

The base is the pod template of a Job that pkobatch builds (run container ``pulumi`` in a
stock Pulumi image, the runner's init container, PKO's ``share`` volume, the runner's
environment) from a Job template that also has the lists the patches below act on. The patches
were written for this project: customisations PKO users write (PKO's
``examples/custom-workspace`` and e2e manifests: labels, tolerations, an init container
writing ``$PULUMI_ENV``, extra volumes and mounts, a projected token) and every merge rule and
directive.

For each patch the API server applies it to a PodTemplate holding the base (a dry-run PATCH,
``application/strategic-merge-patch+json``); pkobatch's result is dry-run created as a
PodTemplate, so both are defaulted and validated by the same server. The templates must be
equal: ``test_strategic_merge_matches_the_api_server`` for ``strategic_merge`` itself, and
``test_the_jobs_pod_template_is_the_api_servers_merge`` for the Job that ``build_run`` makes
with the patch as ``spec.workspaceTemplate.spec.podTemplate`` — for patches that leave alone
what pkobatch sets after the merge (docs/api.md: the run container's command, arguments and
own variables, the init containers, the runner's resources). A patch the server refuses to
apply, pkobatch refuses too (``test_what_the_api_server_refuses_is_refused``), and 200 seeded
random patches of the base's merged lists (changes, additions, deletions, replaces, nulls,
``$retainKeys``, ``$setElementOrder``) are merged alike or refused alike
(``test_randomised_patches_merge_as_on_the_api_server``).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pkobatch.api.run import Run
from pkobatch.api.stack.spec import StackSpec
from pkobatch.api.strategic_merge import StrategicMergeError, strategic_merge
from pkobatch.config import JobSettings
from pkobatch.controller.job_builder import build_run, parse_template
from pkobatch.kube.client import Kube, KubeError, Resource

JSON = dict[str, Any]
PODTEMPLATES = Resource("", "v1", "podtemplates", "PodTemplate")
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
DRY_RUN = {"dryRun": "All"}
STOCK_IMAGE = "pulumi/pulumi:3.134.1-nonroot"
RUN = Run(operation="up", kind="sync", generation=1, reconcile_request="", commit="c0", trigger="t")
JOB_TEMPLATE = """
kind: Job
spec:
  template:
    metadata:
      labels: {team: infra}
      finalizers: [example.com/a, example.com/b]
    spec:
      nodeSelector: {pool: pulumi}
      enableServiceLinks: false
      tolerations: [{key: dedicated, operator: Equal, value: pulumi, effect: NoSchedule}]
      hostAliases: [{ip: 10.0.0.1, hostnames: [git.internal]}]
      imagePullSecrets: [{name: registry}]
      topologySpreadConstraints:
        - {topologyKey: zone, whenUnsatisfiable: ScheduleAnyway, maxSkew: 1}
      volumes:
        - {name: cache, emptyDir: {}}
      containers:
        - name: pulumi
          ports: [{containerPort: 8080, name: metrics}]
          env: [{name: FIRST, value: "1"}, {name: SECOND, value: "2"}]
          volumeMounts: [{name: cache, mountPath: /cache}]
          resources: {requests: {cpu: 100m, memory: 256Mi}}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: {drop: [ALL]}
"""

# PKO's examples/custom-workspace and e2e manifests, as PKO users write them.
PKO_CUSTOM_WORKSPACE: JSON = {
    "metadata": {"labels": {"example": "custom"}, "annotations": {"note": "x"}},
    "spec": {
        "terminationGracePeriodSeconds": 600,
        "tolerations": [{"key": "example", "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [
            {
                "name": "extra",
                "image": "busybox",
                "command": ["sh", "-c", "echo 'PULUMI_CONFIG_PASSPHRASE=x' >> $PULUMI_ENV"],
                "volumeMounts": [{"name": "share", "mountPath": "/share"}],
            }
        ],
        "containers": [
            {
                "name": "pulumi",
                "volumeMounts": [
                    {"name": "oidc-token", "mountPath": "/var/run/secrets/pulumi"},
                    {"name": "state", "mountPath": "/state"},
                ],
            }
        ],
        "volumes": [
            {
                "name": "oidc-token",
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": "urn:pulumi:org:example",
                                "expirationSeconds": 3600,
                                "path": "token",
                            }
                        }
                    ]
                },
            },
            {"name": "state", "persistentVolumeClaim": {"claimName": "state"}},
        ],
    },
}


# Patches the API server refuses to apply, as pkobatch must.
INVALID_PATCHES: dict[str, JSON] = {
    "a merged list item without its merge key": {"spec": {"containers": [{"image": "x"}]}},
    "$patch: merge in a list item": {"spec": {"volumes": [{"name": "cache", "$patch": "merge"}]}},
    "an unknown $patch on a map": {"spec": {"nodeSelector": {"$patch": "drop"}}},
    "a field missing from $retainKeys": {
        "spec": {
            "volumes": [{"name": "cache", "$retainKeys": ["name"], "configMap": {"name": "c"}}]
        }
    },
    "an order that contradicts $setElementOrder": {
        "spec": {
            "$setElementOrder/volumes": [{"name": "cache"}],
            "volumes": [{"name": "other", "emptyDir": {}}],
        }
    },
}


def run_container(volumes: list[JSON] | None = None, **fields: Any) -> JSON:
    """A patch of the run container (and of the pod's volumes)."""
    spec: JSON = {"containers": [{"name": "pulumi", **fields}]}
    if volumes is not None:
        spec["volumes"] = volumes
    return {"spec": spec}


# Patches whose merge the Job keeps as the merge made it (nothing pkobatch sets afterwards).
JOB_PATCHES: dict[str, JSON] = {
    "volumes and mounts": run_container(
        volumeMounts=[{"name": "state", "mountPath": "/state"}],
        volumes=[{"name": "state", "emptyDir": {"medium": "Memory"}}],
    ),
    "env merged by name": run_container(
        env=[{"name": "SECOND", "value": "two"}, {"name": "THIRD", "value": "3"}]
    ),
    "a mount replaced by its mountPath": run_container(
        volumeMounts=[{"name": "state", "mountPath": "/cache"}],
        volumes=[{"name": "state", "emptyDir": {}}],
    ),
    "ports merged by containerPort": run_container(
        ports=[{"containerPort": 8080, "name": "prom"}, {"containerPort": 9090}]
    ),
    "tolerations replaced": {"spec": {"tolerations": [{"key": "other", "operator": "Exists"}]}},
    "maps merged, null deletes": {
        "metadata": {"labels": {"team": None, "cost": "42"}},
        "spec": {"nodeSelector": {"pool": None, "zone": "a"}, "enableServiceLinks": None},
    },
    "hostAliases, imagePullSecrets, topologySpreadConstraints, schedulingGates": {
        "spec": {
            "hostAliases": [
                {"ip": "10.0.0.1", "hostnames": ["git2.internal"]},
                {"ip": "10.0.0.2", "hostnames": ["cache.internal"]},
            ],
            "imagePullSecrets": [{"name": "mirror"}],
            "topologySpreadConstraints": [
                {"topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 2},
                {"topologyKey": "host", "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 1},
            ],
            "schedulingGates": [{"name": "example.com/approved"}],
        }
    },
    "$patch: delete of a volume, a mount, an env var, a map": {
        "spec": {
            "volumes": [{"name": "cache", "$patch": "delete"}],
            "containers": [
                {
                    "name": "pulumi",
                    "volumeMounts": [{"mountPath": "/cache", "$patch": "delete"}],
                    "env": [{"name": "FIRST", "$patch": "delete"}],
                }
            ],
            "nodeSelector": {"$patch": "delete"},
        }
    },
    "$patch: replace of a list and a map": {
        "spec": {
            "hostAliases": [{"$patch": "replace"}, {"ip": "10.0.0.9", "hostnames": ["only"]}],
            "nodeSelector": {"$patch": "replace", "zone": "b"},
        }
    },
    "$retainKeys switches a volume's source": {
        "spec": {
            "volumes": [
                {
                    "name": "cache",
                    "$retainKeys": ["name", "configMap"],
                    "configMap": {"name": "cache-seed"},
                }
            ]
        }
    },
    "$setElementOrder of merged lists": {
        "spec": {
            "$setElementOrder/hostAliases": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.3"}],
            "hostAliases": [{"ip": "10.0.0.3", "hostnames": ["third"]}],
            "$setElementOrder/volumes": [{"name": "cache"}, {"name": "late"}],
            "volumes": [{"name": "late", "emptyDir": {}}],
        }
    },
    "$deleteFromPrimitiveList and a merged scalar list": {
        "metadata": {
            "$deleteFromPrimitiveList/finalizers": ["example.com/a"],
            "finalizers": ["example.com/c"],
        }
    },
}

# Patches that touch what pkobatch sets after the merge: compared for the merge alone.
MERGE_ONLY_PATCHES: dict[str, JSON] = {
    "PKO's custom workspace": PKO_CUSTOM_WORKSPACE,
    "$patch: replace of the run container's env and securityContext": run_container(
        env=[{"$patch": "replace"}, {"name": "ONLY", "value": "1"}],
        securityContext={"$patch": "replace", "runAsNonRoot": True},
    ),
    "$patch: delete of the runner's init container": {
        "spec": {"initContainers": [{"name": "pkobatch-runner", "$patch": "delete"}]}
    },
    "$setElementOrder puts a sidecar and an init container last": {
        "spec": {
            "$setElementOrder/containers": [{"name": "pulumi"}, {"name": "sidecar"}],
            "containers": [{"name": "sidecar", "image": "busybox"}],
            "$setElementOrder/initContainers": [{"name": "pkobatch-runner"}, {"name": "late"}],
            "initContainers": [{"name": "late", "image": "busybox"}],
        }
    },
    "$setElementOrder with a deletion (apimachinery orders by its shifted base)": {
        "spec": {
            "containers": [
                {
                    "name": "pulumi",
                    "$setElementOrder/env": [{"name": "NEW"}, {"name": "FIRST"}],
                    "env": [{"name": "NEW", "value": "n"}, {"name": "SECOND", "$patch": "delete"}],
                }
            ]
        }
    },
    "resources merged into the run container": run_container(
        resources={"limits": {"memory": "1Gi"}, "requests": {"cpu": None}}
    ),
}


def stack_spec(pod_template: JSON | None) -> StackSpec:
    workspace: JSON = {"image": STOCK_IMAGE, "env": [{"name": "WORKSPACE", "value": "w"}]}
    if pod_template is not None:
        workspace["podTemplate"] = pod_template
    return StackSpec.model_validate(
        {
            "stack": "dev",
            "projectRepo": "https://git.example.com/infra.git",
            "branch": "main",
            "envRefs": {"TOKEN": {"type": "Secret", "secret": {"name": "creds", "key": "t"}}},
            "workspaceTemplate": {"spec": workspace},
        }
    )


def job_pod_template(pod_template: JSON | None) -> JSON:
    stack = {"metadata": {"name": "app", "namespace": "team", "uid": "u1"}, "spec": {}}
    template = parse_template(JOB_TEMPLATE, "test template")
    job = build_run(stack, stack_spec(pod_template), RUN, JobSettings(), template).job
    pod: JSON = job["spec"]["template"]
    return pod


def defaulted(kube: Kube, namespace: str, template: JSON) -> JSON:
    """``template`` as the API server stores it (defaults applied), by a dry-run create."""
    body = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "view"},
        "template": template,
    }
    created = kube.request("POST", PODTEMPLATES.path(namespace), query=DRY_RUN, body=body)
    result: JSON = created["template"]
    return result


def server_merge(
    kube: Kube, namespace: str, base: JSON, patch: JSON, *, name: str = "base"
) -> JSON:
    """The API server's strategic merge of ``patch`` onto ``base`` (a dry-run PATCH of a
    PodTemplate ``name`` holding ``base``, created unless it exists)."""
    body = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": base}
    if kube.get_or_none(PODTEMPLATES, name, namespace) is None:
        kube.request("POST", PODTEMPLATES.path(namespace), body=body)
    patched = kube.request(
        "PATCH",
        PODTEMPLATES.path(namespace, name),
        query=DRY_RUN,
        body={"template": patch},
        content_type=STRATEGIC_MERGE_PATCH,
    )
    result: JSON = patched["template"]
    return result


@pytest.mark.parametrize("case", [*JOB_PATCHES, *MERGE_ONLY_PATCHES])
def test_strategic_merge_matches_the_api_server(kube: Kube, namespace: str, case: str) -> None:
    patch = {**JOB_PATCHES, **MERGE_ONLY_PATCHES}[case]
    base = job_pod_template(None)
    expected = server_merge(kube, namespace, base, copy.deepcopy(patch))
    assert defaulted(kube, namespace, strategic_merge(base, patch)) == expected


@pytest.mark.parametrize("case", list(JOB_PATCHES))
def test_the_jobs_pod_template_is_the_api_servers_merge(
    kube: Kube, namespace: str, case: str
) -> None:
    patch = JOB_PATCHES[case]
    built = job_pod_template(patch)
    base = job_pod_template(None)
    # The run's snapshot argument records the Stack's spec, podTemplate included.
    for container in base["spec"]["containers"]:
        if container["name"] == "pulumi":
            [run] = [c for c in built["spec"]["containers"] if c["name"] == "pulumi"]
            container["args"] = run["args"]
    expected = server_merge(kube, namespace, base, copy.deepcopy(patch))
    assert defaulted(kube, namespace, built) == expected


@pytest.mark.parametrize("case", list(INVALID_PATCHES))
def test_what_the_api_server_refuses_is_refused(kube: Kube, namespace: str, case: str) -> None:
    patch = INVALID_PATCHES[case]
    base = job_pod_template(None)
    with pytest.raises(KubeError):
        server_merge(kube, namespace, base, copy.deepcopy(patch))
    with pytest.raises(StrategicMergeError):
        strategic_merge(base, patch)


# Randomised patches (seeded: a failure names its seed) over the base's merged lists.
RANDOM_PATCHES = 200


def keyed_list_patch(
    rng: random.Random,
    names: Sequence[Any],
    key: str,
    make: Callable[[Any], JSON],
    *,
    deletions: bool = True,
    replace: bool = True,
) -> list[JSON]:
    """Some of ``names`` in a random order: changed or new items, deletions, maybe a replace."""
    items: list[JSON] = []
    for name in rng.sample(names, rng.randint(1, len(names))):
        if deletions and rng.random() < 0.2:
            items.append({key: name, "$patch": "delete"})
        else:
            items.append(make(name))
    if replace and rng.random() < 0.1:
        items.insert(rng.randrange(len(items) + 1), {"$patch": "replace"})
    return items


def element_order(rng: random.Random, patch: list[JSON], base: list[JSON], key: str) -> list[JSON]:
    """A ``$setElementOrder`` list: the patch's items in the patch's order, with some of the
    base's others put in at random places."""
    named = [item[key] for item in patch if "$patch" not in item]
    for name in [item[key] for item in base if item[key] not in named]:
        if rng.random() < 0.7:
            named.insert(rng.randrange(len(named) + 1), name)
    return [{key: name} for name in named]


def random_patch(rng: random.Random, base: JSON) -> JSON:
    spec: JSON = {}
    base_spec = base["spec"]
    [base_run] = [c for c in base_spec["containers"] if c["name"] == "pulumi"]
    lists: list[tuple[JSON, str, list[JSON], list[JSON], str]] = []

    env = keyed_list_patch(
        rng,
        [e["name"] for e in base_run["env"]] + ["NEW1", "NEW2", "NEW3"],
        "name",
        # null drops a valueFrom the base has (one may not have both).
        lambda name: {"name": name, "value": str(rng.randrange(100)), "valueFrom": None},
    )
    ports = keyed_list_patch(
        rng,
        [8080, 9000, 9001, 9002],
        "containerPort",
        lambda port: {"containerPort": port, "protocol": rng.choice(["TCP", "UDP"])},
    )
    run: JSON = {"name": "pulumi", "env": env, "ports": ports}
    lists.append((run, "env", env, base_run["env"], "name"))
    lists.append((run, "ports", ports, base_run["ports"], "containerPort"))
    aliases = keyed_list_patch(
        rng,
        [f"10.0.0.{n}" for n in range(1, 5)],
        "ip",
        lambda ip: {"ip": ip, "hostnames": [f"h{rng.randrange(9)}.internal"]},
    )
    lists.append((spec, "hostAliases", aliases, base_spec["hostAliases"], "ip"))
    secrets = keyed_list_patch(
        rng, ["registry", "m1", "m2", "m3"], "name", lambda name: {"name": name}
    )
    lists.append((spec, "imagePullSecrets", secrets, base_spec["imagePullSecrets"], "name"))
    # Volumes the pod mounts stay: new ones come, the unmounted cache may change its source.
    volumes = keyed_list_patch(
        rng,
        ["extra1", "extra2", "extra3"],
        "name",
        lambda name: {"name": name, "emptyDir": {"sizeLimit": f"{rng.randrange(1, 9)}Mi"}},
        replace=False,
    )
    if rng.random() < 0.3:
        volumes.insert(
            rng.randrange(len(volumes) + 1),
            {
                "name": "cache",
                "$retainKeys": ["name", "emptyDir"],
                "emptyDir": {"medium": "Memory"},
            },
        )
    lists.append((spec, "volumes", volumes, base_spec["volumes"], "name"))
    for owner, field, items, base_items, key in lists:
        owner[field] = items
        if rng.random() < 0.3:
            owner[f"$setElementOrder/{field}"] = element_order(rng, items, base_items, key)
    spec["containers"] = [run]
    if rng.random() < 0.3:
        spec["tolerations"] = [{"key": f"t{rng.randrange(5)}", "operator": "Exists"}]
    labels = {name: rng.choice([None, "v"]) for name in rng.sample(["team", "a", "b"], 2)}
    metadata: JSON = {"labels": labels}
    finalizers = [f"example.com/{x}" for x in "abcd"]
    if rng.random() < 0.5:
        metadata["finalizers"] = rng.sample(finalizers, rng.randint(1, 3))
    others = [f for f in finalizers if f not in metadata.get("finalizers", [])]
    if rng.random() < 0.5:
        # Not a value the patch also adds: the server's result would depend on Go's map order.
        metadata["$deleteFromPrimitiveList/finalizers"] = rng.sample(others, 1)
    return {"metadata": metadata, "spec": spec}


def test_randomised_patches_merge_as_on_the_api_server(kube: Kube, namespace: str) -> None:
    """Both merge a patch alike, or both refuse it."""
    base = job_pod_template(None)
    mismatches = []
    refused = 0
    for seed in range(RANDOM_PATCHES):
        patch = random_patch(random.Random(seed), base)
        try:
            expected: JSON | None = server_merge(kube, namespace, base, copy.deepcopy(patch))
        except KubeError:
            expected = None
        try:
            merged: JSON | None = defaulted(kube, namespace, strategic_merge(base, patch))
        except StrategicMergeError:
            merged = None
        refused += expected is None
        if merged != expected:
            mismatches.append((seed, patch, expected, merged))
    assert mismatches == []
    # Most patches are merged, so the comparison is of merges, not of refusals.
    assert refused < RANDOM_PATCHES // 4
