"""PKO's Workspace and Update decisions (pkobatch.controller.auto_runs): the Stack spec an
Update runs as, the Workspace's Ready, and an Update's life from Job to expiry."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pkobatch.api.run import RunResult, StackRef, result_config_map, result_digest_line
from pkobatch.config import JobSettings
from pkobatch.controller.auto_runs import (
    UpdateObserved,
    decide_update,
    stack_spec_manifest,
    workspace_problems,
    workspace_status,
)
from pkobatch.controller.job_builder import builtin_template

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pko" / "workspace-and-update.yaml"
JSON = dict[str, Any]


def pko_objects() -> tuple[JSON, JSON]:
    workspace, update = yaml.safe_load_all(FIXTURE.read_text())
    workspace["metadata"].update(namespace="team", generation=2, uid="ws-uid")
    update["metadata"].update(namespace="team", generation=1, uid="up-uid")
    return workspace, update


def runnable_workspace() -> JSON:
    """The fixture's Workspace without the config forms pkobatch refuses, its status set."""
    workspace, _ = pko_objects()
    [stack] = workspace["spec"]["stacks"]
    stack["config"] = [c for c in stack["config"] if not c.get("path") and not c.get("valueFrom")]
    workspace["status"] = workspace_status(workspace, NOW)
    return workspace


def decide(update: JSON, workspace: JSON | None, **observed: Any) -> Any:
    obs = UpdateObserved(
        update,
        workspace,
        observed.get("job"),
        observed.get("result"),
        observed.get("pods", ()),
        observed.get("now", NOW),
    )
    return decide_update(obs, JobSettings(), builtin_template())


def condition(status: JSON, kind: str) -> tuple[str, str]:
    [found] = [c for c in status["conditions"] if c["type"] == kind]
    return found["status"], found["reason"]


def test_the_update_runs_as_the_stack_spec_of_its_workspace_and_options() -> None:
    workspace, update = pko_objects()
    manifest, problems = stack_spec_manifest(workspace["spec"], update["spec"])
    assert manifest["stack"] == "dev"
    assert manifest["projectRepo"] == "https://github.com/pulumi/examples.git"
    assert manifest["commit"] == "1e2fc471709448f3c9f7a250f28f1eafcde7017b"
    assert (manifest["repoDir"], manifest["shallow"]) == ("random-yaml", True)
    assert manifest["gitAuth"] == {
        "accessToken": {"type": "Secret", "secret": {"name": "git-credentials", "key": "token"}}
    }
    assert manifest["config"] == {"length": 16, "tags": {"team": "platform"}}
    assert (manifest["secretsProvider"], manifest["environment"]) == ("passphrase", ["shared/dev"])
    template = manifest["workspaceTemplate"]["spec"]
    assert template["image"] == "pulumi/pulumi:3.259.0-nonroot"
    assert template["env"] == workspace["spec"]["env"]
    assert template["podTemplate"] == workspace["spec"]["podTemplate"]
    assert "serviceTemplate" not in template
    options = manifest["updateTemplate"]["spec"]
    for name in ("parallel", "message", "replace", "target", "refresh", "continueOnError"):
        assert options[name] == update["spec"][name]
    # Every config form pkobatch cannot apply is named, none dropped.
    assert [p.split(" ")[0] for p in problems] == [
        "spec.stacks[0].config[data.active].path",
        "spec.stacks[0].config[token].valueFrom",
        "spec.stacks[0].config[settings].valueFrom",
    ]


def test_a_branch_ref_is_followed_and_a_stack_that_may_not_be_created_is_selected() -> None:
    spec = {"git": {"url": "https://example.com/r.git", "ref": "main"}, "stacks": []}
    spec["stacks"].append({"name": "prod", "create": False})
    manifest, problems = stack_spec_manifest(spec, {"stackName": "prod"})
    assert problems == []
    assert (manifest["branch"], manifest["useLocalStackOnly"]) == ("main", True)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({}, "spec has no source"),
        ({"git": {"url": "u", "ref": "main"}, "local": {"dir": "/p"}}, "set exactly one source"),
        ({"git": {"url": "https://example.com/r.git"}}, "spec.git needs url and ref"),
    ],
)
def test_a_workspace_without_one_usable_source_is_not_ready(spec: JSON, problem: str) -> None:
    assert any(problem in p for p in workspace_problems(spec))
    workspace = {"metadata": {"name": "w", "generation": 1}, "spec": spec}
    status = workspace_status(workspace, NOW)
    assert status is not None
    assert condition(status, "Ready") == ("False", "SpecInvalid")
    assert condition(status, "Stalled") == ("True", "SpecInvalid")


