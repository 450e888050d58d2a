"""Every field of the Stack and Program CRDs is honoured or reported: none is accepted and
silently dropped.

The walk classifies each property path of the generated CRDs down to the fields users set:
spec's own fields, and each field of the PKO templates ``workspaceTemplate`` and
``updateTemplate`` (the ones that exist for PKO's Workspace and Update objects). A deeper
path (``spec.gitAuth.sshAuth.sshPrivateKey``, ``program.resources{}``) is the value of the
classified field above it. A field is either

- honoured: ``HONOURED`` names the module that reads it and what it reads there, and the
  test checks that the module still reads it; or
- reported: listed in ``NOOP_FIELDS``, named in the SpecNotes Event and the FieldsIgnored
  condition of every Stack that sets it (tests/unit/test_controller_decide_bounds.py,
  tests/integration/test_controller_basics.py).

A new CRD field without a classification, a field classified twice, and a reader that no
longer reads its field all fail here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml
from helpers.schema_paths import walk

from pkobatch.api import NOOP_FIELDS
from pkobatch.controller.auto_runs import TEMPLATE_FIELDS, UPDATE_OPTIONS

REPO_ROOT = Path(__file__).resolve().parents[2]
STACK_CRD = REPO_ROOT / "crds" / "pulumi.com_stacks.yaml"
PROGRAM_CRD = REPO_ROOT / "crds" / "pulumi.com_programs.yaml"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
TEMPLATES: Final = ("spec.workspaceTemplate", "spec.updateTemplate")

RUNNER = "pkobatch/runner/execute.py"
EMBEDDED = "pkobatch/runner/embedded.py"
CONFIG = "pkobatch/runner/stack_config.py"
BUILDER = "pkobatch/controller/job_builder.py"
CREDENTIALS = "pkobatch/controller/run_credentials.py"
RETRY = "pkobatch/controller/retry.py"
SCHEDULE = "pkobatch/controller/schedule.py"
NORMALIZE = "pkobatch/api/stack/normalize.py"
PROGRAM = "pkobatch/api/program.py"

# field path -> (module that reads it, what it reads: a regular expression over its source)
HONOURED: Final[dict[str, tuple[str, str]]] = {
    "spec.stack": (RUNNER, r"\.stack\b"),
    "spec.projectRepo": (RUNNER, r"\.project_repo\b"),
    "spec.branch": (RUNNER, r"\.branch\b"),
    "spec.commit": (RUNNER, r"\.commit\b"),
    "spec.repoDir": (RUNNER, r"\.repo_dir\b"),
    "spec.shallow": (RUNNER, r"\.shallow\b"),
    "spec.gitAuth": (RUNNER, r"\.git_auth\b"),
    "spec.gitAuthSecret": (EMBEDDED, r"\.git_auth_secret\b"),
    "spec.fluxSource": (RUNNER, r"\.flux_source\b"),
    "spec.programRef": (RUNNER, r"\.program_ref\b"),
    "spec.config": (CONFIG, r"\.config\b"),
    "spec.configRef": (CONFIG, r"\.config_ref\b"),
    "spec.secrets": (RUNNER, r"\.secrets\b"),
    "spec.secretsRef": (CONFIG, r"\.secrets_ref\b"),
    "spec.secretsProvider": (RUNNER, r"\.secrets_provider\b"),
    "spec.envRefs": (RUNNER, r"\.env_refs\b"),
    "spec.envs": (EMBEDDED, r"\.envs\b"),
    "spec.envSecrets": (EMBEDDED, r"\.env_secrets\b"),
    "spec.accessTokenSecret": (EMBEDDED, r"\.access_token_secret\b"),
    "spec.backend": (RUNNER, r"\.backend\b"),
    "spec.environment": (RUNNER, r"\.environment\b"),
    "spec.refresh": (RUNNER, r"\.refresh\b"),
    "spec.destroyOnFinalize": (
        "pkobatch/controller/steps/deletion.py",
        r'"destroyOnFinalize"',
    ),
    "spec.runProgram": (RUNNER, r"\.run_program\b"),
    "spec.useLocalStackOnly": (RUNNER, r"\.use_local_stack_only\b"),
    "spec.resyncFrequencySeconds": (RETRY, r"\.resync_frequency_seconds\b"),
    "spec.continueResyncOnCommitMatch": (RETRY, r"\.continue_resync_on_commit_match\b"),
    "spec.retryMaxBackoffDurationSeconds": (RETRY, r"\.retry_max_backoff_duration_seconds\b"),
    "spec.targets": (RUNNER, r"\.targets\b"),
    "spec.targetDependents": (RUNNER, r"\.target_dependents\b"),
    "spec.prerequisites": ("pkobatch/controller/observe.py", r"\.prerequisites\b"),
    "spec.serviceAccountName": (BUILDER, r"spec\.service_account_name\b"),
    "spec.workspaceTemplate.metadata": (BUILDER, r"spec\.workspace_template\),"),
    "spec.workspaceTemplate.spec.image": (BUILDER, r"workspace\.image\b"),
    "spec.workspaceTemplate.spec.imagePullPolicy": (BUILDER, r"workspace\.image_pull_policy\b"),
    "spec.workspaceTemplate.spec.serviceAccountName": (
        BUILDER,
        r"workspace\.service_account_name\b",
    ),
    "spec.workspaceTemplate.spec.resources": (BUILDER, r"workspace\.resources\b"),
    "spec.workspaceTemplate.spec.env": (BUILDER, r"workspace\.env\b"),
    "spec.workspaceTemplate.spec.envFrom": (BUILDER, r"workspace\.env_from\b"),
    "spec.workspaceTemplate.spec.podTemplate": (BUILDER, r"workspace\.pod_template\b"),
    "spec.workspaceTemplate.spec.pulumiLogLevel": (RUNNER, r"\.pulumi_log_level\b"),
    "spec.workspaceTemplate.spec.local": (RUNNER, r"\.local\b"),
    "spec.workspaceTemplate.spec.securityProfile": (BUILDER, r"workspace\.security_profile\b"),
    "spec.updateTemplate.metadata": (BUILDER, r"spec\.update_template\),"),
    "spec.updateTemplate.spec.parallel": (RUNNER, r"\.parallel\b"),
    "spec.updateTemplate.spec.message": (RUNNER, r"update\.message\b|\.message\b"),
    "spec.updateTemplate.spec.expectNoChanges": (RUNNER, r"\.expect_no_changes\b"),
    "spec.updateTemplate.spec.continueOnError": (RUNNER, r"\.continue_on_error\b"),
    "spec.updateTemplate.spec.replace": (RUNNER, r"\.replace\b"),
    "spec.updateTemplate.spec.target": (RUNNER, r"\.target\b"),
    "spec.updateTemplate.spec.targetDependents": (RUNNER, r"\.target_dependents\b"),
    "spec.updateTemplate.spec.refresh": (RUNNER, r"\.refresh\b"),
    "spec.updateTemplate.spec.runProgram": (RUNNER, r"\.run_program\b"),
    "spec.updateTemplate.spec.remove": (RUNNER, r"\.remove\b"),
    "spec.updateTemplate.spec.ttlAfterCompleted": (BUILDER, r"\.ttl_after_completed\b"),
    "spec.preview": (RUNNER, r"\.preview\b"),
    "spec.suspend": ("pkobatch/controller/steps/sync.py", r"\.suspend\b"),
    "spec.schedule": (SCHEDULE, r"\.schedule\b"),
    "spec.timeZone": (SCHEDULE, r"\.time_zone\b"),
    "spec.driftDetection": (SCHEDULE, r"\.drift_detection\b"),
    "spec.timeoutSeconds": (BUILDER, r"\.timeout_seconds\b"),
    "spec.jobTemplate": (BUILDER, r"spec\.job_template\b"),
    "spec.exportOutputs": (RUNNER, r"\.export_outputs\b"),
    "spec.notifications": ("pkobatch/controller/notify.py", r"\.notifications\b"),
    "spec.approval": ("pkobatch/controller/approval.py", r"\.approval\b"),
    # PKO's documentation spells these; normalize_spec rewrites them to repoDir and
    # destroyOnFinalize, whose readers are above.
    "spec.projectPath": (NORMALIZE, r'"projectPath": "repoDir"'),
    "spec.destroyOnDelete": (NORMALIZE, r'"destroyOnDelete": "destroyOnFinalize"'),
    # A Program's body is rendered whole into the Pulumi.yaml its Stacks run.
    "program.configuration": (PROGRAM, r"ProgramBody\.model_validate\(body\)\.model_dump"),
    "program.resources": (PROGRAM, r"ProgramBody\.model_validate\(body\)\.model_dump"),
    "program.variables": (PROGRAM, r"ProgramBody\.model_validate\(body\)\.model_dump"),
    "program.outputs": (PROGRAM, r"ProgramBody\.model_validate\(body\)\.model_dump"),
    "program.packages": (PROGRAM, r"ProgramBody\.model_validate\(body\)\.model_dump"),
}
REPORTED: Final = frozenset(noop.path for noop in NOOP_FIELDS)


def schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1"
    root = version["schema"]["openAPIV3Schema"]
    assert isinstance(root, dict)
    return root


def user_paths() -> dict[str, dict[str, Any]]:
    """Every property path below the Stack's spec and the Program's program, with its node."""
    found: dict[str, dict[str, Any]] = {}
    for crd, top in ((STACK_CRD, "spec"), (PROGRAM_CRD, "program")):
        for path, node in walk(schema(crd)):
            if path.startswith(f"{top}."):
                found[path] = node
    return found


def field_of(path: str) -> str:
    """The classified field a path belongs to: spec's (or program's) own field, or for the PKO
    templates, the field of their metadata or spec."""
    parts = re.split(r"\.|\[\]|\{\}", path)
    parts = [p for p in parts if p]
    if ".".join(parts[:2]) in TEMPLATES and len(parts) > 2:
        depth = 3 if parts[2] == "metadata" else 4
        return ".".join(parts[:depth])
    return ".".join(parts[:2])


def test_every_field_of_the_crds_is_honoured_or_reported_exactly_once() -> None:
    fields = {field_of(path) for path in user_paths()}
    # The templates' own nodes only hold the classified fields.
    fields -= {*TEMPLATES, *(f"{t}.spec" for t in TEMPLATES)}
    honoured, reported = set(HONOURED), set(REPORTED)
    assert honoured & reported == set(), "classified twice"
    unclassified = sorted(fields - honoured - reported)
    assert unclassified == [], (
        f"new CRD fields: honour them (add the reader to HONOURED) or report them "
        f"(pkobatch.api.NOOP_FIELDS): {unclassified}"
    )
    assert sorted(honoured - fields) == [], "HONOURED names a field the CRDs do not have"


def test_each_honoured_field_is_still_read_where_the_table_says() -> None:
    stale = [
        f"{field}: {module} no longer matches {pattern!r}"
        for field, (module, pattern) in HONOURED.items()
        if not re.search(pattern, (REPO_ROOT / module).read_text())
    ]
    assert stale == []


def test_reported_fields_outside_the_schema_are_kept_by_it() -> None:
    """A reported field that is no CRD property (PKO's serviceTemplate, git, ...) must still be
    accepted, under an object that keeps unknown fields, to be reported at all."""
    paths = user_paths()
    for reported in REPORTED:
        if reported in paths:
            continue
        parent = reported.rsplit(".", 1)[0]
        assert parent in paths, f"{reported}: its parent {parent} is not in the CRD"
        assert paths[parent].get(PRESERVE) is True, f"{parent} drops {reported}"


# PKO's Workspace and Update (crds/auto.pulumi.com_*.yaml), run by
# pkobatch/controller/auto_runs.py: each field of their specs is read there (mapped onto the
# run's Stack spec, whose readers are above, or used by the Update's own decision) or
# reported there in status (the Workspace's Stalled/SpecInvalid or FieldsIgnored condition,
# naming the field). Lists of objects are classified by their items' fields.
AUTO_RUNS = "pkobatch/controller/auto_runs.py"
WORKSPACE_CRD = REPO_ROOT / "crds" / "auto.pulumi.com_workspaces.yaml"
UPDATE_CRD = REPO_ROOT / "crds" / "auto.pulumi.com_updates.yaml"
# Objects whose own fields are classified (rather than the object as a whole).
AUTO_OPENED: Final = ("spec.git", "spec.flux", "spec.stacks[]", "spec.stacks[].config[]")
AUTO_HONOURED: Final[dict[str, str]] = {
    # Copied into the Stack's workspaceTemplate.spec and updateTemplate.spec (the tables
    # TEMPLATE_FIELDS and UPDATE_OPTIONS; test_controller_auto_runs checks the copies).
    **{f"spec.{name}": rf'"{name}",' for name in (*TEMPLATE_FIELDS, *UPDATE_OPTIONS)},
    "spec.git.url": r'git\["url"\]',
    "spec.git.ref": r'git\["ref"\]',
    "spec.git.dir": r'\("dir", "repoDir"\)',
    "spec.git.shallow": r'\("shallow", "shallow"\)',
    "spec.git.auth": r'_git_auth\(git\["auth"\]\)',
    "spec.flux.url": r'flux\["url"\]',
    "spec.flux.digest": r'flux\.get\("digest"\)',
    "spec.flux.dir": r'flux\["dir"\]',
    "spec.stacks[].name": r'stack\.get\("name"\) == stack_name',
    "spec.stacks[].create": r'stack\.get\("create"\) is False',
    "spec.stacks[].secretsProvider": r'stack\["secretsProvider"\]',
    "spec.stacks[].environment": r'stack\["environment"\]',
    "spec.stacks[].config[].key": r'item\.get\("key"\)',
    "spec.stacks[].config[].value": r'item\.get\("value"\)',
    "spec.stacks[].config[].secret": r'item\.get\("secret"\)',
    # The Update's own fields; spec.ttlAfterCompleted (above) also expires the Update itself.
    "spec.workspaceName": r'spec\.get\("workspaceName"\)',
    "spec.stackName": r'update_spec\.get\("stackName"\)',
    "spec.type": r'get\("type"\)',
}
# field -> a spec fragment that sets it, and the words the Workspace's status then shows.
AUTO_REPORTED: Final[dict[str, tuple[dict[str, Any], str]]] = {
    "spec.serviceTemplate": (
        {"serviceTemplate": {"metadata": {"labels": {"a": "b"}}}},
        "spec.serviceTemplate: there is no workspace Service",
    ),
    "spec.projectInfo": (
        {"projectInfo": {"name": "p", "runtime": "yaml"}},
        "spec.projectInfo is not supported",
    ),
    "spec.stacks[].config[].path": (
        {"stacks": [{"name": "dev", "config": [{"key": "a.b", "path": True, "value": 1}]}]},
        "config[a.b].path is not supported",
    ),
    "spec.stacks[].config[].valueFrom": (
        {"stacks": [{"name": "dev", "config": [{"key": "t", "valueFrom": {"env": "T"}}]}]},
        "config[t].valueFrom is not supported",
    ),
}


def auto_field_of(path: str) -> str:
    """The classified field of a path below ``spec``: the field of the deepest opened object
    it is in."""
    for opened in sorted(AUTO_OPENED, key=len, reverse=True):
        if path.startswith(opened + ".") or path.startswith(opened + "["):
            first = re.split(r"\.|\[", path[len(opened) + 1 :])[0]
            return f"{opened}.{first}"
    return ".".join(re.split(r"\.|\[", path)[:2])


def auto_fields() -> set[str]:
    fields = set()
    for crd in (WORKSPACE_CRD, UPDATE_CRD):
        root = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, _ in walk(root):
            if path.startswith("spec.") and path not in AUTO_OPENED:
                fields.add(auto_field_of(path))
    return fields - {"spec.stacks", "spec.stacks[].config"}


def test_every_workspace_and_update_field_is_honoured_or_reported_exactly_once() -> None:
    fields = auto_fields()
    assert set(AUTO_HONOURED) & set(AUTO_REPORTED) == set(), "classified twice"
    unclassified = sorted(fields - set(AUTO_HONOURED) - set(AUTO_REPORTED))
    assert unclassified == [], f"new Workspace/Update fields: honour or report them: {unclassified}"
    assert sorted({*AUTO_HONOURED, *AUTO_REPORTED} - fields) == [], "not a CRD field"


def test_each_honoured_workspace_and_update_field_is_read_by_auto_runs() -> None:
    source = (REPO_ROOT / AUTO_RUNS).read_text()
    stale = [f"{f}: {p!r}" for f, p in AUTO_HONOURED.items() if not re.search(p, source)]
    assert stale == []


def test_each_reported_workspace_field_is_named_in_the_workspace_status() -> None:
    from datetime import UTC, datetime

    from pkobatch.controller.auto_runs import workspace_status

    git = {"git": {"url": "https://example.com/r.git", "ref": "main"}}
    for field, (fragment, words) in AUTO_REPORTED.items():
        workspace = {"metadata": {"name": "w", "generation": 1}, "spec": {**git, **fragment}}
        status = workspace_status(workspace, datetime.now(UTC))
        assert status is not None
        messages = " ".join(c["message"] for c in status["conditions"] if c["status"] == "True")
        assert words in messages, field
