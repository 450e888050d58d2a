"""The Stack models: round-trips, validation messages, the alias dialect, schedules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from pkobatch.api import (
    NOOP_FIELDS,
    SpecAliasError,
    Stack,
    StackSpec,
    load_stack_spec,
    noop_fields_in_use,
    normalize_spec,
    validate_stack_spec,
)
from pkobatch.api.stack.spec import (
    EXTENSION_FIELDS,
    GIT_AUTH_METHODS,
    WorkspaceTemplateSpec,
    check_cron,
    check_time_zone,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "tests" / "fixtures" / "manifests"
ALIAS_MANIFESTS = {"alias-dialect.yaml"}


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((MANIFESTS / name).read_text())
    assert isinstance(document, dict)
    return document


def canonical_fixtures() -> list[str]:
    names = sorted(p.name for p in MANIFESTS.glob("*.yaml"))
    assert len(names) >= 12, names
    return [n for n in names if n not in ALIAS_MANIFESTS]


def wire_fields(model: type[Any]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


# --- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("name", canonical_fixtures())
def test_canonical_manifest_round_trips_unchanged(name: str) -> None:
    document = load(name)
    spec = StackSpec.model_validate(document["spec"])
    assert spec.to_manifest() == document["spec"]
    assert Stack.model_validate(document).to_manifest() == document


@pytest.mark.parametrize("name", canonical_fixtures())
def test_canonical_manifest_has_no_problems(name: str) -> None:
    document = load(name)
    check = load_stack_spec(document["spec"], namespace=document["metadata"]["namespace"])
    assert check.problems == []
    assert check.alias_notes == []
    assert check.valid


def test_fixtures_use_every_pko_field_and_extension() -> None:
    specs = [load(name)["spec"] for name in canonical_fixtures()]
    used = set().union(*(spec.keys() for spec in specs))
    assert wire_fields(StackSpec) - used == set()
    assert len(wire_fields(StackSpec) - set(EXTENSION_FIELDS)) == 38

    methods = set().union(*(spec.get("gitAuth", {}).keys() for spec in specs))
    assert methods == set(GIT_AUTH_METHODS)
    workspace_fields = set().union(
        *(spec.get("workspaceTemplate", {}).get("spec", {}).keys() for spec in specs)
    )
    assert wire_fields(WorkspaceTemplateSpec) - workspace_fields == set()


def test_status_round_trips_with_typed_fields() -> None:
    stack = Stack.model_validate(load("with-status.yaml"))
    assert stack.status is not None
    assert stack.status.last_update is not None
    assert stack.status.last_update.last_resync_time is not None
    assert stack.status.last_update.last_resync_time.isoformat() == "2026-08-01T10:02:31+00:00"
    assert stack.status.outputs == {
        "url": "https://app.example.com",
        "replicas": 3,
        "password": "[secret]",
        "endpoints": ["a", "b"],
    }
    assert stack.status.project_info is not None
    assert stack.status.project_info.runtime == "python"
    assert stack.status.conditions is not None
    assert [c.type for c in stack.status.conditions] == ["Ready", "Reconciling"]


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(min_size=1, max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@given(config=st.dictionaries(st.text(min_size=1, max_size=30), JSON_VALUES, max_size=6))
def test_any_json_config_round_trips(config: dict[str, Any]) -> None:
    spec = {"stack": "dev", "config": config}
    assert StackSpec.model_validate(spec).to_manifest() == spec


# --- the alias dialect -----------------------------------------------------------------


def test_alias_dialect_normalises_to_canonical_fields() -> None:
    document = load("alias-dialect.yaml")
    canonical, notes = normalize_spec(document["spec"])
    assert canonical == {
        "stack": "my-org/my-project/dev",
        "projectRepo": "https://github.com/example/infra",
        "branch": "main",
        "repoDir": "./infrastructure/aws",
        "config": {"aws:region": "us-west-2", "app:replicas": "3"},
        "envSecrets": ["pulumi-access-token"],
        "backend": "s3://my-pulumi-backend-bucket",
        "destroyOnFinalize": True,
    }
    assert len(notes) == 4
    joined = "\n".join(notes)
    for alias, target in [
        ("spec.projectPath", "spec.repoDir"),
        ("spec.destroyOnDelete", "spec.destroyOnFinalize"),
        ("spec.envSecrets[].name", "spec.envSecrets"),
        ("spec.backend.url", "spec.backend"),
    ]:
        assert alias in joined
        assert target in joined
    # Each note reads as a sentence, never "the canonical name a Secret name".
    assert "prefer the canonical name a " not in joined
    # The model reads the alias dialect directly too.
    assert StackSpec.model_validate(document["spec"]).to_manifest() == canonical


def test_alias_dialect_loads_cleanly_with_notes() -> None:
    document = load("alias-dialect.yaml")
    check = load_stack_spec(document["spec"], namespace="pulumi-system")
    assert check.valid, check.problems
    assert check.spec is not None
    assert check.spec.repo_dir == "./infrastructure/aws"
    assert check.spec.destroy_on_finalize is True
    assert check.spec.env_secrets == ["pulumi-access-token"]
    assert check.spec.backend == "s3://my-pulumi-backend-bucket"
    assert len(check.alias_notes) == 4


def test_normalize_does_not_modify_its_input() -> None:
    spec = load("alias-dialect.yaml")["spec"]
    before = copy.deepcopy(spec)
    normalize_spec(spec)
    assert spec == before


def test_alias_equal_to_canonical_is_accepted() -> None:
    canonical, notes = normalize_spec({"stack": "s", "projectPath": "a", "repoDir": "a"})
    assert canonical == {"stack": "s", "repoDir": "a"}
    assert len(notes) == 1


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"stack": "s", "projectPath": "a", "repoDir": "b"},
            "spec.projectPath is an alias of spec.repoDir, and they disagree",
        ),
        (
            {"stack": "s", "destroyOnDelete": True, "destroyOnFinalize": False},
            "spec.destroyOnDelete is an alias of spec.destroyOnFinalize",
        ),
        (
            {"stack": "s", "envSecrets": ["a", {"name": "b", "key": "token"}]},
            "spec.envSecrets[1] must be a Secret name or {name: <secret>}",
        ),
        ({"stack": "s", "backend": {"url": "s3://b", "region": "x"}}, "spec.backend must be"),
    ],
)
def test_alias_conflicts_are_clear_errors(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecAliasError, match=r".*") as raised:
        normalize_spec(spec)
    assert expected in str(raised.value)
    check = load_stack_spec(spec)
    assert check.spec is None
    assert any(expected in p for p in check.problems), check.problems


@given(
    repo_dir=st.text(min_size=1, max_size=20),
    destroy=st.booleans(),
    secrets=st.lists(st.text(min_size=1, max_size=10), max_size=4),
    backend=st.text(min_size=1, max_size=20),
)
def test_alias_and_canonical_forms_read_the_same(
    repo_dir: str, destroy: bool, secrets: list[str], backend: str
) -> None:
    canonical = {
        "stack": "dev",
        "repoDir": repo_dir,
        "destroyOnFinalize": destroy,
        "envSecrets": secrets,
        "backend": backend,
    }
    aliased = {
        "stack": "dev",
        "projectPath": repo_dir,
        "destroyOnDelete": destroy,
        "envSecrets": [{"name": s} for s in secrets] or [],
        "backend": {"url": backend},
    }
    assert StackSpec.model_validate(aliased) == StackSpec.model_validate(canonical)
    assert normalize_spec(normalize_spec(aliased)[0])[0] == normalize_spec(aliased)[0]


def test_pko_install_docs_stack_validates() -> None:
    document = load("pko-install-docs.yaml")
    check = load_stack_spec(document["spec"], namespace="default")
    assert check.valid, check.problems
    assert check.spec is not None
    assert check.spec.service_account_name == "pulumi"
    assert check.spec.environment == ["my-org/dev-credentials"]
    assert check.spec.env_refs is not None
    token = check.spec.env_refs["PULUMI_ACCESS_TOKEN"]
    assert token.type == "Secret"
    assert token.secret is not None
    assert (token.secret.name, token.secret.key) == ("pulumi-api-secret", "accessToken")


def test_docs_examples_are_the_fixtures() -> None:
    for name in ("alias-dialect.yaml", "pko-install-docs.yaml"):
        assert (REPO_ROOT / "docs" / "examples" / name).read_text() == (
            MANIFESTS / name
        ).read_text()


# --- invalid specs -------------------------------------------------------------------

BASE: dict[str, Any] = {
    "stack": "acme/app/dev",
    "projectRepo": "https://github.com/example/app",
    "branch": "main",
}


def secret_ref(name: str = "s", key: str = "k", **extra: Any) -> dict[str, Any]:
    return {"type": "Secret", "secret": {"name": name, "key": key, **extra}}


INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "branch and commit",
        {"commit": "abc"},
        ["spec.branch and spec.commit are both set", "exactly"],
    ),
    (
        "neither branch nor commit",
        {"branch": None},
        ["spec.projectRepo needs spec.branch", "or spec.commit"],
    ),
    (
        "two sources",
        {"fluxSource": {"sourceRef": {"apiVersion": "v1", "kind": "GitRepository", "name": "x"}}},
        ["spec.projectRepo, spec.fluxSource are alternative sources", "keep only one"],
    ),
    (
        "three sources",
        {
            "fluxSource": {"sourceRef": {"apiVersion": "v", "kind": "K", "name": "x"}},
            "programRef": {"name": "p"},
        },
        ["spec.projectRepo, spec.fluxSource, spec.programRef are alternative sources"],
    ),
    (
        "branch without projectRepo",
        {"projectRepo": None, "programRef": {"name": "p"}},
        ["spec.branch is set but spec.projectRepo is not"],
    ),
    (
        "two git auth methods",
        {
            "gitAuth": {
                "accessToken": secret_ref(),
                "sshAuth": {"sshPrivateKey": secret_ref()},
            }
        },
        ["spec.gitAuth has 2 methods (accessToken, sshAuth): keep only one"],
    ),
    ("empty git auth", {"gitAuth": {}}, ["spec.gitAuth has no method: set one of accessToken"]),
    (
        "a Flux source of another group",
        {
            "projectRepo": None,
            "branch": None,
            "fluxSource": {"sourceRef": {"apiVersion": "example.com/v1", "kind": "K", "name": "x"}},
        },
        [
            "spec.fluxSource.sourceRef.apiVersion 'example.com/v1' is not a Flux source's: use "
            "source.toolkit.fluxcd.io/<version>"
        ],
    ),
    (
        "Env ref",
        {"envRefs": {"TOKEN": {"type": "Env", "env": {"name": "TOKEN"}}}},
        ["spec.envRefs.TOKEN: type Env is deprecated", "use type Secret", "type Literal"],
    ),
    (
        "FS ref in secretsRef",
        {"secretsRef": {"app:pw": {"type": "FS", "filesystem": {"path": "/x"}}}},
        ["spec.secretsRef.app:pw: type FS is deprecated"],
    ),
    (
        "FS ref in git auth",
        {"gitAuth": {"accessToken": {"type": "FS", "filesystem": {"path": "/x"}}}},
        ["spec.gitAuth.accessToken: type FS is deprecated"],
    ),
    (
        "type without its field",
        {"envRefs": {"A": {"type": "Secret", "literal": {"value": "v"}}}},
        ["spec.envRefs.A: type Secret needs the field secret", "but literal is also set"],
    ),
    (
        "extra sub-field",
        {
            "envRefs": {
                "A": {
                    "type": "Literal",
                    "literal": {"value": "v"},
                    "secret": {"name": "s", "key": "k"},
                }
            }
        },
        ["spec.envRefs.A: type Literal reads only literal, but secret is also set"],
    ),
    (
        "cross-namespace secret",
        {"envRefs": {"A": secret_ref(namespace="other")}},
        ["spec.envRefs.A.secret.namespace: cross-namespace refs are not allowed", "'team-a'"],
    ),
    (
        "cross-namespace ssh key",
        {"gitAuth": {"sshAuth": {"sshPrivateKey": secret_ref(namespace="other")}}},
        ["spec.gitAuth.sshAuth.sshPrivateKey.secret.namespace: cross-namespace"],
    ),
    (
        "remediate a preview stack",
        {"preview": True, "driftDetection": {"schedule": "0 * * * *", "remediate": True}},
        ["spec.driftDetection.remediate runs an update, but spec.preview"],
    ),
    ("empty stack name", {"stack": " "}, ["spec.stack is empty"]),
    # Model errors.
    ("stack missing", {"stack": None}, ["spec.stack: Field required"]),
    (
        "unknown ref type",
        {"envRefs": {"A": {"type": "Vault"}}},
        ["spec.envRefs.A.type: Input should be 'Env', 'FS', 'Secret' or 'Literal'"],
    ),
    (
        "ref without type",
        {"gitAuth": {"basicAuth": {"userName": {"literal": {"value": "u"}}}}},
        [
            "spec.gitAuth.basicAuth.userName.type: Field required",
            "spec.gitAuth.basicAuth.password: Field required",
        ],
    ),
    (
        "int as string",
        {"resyncFrequencySeconds": "60"},
        ["spec.resyncFrequencySeconds: Input should be a valid integer"],
    ),
    ("bool as string", {"refresh": "true"}, ["spec.refresh: Input should be a valid boolean"]),
    ("config as list", {"config": ["a"]}, ["spec.config: Input should be a valid dictionary"]),
    (
        "reclaim policy",
        {"workspaceReclaimPolicy": "Keep"},
        ["spec.workspaceReclaimPolicy: Input should be 'Retain' or 'Delete'"],
    ),
    ("typo", {"projectPaht": "x"}, ["spec.projectPaht: Extra inputs are not permitted"]),
    (
        "prerequisite duration",
        {"prerequisites": [{"name": "a"}, {"name": "b", "requirement": {"succeededWithin": "1h"}}]},
        ["spec.prerequisites[1].requirement.succeededWithin: Extra inputs are not permitted"],
    ),
    (
        "bad prerequisite duration",
        {"prerequisites": [{"name": "b", "requirement": {"succeededWithinDuration": "1 hour"}}]},
        ["spec.prerequisites[0].requirement.succeededWithinDuration: invalid duration"],
    ),
    ("six-field cron", {"schedule": "0 0 * * * *"}, ["spec.schedule: '0 0 * * * *' is not a 5"]),
    ("cron macro", {"schedule": "@daily"}, ["spec.schedule: '@daily' is not a 5-field cron"]),
    ("cron range", {"schedule": "61 * * * *"}, ["spec.schedule: '61 * * * *' is not a valid"]),
    ("cron never", {"schedule": "0 0 31 2 *"}, ["spec.schedule: '0 0 31 2 *' is not a valid"]),
    (
        "drift cron",
        {"driftDetection": {"schedule": "every hour"}},
        ["spec.driftDetection.schedule: 'every hour' is not a 5-field cron"],
    ),
    ("time zone", {"timeZone": "Mars/Olympus"}, ["spec.timeZone: 'Mars/Olympus' is not an IANA"]),
    (
        "zero timeout",
        {"timeoutSeconds": 0},
        ["spec.timeoutSeconds: Input should be greater than 0"],
    ),
    (
        "job template labels",
        {"jobTemplate": {"metadata": {"labels": {"a": 1}}}},
        ["spec.jobTemplate.metadata.labels.a: Input should be a valid string"],
    ),
    (
        "workspace image",
        {"workspaceTemplate": {"spec": {"image": ["x"]}}},
        ["spec.workspaceTemplate.spec.image: Input should be a valid string"],
    ),
]


@pytest.mark.parametrize(
    ("change", "expected"), [(c, e) for _, c, e in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_spec_is_reported_naming_the_field(
    change: dict[str, Any], expected: list[str]
) -> None:
    spec = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    check = load_stack_spec(spec, namespace="team-a")
    assert not check.valid
    report = "\n".join(check.problems)
    for fragment in expected:
        assert fragment in report, report


def test_same_namespace_secret_ref_is_accepted() -> None:
    spec = StackSpec.model_validate({**BASE, "envRefs": {"A": secret_ref(namespace="team-a")}})
    assert validate_stack_spec(spec, namespace="team-a") == []


def test_model_errors_raise_validation_error() -> None:
    with pytest.raises(ValidationError):
        StackSpec.model_validate({**BASE, "timeoutSeconds": -5})


def test_source_kind() -> None:
    assert StackSpec.model_validate(BASE).source_kind() == "git"
    assert StackSpec.model_validate(load("flux-source.yaml")["spec"]).source_kind() == "flux"
    assert StackSpec.model_validate(load("program-ref.yaml")["spec"]).source_kind() == "program"
    assert StackSpec.model_validate(load("custom-source.yaml")["spec"]).source_kind() == "none"


# --- schedules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    ["0 3 * * *", "*/15 * * * *", "H 2 * * 1-5", "H(0-29)/10 H * * *", "0 9 1,15 * MON"],
)
def test_valid_cron(expr: str) -> None:
    assert check_cron(expr) == expr


@pytest.mark.parametrize(
    "expr", ["", "* * * *", "0 0 * * * *", "@hourly", "60 * * * *", "* 24 * * *", "x * * * *"]
)
def test_invalid_cron(expr: str) -> None:
    with pytest.raises(ValueError, match="cron"):
        check_cron(expr)


@given(
    minute=st.integers(0, 59),
    hour=st.integers(0, 23),
    dom=st.integers(1, 28),
    month=st.integers(1, 12),
    dow=st.integers(0, 6),
)
def test_every_in_range_cron_is_valid(
    minute: int, hour: int, dom: int, month: int, dow: int
) -> None:
    check_cron(f"{minute} {hour} {dom} {month} {dow}")


@given(st.lists(st.sampled_from(["*", "1", "H", "*/5"]), min_size=0, max_size=8))
def test_cron_field_count_must_be_five(fields: list[str]) -> None:
    expr = " ".join(fields)
    if len(fields) == 5:
        check_cron(expr)
    else:
        with pytest.raises(ValueError, match="5-field"):
            check_cron(expr)


@pytest.mark.parametrize("name", ["UTC", "Europe/Paris", "America/Argentina/Buenos_Aires"])
def test_valid_time_zone(name: str) -> None:
    assert check_time_zone(name) == name


@pytest.mark.parametrize("name", ["", "Paris", "Mars/Olympus", "../etc/passwd", "UTC+2"])
def test_invalid_time_zone(name: str) -> None:
    with pytest.raises(ValueError, match="IANA"):
        check_time_zone(name)


# --- no-op fields --------------------------------------------------------------------


def test_noop_fields_in_use_are_detected() -> None:
    found = {n.path for n in noop_fields_in_use(StackSpec.model_validate(BASE))}
    assert found == set()
    deprecated = StackSpec.model_validate(load("deprecated-fields.yaml")["spec"])
    assert {n.path for n in noop_fields_in_use(deprecated)} == {
        "spec.expectNoRefreshChanges",
        "spec.retryOnUpdateConflict",
    }
    custom = StackSpec.model_validate(load("custom-source.yaml")["spec"])
    # Its workspaceTemplate.metadata and securityProfile are honoured, not reported.
    assert {n.path for n in noop_fields_in_use(custom)} == {"spec.workspaceReclaimPolicy"}
    preview = StackSpec.model_validate(load("preview-prerequisites.yaml")["spec"])
    assert {n.path for n in noop_fields_in_use(preview)} == set()
    service = StackSpec.model_validate(
        {**BASE, "workspaceTemplate": {"spec": {"serviceTemplate": {"metadata": {}}}}}
    )
    assert {n.path for n in noop_fields_in_use(service)} == {
        "spec.workspaceTemplate.spec.serviceTemplate"
    }


def test_noop_fields_have_reasons_and_unique_paths() -> None:
    paths = [n.path for n in NOOP_FIELDS]
    assert len(paths) == len(set(paths))
    assert all(p.startswith("spec.") and n.reason for p, n in zip(paths, NOOP_FIELDS, strict=True))