def test_a_valid_workspace_is_ready_reports_its_service_template_and_is_written_once() -> None:
    workspace = runnable_workspace()
    status = workspace["status"]
    assert status["observedGeneration"] == 2
    assert condition(status, "Ready") == ("True", "Succeeded")
    assert condition(status, "FieldsIgnored") == ("True", "NotApplicableToJobs")
    assert not [c for c in status["conditions"] if c["type"] == "Stalled"]
    assert workspace_status(workspace, NOW + timedelta(hours=1)) is None


def test_an_update_starts_one_job_owned_by_it_and_is_progressing() -> None:
    _, update = pko_objects()
    decision = decide(update, runnable_workspace())
    assert decision.create is not None
    job = decision.create.job
    [owner] = job["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["uid"]) == (
        "auto.pulumi.com/v1alpha1",
        "Update",
        "up-uid",
    )
    assert job["metadata"]["labels"]["pkobatch.io/operation"] == "up"
    assert condition(decision.status, "Progressing") == ("True", "Progressing")
    assert condition(decision.status, "Complete") == ("False", "Progressing")
    assert decision.status["startTime"]
    # The same decision again names the same Job (AlreadyExists, never a second run).
    assert (
        decide(update, runnable_workspace()).create.job["metadata"]["name"]
        == (job["metadata"]["name"])
    )


def test_an_update_waits_for_its_workspace_to_be_ready() -> None:
    _, update = pko_objects()
    missing = decide(update, None)
    assert missing.create is None
    assert condition(missing.status, "Progressing") == ("False", "WaitingForWorkspace")
    assert missing.status["observedGeneration"] == 1
    assert missing.requeue_after is not None
    update["status"] = missing.status
    # Still waiting: nothing to write, a recheck later.
    again = decide(update, None, now=NOW + timedelta(minutes=1))
    assert (again.status, again.create) == (None, None)
    assert again.requeue_after is not None
    workspace, _ = pko_objects()  # its refused config: not Ready
    workspace["status"] = workspace_status(workspace, NOW)
    assert decide(update, workspace).create is None


def test_an_update_of_no_operation_is_completed_as_failed_with_what_to_fix() -> None:
    _, update = pko_objects()
    update["spec"]["type"] = "deploy"
    decision = decide(update, runnable_workspace())
    assert decision.create is None
    assert condition(decision.status, "Complete") == ("True", "Updated")
    assert condition(decision.status, "Failed") == ("True", "SpecInvalid")
    assert "use one of up, preview, refresh, destroy" in decision.status["message"]


def _finished(job: JSON, result: RunResult) -> tuple[JSON, JSON, list[JSON]]:
    """``job`` completed, its result ConfigMap and the pod that vouches for it."""
    finished = copy.deepcopy(job)
    finished["metadata"]["uid"] = "job-uid"
    finished["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    at = "2026-01-01T00:01:00Z"
    finished["status"] = {
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": at}]
    }
    configmap = result_config_map(
        result, name=job["metadata"]["name"], namespace="team", labels={}, job_uid="job-uid"
    )
    pod = {
        "metadata": {
            "ownerReferences": [{"kind": "Job", "uid": "job-uid", "controller": True}],
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "pulumi",
                    "state": {"terminated": {"message": result_digest_line(result.to_json())}},
                }
            ]
        },
    }
    return finished, configmap, [pod]


def _run_to_its_end(**result: Any) -> Any:
    """The fixture's Update started, its Job ended with ``result``: the decision then."""
    _, update = pko_objects()
    started = decide(update, runnable_workspace())
    update["status"] = started.status
    job = started.create.job
    ended = RunResult(
        operation="up",
        stack=StackRef(name="random-yaml-up", namespace="team", uid="up-uid"),
        job_name=job["metadata"]["name"],
        **result,
    )
    finished, configmap, pods = _finished(job, ended)
    if ended.state == "failed":
        finished["status"]["conditions"][0]["type"] = "Failed"
    return decide(update, runnable_workspace(), job=finished, result=configmap, pods=pods)


