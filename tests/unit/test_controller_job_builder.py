"""pkobatch.controller.job_builder: the Job of one run, from template, settings and Stack."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pkobatch.api.constants import OPERATION_LABEL, STACK_LABEL, STACK_NAME_ANNOTATION
from pkobatch.api.pod_security import check_pod
from pkobatch.api.run import (
    MAX_INLINE_SNAPSHOT_BYTES,
    SNAPSHOT_PART_BYTES,
    ProjectInfo,
    Run,
    RunSnapshot,
    snapshot_sha256,
)
from pkobatch.api.stack.base import MAX_SPEC_SECONDS
from pkobatch.api.stack.spec import StackSpec
from pkobatch.config import JobSettings, Settings
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Observed
from pkobatch.controller.job_builder import (
    RUN_ANNOTATION,
    RunObjects,
    build_run,
    builtin_template,
    job_name,
    owned_by_job,
    parse_template,
    stack_label_value,
)
from pkobatch.controller.run_pod import INJECTED_BUNDLE, INJECTED_RUNNER, JobBuildError

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = Run(
    operation="up",
    kind="sync",
    generation=3,
    reconcile_request="r1",
    commit="abc",
    trigger="after::abc",
)


def stack(name: str = "app") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "uid": "uid-1", "generation": 3},
        "spec": {},
    }


def build(
    spec: dict[str, Any], settings: JobSettings | None = None, **kwargs: Any
) -> dict[str, Any]:
    full = {"stack": "dev", **spec}
    return build_run(
        stack(),
        StackSpec.model_validate(full),
        kwargs.pop("run", RUN),
        settings or JobSettings(),
        builtin_template(),
        **kwargs,
    ).job


def container(job: dict[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == "pulumi"]
    assert len(found) == 1
    return found[0]


def env(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container(job).get("env", [])}


def snapshot(job: dict[str, Any]) -> RunSnapshot:
    args = container(job)["args"]
    assert args[0] == "--snapshot"
    return RunSnapshot.model_validate_json(args[1])


# ---------------------------------------------------------------------------------------
# Names and labels
# ---------------------------------------------------------------------------------------


def test_job_names_are_deterministic_and_differ_per_trigger() -> None:
    first = job_name("app", "uid-1", RUN)
    assert first == job_name("app", "uid-1", RUN)
    assert first.startswith("app-up-") and len(first) == len("app-up-") + 10
    others = {
        job_name("app", "uid-2", RUN),
        job_name("app", "uid-1", Run(**{**RUN.__dict__, "generation": 4})),
        job_name("app", "uid-1", Run(**{**RUN.__dict__, "reconcile_request": "r2"})),
        job_name("app", "uid-1", Run(**{**RUN.__dict__, "trigger": "after:x:abc"})),
        job_name("app", "uid-1", Run(**{**RUN.__dict__, "kind": "request"})),
    }
    assert first not in others and len(others) == 5


def test_long_stack_names_give_valid_job_names() -> None:
    name = job_name("s" * 42, "uid", Run(**{**RUN.__dict__, "operation": "refresh"}))
    assert len(name) <= 63
    long_name = job_name("a" * 80, "uid", RUN)
    assert len(long_name) <= 63 and not long_name.startswith("-")


def test_long_stack_label_is_hashed_and_annotated() -> None:
    assert stack_label_value("app") == "app"
    value = stack_label_value("x" * 80)
    assert len(value) <= 63 and value != "x" * 63
    job = build_run(
        stack("y" * 70), StackSpec(stack="dev"), RUN, JobSettings(), builtin_template()
    ).job
    assert job["metadata"]["annotations"][STACK_NAME_ANNOTATION] == "y" * 70
    assert len(job["metadata"]["labels"][STACK_LABEL]) <= 63


def test_job_has_the_run_contract_fields() -> None:
    settings = JobSettings(
        ttl_after_finished="2h", active_deadline="30m", termination_grace_period="90s"
    )
    job = build({}, settings)
    meta = job["metadata"]
    assert meta["namespace"] == "team"
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "pkobatch",
        "pkobatch.io/stack": "app",
        "pkobatch.io/operation": "up",
    }
    assert job["spec"]["template"]["metadata"]["labels"] == meta["labels"]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "name": "app",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 1800
    assert spec["ttlSecondsAfterFinished"] == 7200
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget"}],
    }
    pod = spec["template"]
    assert (
        pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    )
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90
    assert env(job)["PKOBATCH_GRACE_PERIOD_SECONDS"] == {
        "name": "PKOBATCH_GRACE_PERIOD_SECONDS",
        "value": "90",
    }
    assert pod["spec"]["serviceAccountName"] == "pkobatch-runner"
    runner = container(job)
    assert runner["image"] == "pkobatch/runner:0.1.0"
    assert runner["command"] == ["pkobatch", "job", "run"]
    assert Run.from_job(job) == RUN


def test_timeout_seconds_sets_the_deadline() -> None:
    assert build({"timeoutSeconds": 120})["spec"]["activeDeadlineSeconds"] == 120


def test_a_deadline_stored_before_the_crd_bound_is_clamped() -> None:
    stored = StackSpec.model_construct(stack="dev", timeout_seconds=2**63 - 1)
    job = build_run(stack(), stored, RUN, JobSettings(), builtin_template()).job
    assert job["spec"]["activeDeadlineSeconds"] == MAX_SPEC_SECONDS


def test_snapshot_carries_the_run() -> None:
    info = ProjectInfo(name="app", runtime="python")
    job = build({"projectRepo": "https://g/x.git", "branch": "main"}, project_info=info)
    snap = snapshot(job)
    assert snap.operation == "up"
    assert snap.job_name == job["metadata"]["name"] == snap.result_config_map
    assert (snap.generation, snap.reconcile_request, snap.commit) == (3, "r1", "abc")
    assert snap.stack.model_dump() == {"name": "app", "namespace": "team", "uid": "uid-1"}
    assert snap.spec["projectRepo"] == "https://g/x.git"
    assert snap.secret_env == []
    assert snap.project_info == info
    assert snap.drift_check is False


def test_alias_dialect_reaches_the_runner_canonical() -> None:
    snap = snapshot(build({"projectPath": "infra", "destroyOnDelete": True}))
    assert snap.spec["repoDir"] == "infra" and snap.spec["destroyOnFinalize"] is True
    assert "projectPath" not in snap.spec


# ---------------------------------------------------------------------------------------
# Credentials are references
# ---------------------------------------------------------------------------------------


def secret_ref(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key, "optional": True}}


def test_env_refs_become_secret_key_refs_or_values() -> None:
    job = build(
        {
            "envRefs": {
                "AWS_SECRET": {"type": "Secret", "secret": {"name": "aws", "key": "secret"}},
                "REGION": {"type": "Literal", "literal": {"value": "eu-west-1"}},
            },
            "backend": "s3://state",
        }
    )
    variables = env(job)
    assert variables["AWS_SECRET"] == {
        "name": "AWS_SECRET",
        "valueFrom": secret_ref("aws", "secret"),
    }
    assert variables["REGION"] == {"name": "REGION", "value": "eu-west-1"}
    assert variables["PULUMI_BACKEND_URL"] == {"name": "PULUMI_BACKEND_URL", "value": "s3://state"}


def test_env_secrets_and_access_token_secret() -> None:
    job = build({"envSecrets": ["creds"], "envs": ["settings"], "accessTokenSecret": "pulumi"})
    runner = container(job)
    assert runner["envFrom"] == [
        {"configMapRef": {"name": "settings", "optional": True}},
        {"secretRef": {"name": "creds", "optional": True}},
    ]
    tokens = [e for e in runner["env"] if e["name"] == "PULUMI_ACCESS_TOKEN"]
    assert tokens == [
        {"name": "PULUMI_ACCESS_TOKEN", "valueFrom": secret_ref("creds", "accessToken")},
        {"name": "PULUMI_ACCESS_TOKEN", "valueFrom": secret_ref("pulumi", "accessToken")},
    ]


def test_explicit_access_token_wins_over_derived_ones() -> None:
    job = build(
        {
            "envSecrets": ["creds"],
            "envRefs": {
                "PULUMI_ACCESS_TOKEN": {"type": "Secret", "secret": {"name": "tok", "key": "t"}}
            },
        }
    )
    tokens = [e for e in container(job)["env"] if e["name"] == "PULUMI_ACCESS_TOKEN"]
    assert tokens == [{"name": "PULUMI_ACCESS_TOKEN", "valueFrom": secret_ref("tok", "t")}]


def test_config_and_secret_refs_reach_the_runner_through_named_env() -> None:
    job = build(
        {
            "configRef": {
                "app:size": {"name": "cfg", "key": "size"},
                "app:obj": {"name": "cfg", "key": "obj", "json": True},
            },
            "secretsRef": {
                "app:password": {"type": "Secret", "secret": {"name": "db", "key": "password"}},
                "app:literal": {"type": "Literal", "literal": {"value": "plain"}},
            },
        }
    )
    snap = snapshot(job)
    variables = env(job)
    by_key = {key: value.model_dump(by_alias=True) for key, value in snap.config_from_env.items()}
    assert by_key["app:obj"] == {"env": "PKOBATCH_CONFIG_0", "secret": False, "json": True}
    assert by_key["app:size"] == {"env": "PKOBATCH_CONFIG_1", "secret": False, "json": False}
    assert variables["PKOBATCH_CONFIG_1"]["valueFrom"] == {
        "configMapKeyRef": {"name": "cfg", "key": "size", "optional": True}
    }
    assert by_key["app:password"]["secret"] is True
    password_env = by_key["app:password"]["env"]
    assert variables[password_env]["valueFrom"] == secret_ref("db", "password")
    # A literal secret travels through the run's Secret, like spec.secrets (below).
    literal_env = by_key["app:literal"]["env"]
    assert variables[literal_env]["valueFrom"] == {
        "secretKeyRef": {"name": f"{job['metadata']['name']}-secrets", "key": literal_env}
    }


@pytest.mark.parametrize(
    ("git_auth", "expected_env", "expected_names"),
    [
        (
            {"accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}},
            {"PKOBATCH_GIT_TOKEN": secret_ref("git", "token")},
            {"tokenEnv": "PKOBATCH_GIT_TOKEN"},
        ),
        (
            {
                "sshAuth": {
                    "sshPrivateKey": {"type": "Secret", "secret": {"name": "ssh", "key": "key"}},
                    "password": {"type": "Secret", "secret": {"name": "ssh", "key": "pass"}},
                }
            },
            {
                "PKOBATCH_GIT_SSH_PRIVATE_KEY": secret_ref("ssh", "key"),
                "PKOBATCH_GIT_SSH_PASSPHRASE": secret_ref("ssh", "pass"),
            },
            {
                "sshPrivateKeyEnv": "PKOBATCH_GIT_SSH_PRIVATE_KEY",
                "sshPassphraseEnv": "PKOBATCH_GIT_SSH_PASSPHRASE",
            },
        ),
        (
            {
                "basicAuth": {
                    "userName": {"type": "Literal", "literal": {"value": "bot"}},
                    "password": {"type": "Secret", "secret": {"name": "git", "key": "pw"}},
                }
            },
            {"PKOBATCH_GIT_PASSWORD": secret_ref("git", "pw")},
            {"usernameEnv": "PKOBATCH_GIT_USERNAME", "passwordEnv": "PKOBATCH_GIT_PASSWORD"},
        ),
    ],
)
def test_git_auth_is_passed_by_reference(
    git_auth: dict[str, Any], expected_env: dict[str, Any], expected_names: dict[str, str]
) -> None:
    job = build({"projectRepo": "https://g/x.git", "branch": "main", "gitAuth": git_auth})
    variables = env(job)
    for name, value_from in expected_env.items():
        assert variables[name]["valueFrom"] == value_from
    snap = snapshot(job)
    assert snap.git_auth is not None
    assert snap.git_auth.model_dump(by_alias=True, exclude_none=True) == expected_names


def test_deprecated_git_auth_secret_offers_every_key() -> None:
    job = build({"projectRepo": "https://g/x.git", "branch": "main", "gitAuthSecret": "git"})
    variables = env(job)
    assert variables["PKOBATCH_GIT_SSH_PRIVATE_KEY"]["valueFrom"] == secret_ref(
        "git", "sshPrivateKey"
    )
    assert variables["PKOBATCH_GIT_TOKEN"]["valueFrom"] == secret_ref("git", "accessToken")
    assert variables["PKOBATCH_GIT_USERNAME"]["valueFrom"] == secret_ref("git", "username")
    assert variables["PKOBATCH_GIT_PASSWORD"]["valueFrom"] == secret_ref("git", "password")


def test_github_app_credentials_are_passed_by_reference() -> None:
    def ref(key: str) -> dict[str, Any]:
        return {"type": "Secret", "secret": {"name": "app", "key": key}}

    job = build(
        {
            "projectRepo": "https://g/x.git",
            "branch": "main",
            "gitAuth": {
                "githubApp": {
                    "appID": ref("id"),
                    "installationID": ref("inst"),
                    "privateKey": ref("pem"),
                }
            },
        }
    )
    variables = env(job)
    assert variables["PKOBATCH_GIT_GITHUB_APP_ID"]["valueFrom"] == secret_ref("app", "id")
    assert variables["PKOBATCH_GIT_GITHUB_APP_INSTALLATION_ID"]["valueFrom"] == secret_ref(
        "app", "inst"
    )
    assert variables["PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY"]["valueFrom"] == secret_ref("app", "pem")
    snap = snapshot(job)
    assert snap.git_auth is not None
    assert snap.git_auth.model_dump(by_alias=True, exclude_none=True) == {
        "githubAppIDEnv": "PKOBATCH_GIT_GITHUB_APP_ID",
        "githubAppInstallationIDEnv": "PKOBATCH_GIT_GITHUB_APP_INSTALLATION_ID",
        "githubAppPrivateKeyEnv": "PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY",
    }
    assert "PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY" in snap.secret_env


# ---------------------------------------------------------------------------------------
# workspaceTemplate and jobTemplate
# ---------------------------------------------------------------------------------------


def test_workspace_template_is_mapped_onto_the_job() -> None:
    job = build(
        {
            "serviceAccountName": "",
            "workspaceTemplate": {
                "metadata": {"labels": {"workspace": "yes"}},
                "spec": {
                    "image": "registry/runner:1",
                    "imagePullPolicy": "Always",
                    "serviceAccountName": "deployer",
                    "resources": {"requests": {"cpu": "2"}},
                    "env": [{"name": "EXTRA", "value": "1"}],
                    "envFrom": [{"secretRef": {"name": "more"}}],
                    "podTemplate": {
                        "metadata": {"labels": {"team": "infra"}, "annotations": {"a": "b"}},
                        "spec": {
                            "nodeSelector": {"pool": "pulumi"},
                            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                            "volumes": [{"name": "cache", "emptyDir": {}}],
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                                    "env": [{"name": "FROM_POD", "value": "2"}],
                                }
                            ],
                        },
                    },
                },
            },
        }
    )
    pod = job["spec"]["template"]
    runner = container(job)
    assert runner["image"] == "registry/runner:1"
    assert runner["imagePullPolicy"] == "Always"
    assert runner["resources"] == {"requests": {"cpu": "2"}}
    assert {"EXTRA", "FROM_POD"} <= set(env(job))
    assert {"secretRef": {"name": "more"}} in runner["envFrom"]
    assert runner["volumeMounts"][0] == {"name": "cache", "mountPath": "/cache"}
    assert runner["securityContext"]["allowPrivilegeEscalation"] is False  # template kept
    assert pod["spec"]["serviceAccountName"] == "deployer"
    assert pod["spec"]["nodeSelector"] == {"pool": "pulumi"}
    assert {"name": "cache", "emptyDir": {}} in pod["spec"]["volumes"]
    assert pod["metadata"]["labels"]["team"] == "infra"
    assert pod["metadata"]["annotations"]["a"] == "b"
    # PKO puts workspaceTemplate.metadata on its Workspace, not on the workspace pod.
    assert job["metadata"]["labels"]["workspace"] == "yes"
    assert "workspace" not in pod["metadata"]["labels"]


def test_template_metadata_reaches_the_job_not_its_pod() -> None:
    job = build(
        {
            "workspaceTemplate": {
                "metadata": {
                    "labels": {"team": "infra", "layer": "workspace"},
                    "annotations": {"ws": "1"},
                }
            },
            "updateTemplate": {
                "metadata": {"labels": {"layer": "update"}, "annotations": {"up": "2"}}
            },
            "jobTemplate": {"metadata": {"labels": {"pod": "yes"}}},
        }
    )
    labels = job["metadata"]["labels"]
    assert labels["team"] == "infra"
    assert labels["layer"] == "update"  # updateTemplate.metadata after workspaceTemplate's
    assert labels["pod"] == "yes"
    assert labels[STACK_LABEL] == "app"
    assert {"ws": "1", "up": "2"}.items() <= job["metadata"]["annotations"].items()
    pod_meta = job["spec"]["template"]["metadata"]
    assert {"team", "layer"}.isdisjoint(pod_meta["labels"])
    assert {"ws", "up"}.isdisjoint(pod_meta.get("annotations") or {})
    assert pod_meta["labels"]["pod"] == "yes"


def test_template_metadata_cannot_replace_the_run_labels() -> None:
    job = build({"workspaceTemplate": {"metadata": {"labels": {STACK_LABEL: "other"}}}})
    assert job["metadata"]["labels"][STACK_LABEL] == "app"


def test_template_metadata_values_must_be_strings() -> None:
    with pytest.raises(JobBuildError, match=r"spec.updateTemplate.metadata.labels .*strings"):
        build({"updateTemplate": {"metadata": {"labels": {"tier": 1}}}})


def test_security_profile_restricted_is_the_default() -> None:
    for spec in ({}, {"workspaceTemplate": {"spec": {"securityProfile": "restricted"}}}):
        job = build(spec)
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert container(job)["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        assert check_pod(job["spec"]["template"]["metadata"], pod_spec, "restricted") == []


def test_security_profile_baseline_keeps_only_seccomp() -> None:
    job = build({"workspaceTemplate": {"spec": {"securityProfile": "baseline"}}})
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "securityContext" not in container(job)
    assert check_pod(job["spec"]["template"]["metadata"], pod_spec, "baseline") == []
    assert check_pod(job["spec"]["template"]["metadata"], pod_spec, "restricted") != []


def test_security_profile_baseline_under_a_templates_own_context() -> None:
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "securityProfile": "baseline",
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "securityContext": {"readOnlyRootFilesystem": True},
                                }
                            ]
                        }
                    },
                }
            }
        }
    )
    assert container(job)["securityContext"] == {"readOnlyRootFilesystem": True}


def test_security_profile_baseline_refused_under_a_restricted_operator() -> None:
    with pytest.raises(JobBuildError, match="restricted"):
        build(
            {"workspaceTemplate": {"spec": {"securityProfile": "baseline"}}},
            JobSettings(pod_security_level="restricted"),
        )


def test_security_profile_outside_pkos_values_is_invalid() -> None:
    with pytest.raises(ValueError, match="securityProfile"):
        StackSpec.model_validate(
            {"stack": "dev", "workspaceTemplate": {"spec": {"securityProfile": "privileged"}}}
        )


@pytest.mark.parametrize(
    ("ttl", "seconds"),
    [("1h", 3600), ("90m", 5400), ("1m", 600), ("0s", 600), ("100000h", MAX_SPEC_SECONDS)],
)
def test_update_ttl_after_completed_is_the_jobs_ttl(ttl: str, seconds: int) -> None:
    job = build({"updateTemplate": {"spec": {"ttlAfterCompleted": ttl}}})
    assert job["spec"]["ttlSecondsAfterFinished"] == seconds


def test_update_ttl_after_completed_must_be_a_duration() -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        StackSpec.model_validate(
            {"stack": "dev", "updateTemplate": {"spec": {"ttlAfterCompleted": "a day"}}}
        )


def test_stack_service_account_wins() -> None:
    job = build(
        {"serviceAccountName": "mine", "workspaceTemplate": {"spec": {"serviceAccountName": "ws"}}}
    )
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_job_template_cannot_break_the_run_contract() -> None:
    job = build(
        {
            "jobTemplate": {
                "metadata": {
                    "labels": {"cost-center": "42", "pkobatch.io/stack": "evil"},
                    "annotations": {"note": "x"},
                },
                "spec": {
                    "priorityClassName": "low",
                    "restartPolicy": "OnFailure",
                    "containers": [{"name": "pulumi", "command": ["sh"], "args": ["-c", "x"]}],
                },
            },
            "workspaceTemplate": {
                "spec": {"podTemplate": {"metadata": {"labels": {"pkobatch.io/operation": "x"}}}}
            },
        }
    )
    meta = job["metadata"]
    pod = job["spec"]["template"]
    assert (
        meta["labels"]["cost-center"] == "42" and pod["metadata"]["labels"]["cost-center"] == "42"
    )
    assert meta["labels"]["pkobatch.io/stack"] == "app"
    assert pod["metadata"]["labels"][OPERATION_LABEL] == "up"
    assert meta["annotations"]["note"] == "x" and RUN_ANNOTATION in meta["annotations"]
    assert pod["spec"]["priorityClassName"] == "low"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container(job)["command"] == ["pkobatch", "job", "run"]
    assert container(job)["args"][0] == "--snapshot"


def test_settings_command_and_image() -> None:
    settings = Settings(
        job={"image": "me/runner:dev", "command": "python,-m,pkobatch.main,job,run"}
    ).job
    job = build({}, settings)
    assert container(job)["image"] == "me/runner:dev"
    assert container(job)["command"] == ["python", "-m", "pkobatch.main", "job", "run"]


# ---------------------------------------------------------------------------------------
# Any image: the injected runner bundle
# ---------------------------------------------------------------------------------------

PULUMI_IMAGE = "pulumi/pulumi:3.134.1-nonroot"
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_the_runner_image_runs_pkobatch_itself() -> None:
    settings = JobSettings(image="pkobatch/runner:1")
    for spec in ({}, {"workspaceTemplate": {"spec": {"image": "pkobatch/runner:1"}}}):
        job = build(spec, settings)
        assert container(job)["image"] == "pkobatch/runner:1"
        assert container(job)["command"] == ["pkobatch", "job", "run"]
        assert "initContainers" not in pod_spec(job)
        # Only PKO's share volume: no runner bundle.
        assert pod_spec(job)["volumes"] == [{"name": "share", "emptyDir": {}}]
        assert container(job)["volumeMounts"] == [{"name": "share", "mountPath": "/share"}]


def test_another_image_runs_the_bundle_an_init_container_copies() -> None:
    settings = JobSettings(image="pkobatch/runner:1", image_pull_policy="Always")
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "image": PULUMI_IMAGE,
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
                }
            }
        },
        settings,
    )
    runner = container(job)
    assert runner["image"] == PULUMI_IMAGE
    assert runner["command"] == [INJECTED_RUNNER, "job", "run"]
    assert snapshot(job).operation == "up"  # the arguments are unchanged
    assert runner["volumeMounts"] == [
        {"name": "pkobatch-runner", "mountPath": "/pkobatch", "readOnly": True},
        {"name": "share", "mountPath": "/share"},
    ]
    # The launcher of the bundle directory the init container copies into the volume.
    assert f"{INJECTED_BUNDLE}/pkobatch-runner" == INJECTED_RUNNER
    assert INJECTED_BUNDLE.startswith("/pkobatch/")
    # As PKO runs workspace pods: the stock image's user "pulumi" is not numeric.
    assert runner["securityContext"]["runAsUser"] == 1000
    assert runner["securityContext"]["runAsGroup"] == 1000
    assert runner["securityContext"]["allowPrivilegeEscalation"] is False  # template kept
    assert pod_spec(job)["volumes"] == [
        {"name": "pkobatch-runner", "emptyDir": {}},
        {"name": "share", "emptyDir": {}},
    ]
    [init] = pod_spec(job)["initContainers"]
    assert init == {
        "name": "pkobatch-runner",
        "image": "pkobatch/runner:1",
        "imagePullPolicy": "Always",
        "command": ["cp", "-R", "/opt/pkobatch/runner", INJECTED_BUNDLE],
        "volumeMounts": [{"name": "pkobatch-runner", "mountPath": "/pkobatch"}],
        "securityContext": RESTRICTED,
        "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
        "env": [{"name": "PULUMI_ENV", "value": "/share/.env"}],  # as in every container
    }


def test_an_injected_pod_meets_pod_security_restricted() -> None:
    job = build(
        {"workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}}},
        JobSettings(pod_security_level="restricted"),
    )
    pod = job["spec"]["template"]
    assert pod_spec(job)["initContainers"]
    assert check_pod(pod["metadata"], pod["spec"], "restricted") == []


def test_the_init_container_is_restricted_whatever_the_template_says() -> None:
    template = builtin_template()
    del template["spec"]["template"]["spec"]["securityContext"]
    job = build_run(
        stack(),
        StackSpec.model_validate(
            {"stack": "dev", "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}}}
        ),
        RUN,
        JobSettings(),
        template,
    ).job
    assert pod_spec(job)["initContainers"][0]["securityContext"] == RESTRICTED


def test_job_template_image_changes_decide_the_injection() -> None:
    settings = JobSettings(image="pkobatch/runner:1")
    changed = build(
        {"jobTemplate": {"spec": {"containers": [{"name": "pulumi", "image": PULUMI_IMAGE}]}}},
        settings,
    )
    assert container(changed)["image"] == PULUMI_IMAGE
    assert container(changed)["command"] == [INJECTED_RUNNER, "job", "run"]
    assert [c["name"] for c in pod_spec(changed)["initContainers"]] == ["pkobatch-runner"]
    back = build(
        {
            "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}},
            "jobTemplate": {
                "spec": {"containers": [{"name": "pulumi", "image": "pkobatch/runner:1"}]}
            },
        },
        settings,
    )
    assert container(back)["command"] == ["pkobatch", "job", "run"]
    assert "initContainers" not in pod_spec(back)


def test_a_read_only_root_gets_a_writable_tmp_for_the_run() -> None:
    read_only = {"name": "pulumi", "securityContext": {"readOnlyRootFilesystem": True}}
    job = build(
        {
            "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}},
            "jobTemplate": {"spec": {"containers": [read_only]}},
        },
        JobSettings(image="pkobatch/runner:1"),
    )
    mounts = {m["mountPath"]: m["name"] for m in container(job)["volumeMounts"]}
    assert mounts["/tmp"] == "pkobatch-tmp"
    assert {"name": "pkobatch-tmp", "emptyDir": {}} in pod_spec(job)["volumes"]
    assert (env(job)["TMPDIR"]["value"], env(job)["HOME"]["value"]) == ("/tmp", "/tmp")
    assert container(job)["securityContext"]["readOnlyRootFilesystem"] is True
    # What the Stack sets itself stays: its own /tmp volume and HOME.
    own_tmp = {
        **read_only,
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
        "env": [{"name": "HOME", "value": "/home/me"}],
    }
    kept = build(
        {
            "jobTemplate": {
                "spec": {
                    "containers": [own_tmp],
                    "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
                }
            }
        }
    )
    assert "pkobatch-tmp" not in [v["name"] for v in pod_spec(kept)["volumes"]]
    assert [m["name"] for m in container(kept)["volumeMounts"] if m["mountPath"] == "/tmp"] == [
        "scratch"
    ]
    assert "pkobatch-tmp" not in [m["name"] for m in container(kept)["volumeMounts"]]
    assert (env(kept)["HOME"]["value"], env(kept)["TMPDIR"]["value"]) == ("/home/me", "/tmp")
    # A writable root needs nothing.
    plain = build({})
    assert "pkobatch-tmp" not in [v["name"] for v in pod_spec(plain).get("volumes") or []]
    assert "TMPDIR" not in env(plain)


def test_the_stacks_own_init_containers_and_volumes_are_kept() -> None:
    job = build(
        {
            "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}},
            "jobTemplate": {
                "spec": {
                    "initContainers": [{"name": "warm-cache", "image": "busybox"}],
                    "volumes": [{"name": "cache", "emptyDir": {}}],
                    "containers": [
                        {"name": "pulumi", "volumeMounts": [{"name": "cache", "mountPath": "/c"}]}
                    ],
                }
            },
        }
    )
    assert [c["name"] for c in pod_spec(job)["initContainers"]] == ["pkobatch-runner", "warm-cache"]
    assert [v["name"] for v in pod_spec(job)["volumes"]] == ["cache", "pkobatch-runner", "share"]
    assert [m["name"] for m in container(job)["volumeMounts"]] == [
        "cache",
        "pkobatch-runner",
        "share",
    ]


def test_a_user_named_by_a_template_is_kept() -> None:
    job = build(
        {
            "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}},
            "jobTemplate": {"spec": {"securityContext": {"runAsUser": 2000}}},
        }
    )
    assert "runAsUser" not in container(job)["securityContext"]
    assert "runAsGroup" not in container(job)["securityContext"]
    assert pod_spec(job)["securityContext"]["runAsUser"] == 2000
    own = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "image": PULUMI_IMAGE,
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {"name": "pulumi", "securityContext": {"runAsUser": 3000}}
                            ]
                        }
                    },
                }
            }
        }
    )
    assert container(own)["securityContext"]["runAsUser"] == 3000
    assert "runAsGroup" not in container(own)["securityContext"]


def test_bundle_settings() -> None:
    settings = Settings(
        job={"bundle_image": "pkobatch/runner-bundle:1", "runner_bundle": "/bundle/runner"}
    ).job
    job = build({"workspaceTemplate": {"spec": {"image": PULUMI_IMAGE}}}, settings)
    [init] = pod_spec(job)["initContainers"]
    assert init["image"] == "pkobatch/runner-bundle:1"
    assert init["command"] == ["cp", "-R", "/bundle/runner", INJECTED_BUNDLE]
    with pytest.raises(ValueError, match="not an absolute path"):
        Settings(job={"runner_bundle": "bin/runner"})


# ---------------------------------------------------------------------------------------
# Template and merge
# ---------------------------------------------------------------------------------------


def test_the_shipped_template_file_is_the_package_template() -> None:
    shipped = REPO_ROOT / "jobs" / "job-template.yaml"
    assert shipped.is_symlink() or shipped.exists()
    assert parse_template(shipped.read_text(), str(shipped)) == builtin_template()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("kind: Job\nspec: {template: {spec: {containers: [{name: other}]}}}", "named 'pulumi'"),
        ("kind: Pod", "kind: Job"),
        ("{{{", "not valid YAML"),
    ],
)
def test_custom_templates_are_checked(text: str, problem: str) -> None:
    with pytest.raises(JobBuildError, match=problem):
        parse_template(text, "my-template.yaml")


def test_custom_template_defaults_are_kept() -> None:
    template = parse_template(
        "apiVersion: batch/v1\nkind: Job\nspec:\n  backoffLimit: 6\n  template:\n    spec:\n"
        "      priorityClassName: batch\n      containers:\n      - name: pulumi\n"
        "        resources: {limits: {memory: 1Gi}}\n",
        "t.yaml",
    )
    job = build_run(stack(), StackSpec(stack="dev"), RUN, JobSettings(), template).job
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "batch"
    assert container(job)["resources"] == {"limits": {"memory": "1Gi"}}


def test_pod_templates_merge_as_a_strategic_merge_patch() -> None:
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "env": [{"name": "DROP_ME", "value": "1"}],
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pulumi",
                                    # Replaces the template's requests instead of adding to them.
                                    "resources": {"$patch": "replace", "limits": {"memory": "1Gi"}},
                                }
                            ],
                            "enableServiceLinks": None,
                        }
                    },
                }
            },
            "jobTemplate": {
                "spec": {
                    "containers": [
                        {"name": "pulumi", "env": [{"name": "DROP_ME", "$patch": "delete"}]}
                    ]
                }
            },
        }
    )
    assert container(job)["resources"] == {"limits": {"memory": "1Gi"}}
    assert "enableServiceLinks" not in pod_spec(job)
    assert "DROP_ME" not in env(job)


def test_a_pod_template_that_names_pkos_init_containers_is_refused() -> None:
    for name, instead in (
        ("fetch", "containers\\[name=pulumi\\]"),
        ("bootstrap", "pkobatch-runner"),
    ):
        patch = {"spec": {"initContainers": [{"name": name, "resources": {}}]}}
        with pytest.raises(JobBuildError, match=f"PKO's init container '{name}' .*{instead}"):
            build({"workspaceTemplate": {"spec": {"podTemplate": patch}}})


def test_the_refusal_of_a_pko_init_container_stalls_the_stack_with_its_message() -> None:
    patch = {"spec": {"initContainers": [{"name": "fetch", "env": [{"name": "HTTPS_PROXY"}]}]}}
    obj = {
        **stack(),
        "spec": {
            "stack": "dev",
            "projectRepo": "https://g/r.git",
            "branch": "main",
            "workspaceTemplate": {"spec": {"podTemplate": patch}},
        },
    }
    obj["metadata"]["finalizers"] = ["finalizer.stack.pulumi.com"]
    now = datetime(2026, 1, 1, tzinfo=UTC)
    observed = Observed(stack=obj, jobs=[], results={}, now=now, source=None)
    result = decide(observed, Settings(), builtin_template())
    assert result.create_job is None
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "SpecInvalid"
    assert "initContainers[name=fetch]: PKO's init container 'fetch'" in stalled["message"]


def test_the_templates_init_containers_stay_ahead_of_the_pod_templates_as_in_pko() -> None:
    template = parse_template(
        "kind: Job\n"
        "spec:\n"
        "  template:\n"
        "    spec:\n"
        "      initContainers: [{name: proxy, image: p}]\n"
        "      containers: [{name: pulumi}]\n",
        "t.yaml",
    )
    extra = {"name": "extra", "image": "busybox"}
    patch = {"spec": {"initContainers": [extra]}}
    spec = StackSpec.model_validate(
        {
            "stack": "dev",
            "workspaceTemplate": {"spec": {"image": PULUMI_IMAGE, "podTemplate": patch}},
        }
    )
    job = build_run(stack(), spec, RUN, JobSettings(), template).job
    names = [c["name"] for c in pod_spec(job)["initContainers"]]
    assert names == ["pkobatch-runner", "proxy", "extra"]


def test_an_invalid_pod_template_patch_is_refused_naming_the_field() -> None:
    bad = {"spec": {"containers": [{"$patch": "merge", "name": "pulumi"}]}}
    with pytest.raises(
        JobBuildError, match=r"spec\.workspaceTemplate\.spec\.podTemplate is not a valid"
    ):
        build({"workspaceTemplate": {"spec": {"podTemplate": bad}}})
    with pytest.raises(
        JobBuildError, match=r"spec\.jobTemplate\.spec is not a valid .*merge key 'name'"
    ):
        build({"jobTemplate": {"spec": {"containers": [{"image": "x"}]}}})


def test_no_secret_values_can_be_in_a_job() -> None:
    # Every credential field names a Secret; the built Job holds names and keys only.
    job = build(
        {
            "projectRepo": "https://g/x.git",
            "branch": "main",
            "gitAuth": {
                "accessToken": {"type": "Secret", "secret": {"name": "git", "key": "token"}}
            },
            "envRefs": {"T": {"type": "Secret", "secret": {"name": "s", "key": "k"}}},
            "secretsRef": {"p": {"type": "Secret", "secret": {"name": "s", "key": "p"}}},
        }
    )
    assert snapshot(job).secret_env == ["PKOBATCH_GIT_TOKEN", "PKOBATCH_SECRET_0", "T"]
    for variable in container(job)["env"]:
        assert "value" not in variable or variable["name"] in (
            "PKOBATCH_GRACE_PERIOD_SECONDS",
            "PKOBATCH_TERMINATION_MESSAGE_PATH",
            "PULUMI_ENV",
        )
    assert json.dumps(job).count("secretKeyRef") == 3


# ---------------------------------------------------------------------------------------
# Inline secret values, a large snapshot, the Job's UID: how they reach the run
# ---------------------------------------------------------------------------------------

SENTINEL = "sentinel-inline-5f1d"


def build_objects(spec: dict[str, Any]) -> RunObjects:
    return build_run(
        stack(),
        StackSpec.model_validate({"stack": "dev", **spec}),
        RUN,
        JobSettings(),
        builtin_template(),
    )


def test_inline_secret_values_go_into_a_secret_of_the_run() -> None:
    objects = build_objects(
        {
            "projectRepo": "https://g/x.git",
            "branch": "main",
            "config": {"app:plain": "visible"},
            "secrets": {"app:b": f"{SENTINEL}-b", "app:a": f"{SENTINEL}-a"},
            "secretsRef": {"app:lit": {"type": "Literal", "literal": {"value": f"{SENTINEL}-l"}}},
            "gitAuth": {
                "basicAuth": {
                    "userName": {"type": "Literal", "literal": {"value": "bot"}},
                    "password": {"type": "Literal", "literal": {"value": f"{SENTINEL}-pw"}},
                }
            },
        }
    )
    job = objects.job
    assert SENTINEL not in json.dumps(job)
    name = job["metadata"]["name"]
    [secret] = objects.inputs
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == f"{name}-secrets"
    assert secret["immutable"] is True
    assert secret["stringData"] == {
        "PKOBATCH_INLINE_SECRET_0": f"{SENTINEL}-a",
        "PKOBATCH_INLINE_SECRET_1": f"{SENTINEL}-b",
        "PKOBATCH_SECRET_0": f"{SENTINEL}-l",
        "PKOBATCH_GIT_PASSWORD": f"{SENTINEL}-pw",
    }
    variables = env(job)
    for key in secret["stringData"]:
        ref = {"secretKeyRef": {"name": f"{name}-secrets", "key": key}}
        assert variables[key]["valueFrom"] == ref  # not optional: the pod waits for it
    assert variables["PKOBATCH_GIT_USERNAME"]["value"] == "bot"
    snap = snapshot(job)
    assert snap.spec["secrets"] == {"app:a": "[secret]", "app:b": "[secret]"}
    assert snap.spec["secretsRef"]["app:lit"]["literal"]["value"] == "[secret]"
    assert snap.spec["gitAuth"]["basicAuth"]["password"]["literal"]["value"] == "[secret]"
    assert snap.spec["config"] == {"app:plain": "visible"}
    assert snap.secrets_from_env == {
        "app:a": "PKOBATCH_INLINE_SECRET_0",
        "app:b": "PKOBATCH_INLINE_SECRET_1",
    }
    # The runner scrubs them from everything it writes.
    assert set(secret["stringData"]) <= set(snap.secret_env)
    # Owned by nothing yet: the controller adds the Job as owner once it exists.
    assert "ownerReferences" not in secret["metadata"]
    assert "app.kubernetes.io/managed-by" not in secret["metadata"]["labels"]


def test_an_inline_github_app_key_goes_into_the_runs_secret() -> None:
    literal = {"type": "Literal", "literal": {"value": "1"}}
    objects = build_objects(
        {
            "projectRepo": "https://github.com/o/r.git",
            "branch": "main",
            "gitAuth": {
                "githubApp": {
                    "appID": literal,
                    "installationID": literal,
                    "privateKey": {"type": "Literal", "literal": {"value": SENTINEL}},
                }
            },
        }
    )
    assert SENTINEL not in json.dumps(objects.job)
    [secret] = objects.inputs
    assert secret["stringData"] == {"PKOBATCH_GIT_GITHUB_APP_PRIVATE_KEY": SENTINEL}
    app = snapshot(objects.job).spec["gitAuth"]["githubApp"]
    assert app["privateKey"]["literal"]["value"] == "[secret]"
    assert app["appID"]["literal"]["value"] == "1"


def test_a_stack_without_inline_secrets_needs_nothing_but_its_job() -> None:
    objects = build_objects(
        {"secretsRef": {"p": {"type": "Secret", "secret": {"name": "s", "key": "p"}}}}
    )
    assert objects.inputs == ()


def test_an_inline_secret_too_large_for_the_environment_is_refused() -> None:
    with pytest.raises(JobBuildError, match=r"spec\.secrets\.big: the value is larger"):
        build_objects({"secrets": {"big": "x" * (200 * 1024)}})


def test_a_large_snapshot_travels_in_configmaps_and_the_job_records_its_digest() -> None:
    big = "é" + "x" * (1024 * 1024)  # a 1 MB config value, with a two-byte character
    objects = build_objects({"config": {"app:big": big}, "secrets": {"s": SENTINEL}})
    job = objects.job
    name = job["metadata"]["name"]
    args = container(job)["args"]
    parts = [obj for obj in objects.inputs if obj["kind"] == "ConfigMap"]
    assert len(parts) == 2
    assert args == [
        "--snapshot-configmap",
        f"team/{name}-snapshot-0",
        "--snapshot-configmap",
        f"team/{name}-snapshot-1",
        "--snapshot-sha256",
        snapshot_sha256("".join(p["data"]["snapshot.json"] for p in parts)),
    ]
    assert len(json.dumps(job)) < MAX_INLINE_SNAPSHOT_BYTES
    for part in parts:
        assert len(part["data"]["snapshot.json"].encode()) <= SNAPSHOT_PART_BYTES
        assert part["immutable"] is True
        assert "app.kubernetes.io/managed-by" not in part["metadata"]["labels"]
        assert part["metadata"]["labels"]["pkobatch.io/run-input-of"] == name
    text = "".join(p["data"]["snapshot.json"] for p in parts)
    snap = RunSnapshot.model_validate_json(text)
    assert snap.spec["config"]["app:big"] == big
    # Secret values stay out of the ConfigMaps: they are in the run's Secret.
    assert SENTINEL not in text
    assert [obj["kind"] for obj in objects.inputs] == ["ConfigMap", "ConfigMap", "Secret"]


def test_a_small_snapshot_stays_in_the_job() -> None:
    objects = build_objects({"config": {"app:v": "x" * 1000}})
    assert objects.inputs == ()
    assert snapshot(objects.job).spec["config"]["app:v"] == "x" * 1000


def test_the_runner_learns_its_job_uid_from_the_pod_label() -> None:
    variables = env(build({}))
    assert variables["PKOBATCH_JOB_UID"] == {
        "name": "PKOBATCH_JOB_UID",
        "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}
        },
    }


def test_the_runner_vouches_for_its_result_where_the_pod_reports_it_despite_templates() -> None:
    moved = {"name": "pulumi", "terminationMessagePath": "/tmp/elsewhere"}
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "env": [{"name": "PKOBATCH_TERMINATION_MESSAGE_PATH", "value": "/tmp/x"}],
                    "podTemplate": {"spec": {"containers": [moved]}},
                }
            },
            "jobTemplate": {"spec": {"containers": [moved]}},
        }
    )
    assert container(job)["terminationMessagePath"] == "/dev/termination-log"
    assert env(job)["PKOBATCH_TERMINATION_MESSAGE_PATH"] == {
        "name": "PKOBATCH_TERMINATION_MESSAGE_PATH",
        "value": "/dev/termination-log",
    }
    names = [v["name"] for v in container(job)["env"]]
    assert names.count("PKOBATCH_TERMINATION_MESSAGE_PATH") == 1


def test_inputs_are_owned_by_their_job() -> None:
    objects = build_objects({"secrets": {"s": SENTINEL}})
    owned = owned_by_job(objects.inputs[0], "app-up-1", "job-uid")
    assert owned["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "app-up-1",
            "uid": "job-uid",
            "controller": True,
        }
    ]
    assert "ownerReferences" not in objects.inputs[0]["metadata"]


# ---------------------------------------------------------------------------------------
# PKO's dynamic environment ($PULUMI_ENV on the share volume)
# ---------------------------------------------------------------------------------------


def test_pkos_share_volume_and_pulumi_env_reach_every_container() -> None:
    # The pod template of PKO's own test manifest (operator/e2e/testdata/issue-937).
    writer = {
        "name": "extra",
        "image": "busybox",
        "command": ["sh", "-c", "echo 'PULUMI_CONFIG_PASSPHRASE=test' >> $PULUMI_ENV"],
        "volumeMounts": [{"name": "share", "mountPath": "/share"}],
    }
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "image": PULUMI_IMAGE,
                    "podTemplate": {
                        "spec": {
                            "initContainers": [writer],
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "volumeMounts": [{"name": "state", "mountPath": "/state"}],
                                }
                            ],
                            "volumes": [{"name": "state", "emptyDir": {}}],
                        }
                    },
                }
            }
        }
    )
    spec = pod_spec(job)
    assert {"name": "share", "emptyDir": {}} in spec["volumes"]
    assert [v["name"] for v in spec["volumes"]].count("share") == 1
    assert {"name": "share", "mountPath": "/share"} in container(job)["volumeMounts"]
    containers = [*spec["initContainers"], *spec["containers"]]
    assert {c["name"] for c in containers} == {"pkobatch-runner", "extra", "pulumi"}
    for each in containers:
        values = [e.get("value") for e in each["env"] if e["name"] == "PULUMI_ENV"]
        assert values == ["/share/.env"], each["name"]


def test_a_templates_own_share_volume_and_mount_are_kept() -> None:
    job = build(
        {
            "workspaceTemplate": {
                "spec": {
                    "env": [{"name": "PULUMI_ENV", "value": "/elsewhere"}],
                    "podTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pulumi",
                                    "volumeMounts": [{"name": "share", "mountPath": "/share"}],
                                }
                            ],
                            "volumes": [{"name": "share", "emptyDir": {"medium": "Memory"}}],
                        }
                    },
                }
            }
        }
    )
    spec = pod_spec(job)
    assert [v for v in spec["volumes"] if v["name"] == "share"] == [
        {"name": "share", "emptyDir": {"medium": "Memory"}}
    ]
    mounts = [m for m in container(job)["volumeMounts"] if m["name"] == "share"]
    assert mounts == [{"name": "share", "mountPath": "/share"}]
    assert env(job)["PULUMI_ENV"] == {"name": "PULUMI_ENV", "value": "/share/.env"}


def test_the_share_volume_meets_pod_security_restricted() -> None:
    job = build({}, JobSettings(pod_security_level="restricted"))
    pod = job["spec"]["template"]
    assert {"name": "share", "emptyDir": {}} in pod["spec"]["volumes"]
    assert check_pod(pod["metadata"], pod["spec"], "restricted") == []