def test_a_finished_update_gets_pko_status_and_its_outputs_secret() -> None:
    decision = _run_to_its_end(
        state="succeeded",
        reason="Succeeded",
        message="2 created",
        generation=1,
        start_time=NOW,
        end_time=NOW + timedelta(minutes=1),
        outputs={"url": "https://x", "pass word": "[secret]"},
        secret_outputs=["pass word"],
        permalink="https://app.pulumi.com/u/1",
        project_info={"name": "random-yaml", "runtime": "yaml"},
    )
    status = decision.status
    assert condition(status, "Progressing") == ("False", "Complete")
    assert condition(status, "Complete") == ("True", "Updated")
    assert condition(status, "Failed") == ("False", "UpdateSucceeded")
    assert (status["startTime"], status["endTime"]) == (
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:01:00Z",
    )
    assert (status["message"], status["permalink"]) == ("2 created", "https://app.pulumi.com/u/1")
    assert status["projectInfo"] == {"name": "random-yaml", "runtime": "yaml"}
    assert status["outputs"] == "random-yaml-up-stack-outputs"
    secret = decision.outputs_secret
    assert secret["metadata"]["name"] == "random-yaml-up-stack-outputs"
    assert secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "up-uid"
    assert json.loads(secret["metadata"]["annotations"]["pulumi.com/secrets"]) == ["pass_word"]
    assert secret["stringData"] == {"url": '"https://x"', "pass_word": '"[secret]"'}


def test_a_failed_run_keeps_pkos_agent_reason() -> None:
    decision = _run_to_its_end(
        state="failed", reason="UpdateConflict", message="Another update is currently in progress"
    )
    assert condition(decision.status, "Failed") == ("True", "UpdateConflict")
    assert decision.status["message"] == "Another update is currently in progress"
    assert decision.outputs_secret is None


def test_ttl_after_completed_deletes_a_completed_update_once_it_has_passed() -> None:
    _, update = pko_objects()
    update["spec"]["type"] = "deploy"
    update["status"] = decide(update, None).status
    ended = datetime.fromisoformat(update["status"]["endTime"])
    waiting = decide(update, None, now=ended + timedelta(minutes=59))
    assert (waiting.delete_update, waiting.requeue_after) == (False, timedelta(minutes=1))
    assert decide(update, None, now=ended + timedelta(hours=1)).delete_update
    del update["spec"]["ttlAfterCompleted"]
    kept = decide(update, None, now=ended + timedelta(days=30))
    assert (kept.delete_update, kept.status, kept.create) == (False, None, None)


def test_an_update_whose_job_vanished_fails_and_is_not_run_again() -> None:
    _, update = pko_objects()
    update["status"] = decide(update, runnable_workspace()).status
    gone = decide(update, runnable_workspace())
    assert gone.create is None
    assert condition(gone.status, "Failed") == ("True", "UpdateFailed")
    assert "disappeared before reporting a result" in gone.status["message"]


def test_an_update_whose_options_are_invalid_is_refused_naming_the_field() -> None:
    _, update = pko_objects()
    update["spec"]["ttlAfterCompleted"] = "soon"
    decision = decide(update, runnable_workspace())
    assert decision.create is None
    assert condition(decision.status, "Failed") == ("True", "SpecInvalid")
    assert "updateTemplate.spec.ttlAfterCompleted" in decision.status["message"]


def test_a_flux_workspace_runs_the_artifact_it_names() -> None:
    workspace = {
        "metadata": {"name": "w", "namespace": "team", "generation": 1},
        "spec": {"flux": {"url": "http://source/a.tar.gz", "digest": "sha256:ab", "dir": "app"}},
    }
    workspace["status"] = workspace_status(workspace, NOW)
    _, update = pko_objects()
    decision = decide(update, workspace)
    assert decision.create is not None
    [run] = decision.create.job["spec"]["template"]["spec"]["containers"]
    snapshot = json.loads(run["args"][run["args"].index("--snapshot") + 1])
    assert snapshot["flux"]["url"] == "http://source/a.tar.gz"
    assert snapshot["flux"]["digest"] == "sha256:ab"
    assert snapshot["spec"]["fluxSource"]["dir"] == "app"
