"""The controller against the real control plane, for what needs no Pulumi run: finalizer,
spec problems, PKO's template fields, deletion, shared branch polling, staying idle, and
annotations over their bounds.

The controller runs as a process under its own ServiceAccount with exactly the RBAC of
deploy/kustomize/base (tests/helpers/controller_harness.py): any call it makes outside those rules
fails these tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    create_secret,
    refuse_pods,
    wait_events,
    wait_stack,
)

from pkobatch.api.annotations import MAX_REQUEST_CHARS
from pkobatch.api.constants import (
    ABANDON_ANNOTATION,
    FINALIZER,
    OPERATION_LABEL,
    OPERATION_REQUEST_ANNOTATION,
    RECONCILE_REQUEST_ANNOTATION,
    STACK_LABEL,
)
from pkobatch.api.messages import MAX_MESSAGE_CHARS
from pkobatch.api.timestamps import parse_time
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    EVENTS,
    JOBS,
    PODS,
    PROGRAMS,
    SECRETS,
    STACKS,
    Kube,
)

JSON = dict[str, Any]


@pytest.fixture
def controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[ControllerProcess]:
    bind_runner(cluster.kube, namespace)
    process = ControllerProcess(cluster, namespace, tmp_path / "controller")
    process.start()
    yield process
    process.stop()


def git_secret(kube: Kube, namespace: str, git_server: Any, password: str | None = None) -> None:
    data = {
        "username": git_server.username,
        "password": password if password is not None else git_server.password,
    }
    create_secret(kube, namespace, "git", data)


def git_spec(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "stack": "dev",
        "projectRepo": url,
        "branch": "main",
        "gitAuth": {
            "basicAuth": {
                "userName": {"type": "Secret", "secret": {"name": "git", "key": "username"}},
                "password": {"type": "Secret", "secret": {"name": "git", "key": "password"}},
            }
        },
        **extra,
    }


def test_invalid_spec_is_stalled_and_deletion_releases_the_finalizer(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    cross_namespace = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "other"}}
    apply_stack(kube, namespace, "broken", {"stack": "dev", "envRefs": {"X": cross_namespace}})
    stack = wait_stack(
        kube,
        namespace,
        "broken",
        lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
        timeout=60,
    )
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert "cross-namespace" in condition(stack, "Stalled")["message"]
    assert condition(stack, "Ready")["status"] == "False"
    assert stack["status"]["observedGeneration"] == stack["metadata"]["generation"]
    wait_events(
        kube,
        namespace,
        lambda e: e["regarding"]["name"] == "broken" and e["reason"] == "StackConfigInvalid",
    )
    kube.delete(STACKS, "broken", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "broken", namespace) is None,
        timeout=60,
        what="the Stack to be deleted",
    )


def test_unreadable_branch_is_stalled_source_unavailable(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo()
    git_secret(kube, namespace, git_server, password="wrong-password")
    apply_stack(kube, namespace, "denied", git_spec(repo.http_url))
    stack = wait_stack(
        kube,
        namespace,
        "denied",
        lambda s: condition(s, "Stalled").get("reason") == "SourceUnavailable",
        timeout=60,
    )
    message = condition(stack, "Stalled")["message"]
    assert "main" in message and "wrong-password" not in message
    assert "currentUpdate" not in stack["status"]
    # The git server's refusal names the credentials to fix, in status and in one Event.
    fix = (
        f"the credentials were refused: fix spec.gitAuth.basicAuth: userName (key username of "
        f"Secret {namespace}/git) and password (key password of Secret {namespace}/git)"
    )
    assert fix in message

    def refusals(event: JSON) -> bool:
        return (
            event["regarding"]["name"] == "denied"
            and event["reason"] == "StackGitAuthenticationFailure"
        )

    [event] = wait_events(kube, namespace, refusals)
    assert event["type"] == "Warning" and fix in event["note"]
    # Polled every 2 s: three more polls refused the same way post no other Event.
    time.sleep(6)
    assert len([e for e in kube.list_objects(EVENTS, namespace)[0] if refusals(e)]) == 1


def test_two_hundred_stacks_on_one_branch_share_one_ls_remote_per_interval(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo()
    git_secret(kube, namespace, git_server)
    count = 200
    for index in range(count):
        # Suspended: they poll the branch but start no run.
        apply_stack(kube, namespace, f"s{index:03d}", git_spec(repo.http_url, suspend=True))
    wait_until(
        lambda: (
            sum(
                1
                for s in kube.list_objects(STACKS, namespace)[0]
                if (s.get("status") or {}).get("observedGeneration") == 1
            )
            == count
        ),
        timeout=180,
        what="every Stack to be reconciled",
    )
    interval = 2.0  # PKOBATCH_POLL_INTERVAL of the harness
    before = controller.metric("pkobatch_git_ls_remote_total")
    started = time.monotonic()
    wait_until(
        lambda: controller.metric("pkobatch_git_ls_remote_total") - before >= 3,
        timeout=120,
        what="three more polls of the branch",
    )
    calls = controller.metric("pkobatch_git_ls_remote_total") - before
    elapsed = time.monotonic() - started
    # One poll per interval at most, for all 200 Stacks together (one per Stack would be
    # hundreds by now): n polls take at least n - 1 intervals, however slow the machine.
    assert calls <= elapsed / interval + 1, (calls, elapsed)
    assert controller.metric("pkobatch_git_ls_remote_total", result="error") == 0


def test_idle_stacks_cause_no_writes(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    for index in range(5):
        apply_stack(kube, namespace, f"idle{index}", {"stack": "dev", "suspend": True})
    for index in range(5):
        wait_stack(
            kube,
            namespace,
            f"idle{index}",
            lambda s: condition(s, "Ready").get("reason") == "Suspended",
            timeout=60,
        )

    def written() -> dict[tuple[str, str], str]:
        """The resourceVersion of every object the controller could write about the idle
        Stacks (each write changes one): the Stacks, their Jobs, ConfigMaps, Secrets and
        Events. The barrier Stacks of ``caught_up`` and their Events are left out."""
        versions = {}
        for resource in (STACKS, JOBS, CONFIGMAPS, SECRETS, EVENTS):
            items, _ = kube.list_objects(resource, namespace)
            for item in items:
                about = (item.get("regarding") or {}).get("name", "")
                name = item["metadata"]["name"]
                if name.startswith("barrier-") or about.startswith("barrier-"):
                    continue
                versions[(resource.plural, name)] = item["metadata"]["resourceVersion"]
        return versions

    controller.caught_up()
    before = written()
    assert sum(plural == "stacks" for plural, _ in before) == 5
    # Wake every Stack: a label change is a Stack event, not a spec change.
    for index in range(5):
        poked = kube.merge_patch(
            STACKS, f"idle{index}", {"metadata": {"labels": {"poke": "1"}}}, namespace
        )
        before[("stacks", f"idle{index}")] = poked["metadata"]["resourceVersion"]
    controller.caught_up()
    assert written() == before, "the woken idle Stacks wrote"


def test_alias_dialect_notes_read_well_and_come_once_per_generation(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    spec = {
        "stack": "dev",
        "projectRepo": "http://127.0.0.1:9/absent.git",
        "branch": "main",
        "envSecrets": [{"name": "cloud-credentials"}],
    }
    apply_stack(kube, namespace, "aliased", spec)

    def notes() -> list[JSON]:
        events, _ = kube.list_objects(EVENTS, namespace)
        return [
            e for e in events if e["reason"] == "SpecNotes" and e["regarding"]["name"] == "aliased"
        ]

    wait_until(lambda: bool(notes()), timeout=60, what="the SpecNotes Event")
    (note,) = notes()
    assert note["note"] == (
        "spec.envSecrets entries of the form {name: <secret>} (spec.envSecrets[].name) were "
        "read as Secret names; prefer the canonical form, a list of names: "
        "spec.envSecrets: [<secret>]"
    )
    kube.delete(STACKS, "aliased", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "aliased", namespace) is None,
        timeout=60,
        what="the Stack to be deleted",
    )
    # Deletion raises the generation, but the spec is the same: no second note.
    controller.caught_up()
    (note,) = notes()
    assert (note.get("series") or {}).get("count", 1) == 1
    assert note.get("deprecatedCount", 1) == 1


# -- PKO's template fields: mapped onto the Job, or reported --------------------------------


def test_template_fields_reach_the_job_and_service_template_is_reported(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    """What maps onto a Job reaches the stored Job and the pod the Job controller makes of
    it (the node agent ignores security contexts: this proves what the pod is given, not what
    a kubelet enforces); serviceTemplate is named in the SpecNotes Event."""
    spec = {
        "stack": "dev",
        "workspaceTemplate": {
            "metadata": {
                "labels": {"azure.workload.identity/use": "true"},
                "annotations": {"team.example.com/owner": "infra"},
            },
            "spec": {
                "securityProfile": "baseline",
                "serviceTemplate": {"metadata": {"labels": {"exposed": "no"}}},
            },
        },
        "updateTemplate": {
            "metadata": {"labels": {"run-kind": "pulumi"}},
            "spec": {"ttlAfterCompleted": "2h"},
        },
    }
    apply_stack(kube, namespace, "templated", spec)

    def jobs() -> list[JSON]:
        found, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}=templated")
        return found

    wait_until(lambda: bool(jobs()), timeout=90, what="the Stack's Job")
    job = jobs()[0]
    assert job["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert job["metadata"]["labels"]["run-kind"] == "pulumi"
    assert job["metadata"]["annotations"]["team.example.com/owner"] == "infra"
    assert job["spec"]["ttlSecondsAfterFinished"] == 7200
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (runner,) = [c for c in pod_spec["containers"] if c["name"] == "pulumi"]
    assert "securityContext" not in runner

    def pods() -> list[JSON]:
        found, _ = kube.list_objects(
            PODS, namespace, label_selector=f"job-name={job['metadata']['name']}"
        )
        return found

    wait_until(lambda: bool(pods()), timeout=90, what="the Job's pod")
    pod = pods()[0]
    # As in PKO, whose workspace pod does not get workspaceTemplate.metadata.
    assert "azure.workload.identity/use" not in pod["metadata"]["labels"]
    assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}

    (note,) = wait_events(
        kube,
        namespace,
        lambda e: e["reason"] == "SpecNotes" and e["regarding"]["name"] == "templated",
        timeout=60,
        what="the SpecNotes Event",
    )
    assert note["type"] == "Normal"
    assert note["note"].startswith("spec.workspaceTemplate.spec.serviceTemplate is ignored: ")
    for honoured in ("metadata", "securityProfile", "ttlAfterCompleted"):
        assert honoured not in note["note"]
    stack = wait_stack(
        kube,
        namespace,
        "templated",
        lambda s: bool(condition(s, "FieldsIgnored")),
        timeout=60,
        what="the FieldsIgnored condition",
    )
    ignored = condition(stack, "FieldsIgnored")
    assert (ignored["status"], ignored["reason"]) == ("True", "NotApplicableToJobs")
    assert ignored["message"] == note["note"]


# -- wedges (issue 11): no Stack waits forever or loops on bad input ----------------------


def stack_jobs(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=f"{STACK_LABEL}={name}")
    return sorted(jobs, key=lambda j: j["metadata"]["creationTimestamp"])


def last_update(stack: dict[str, Any]) -> dict[str, Any]:
    return dict((stack.get("status") or {}).get("lastUpdate") or {})


def test_a_pod_that_cannot_be_created_fails_the_run_with_the_servers_words(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # The Job controller cannot create the pod (no such ServiceAccount): the run used to stay
    # "in progress" until the Job's deadline (1 h), then again on every retry.
    apply_stack(kube, namespace, "nosa", {"stack": "dev", "serviceAccountName": "missing"})
    stack = wait_stack(
        kube,
        namespace,
        "nosa",
        lambda s: last_update(s).get("state") == "failed",
        timeout=90,
        what="the run to fail on its pod creation",
    )
    message = last_update(stack)["message"]
    assert 'serviceaccount "missing" not found' in message, message
    assert "spec.serviceAccountName" in message
    failed_job = last_update(stack)["name"]
    wait_until(
        lambda: kube.get_or_none(JOBS, failed_job, namespace) is None,
        timeout=60,
        what="the pod-less Job to be deleted",
    )
    # Events are posted after the status is written.
    wait_until(
        lambda: any(
            e["regarding"]["name"] == "nosa"
            and e["reason"] == "StackUpdateFailure"
            and "missing" in e["note"]
            for e in kube.list_objects(EVENTS, namespace)[0]
        ),
        timeout=30,
        what="the StackUpdateFailure Event",
    )


def test_a_run_killed_for_lack_of_memory_says_so_and_what_to_raise(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # The node agent enforces the container's memory limit as a kubelet does (a memory
    # cgroup): the runner cannot even start in 24Mi, is OOM-killed and writes no result.
    memory = {"memory": "24Mi"}
    resources = {"requests": memory, "limits": memory}
    spec = {"stack": "dev", "workspaceTemplate": {"spec": {"resources": resources}}}
    apply_stack(kube, namespace, "small", spec)
    stack = wait_stack(
        kube,
        namespace,
        "small",
        lambda s: last_update(s).get("state") == "failed",
        timeout=120,
        what="the run to be OOM-killed",
    )
    message = last_update(stack)["message"]
    assert "ran out of memory and was killed (OOMKilled, exit code 137)" in message, message
    assert "memory limit of 24Mi" in message and "limits.memory" in message
    wait_until(
        lambda: any(
            e["regarding"]["name"] == "small"
            and e["reason"] == "StackUpdateFailure"
            and "OOMKilled" in e["note"]
            for e in kube.list_objects(EVENTS, namespace)[0]
        ),
        timeout=30,
        what="the StackUpdateFailure Event",
    )


def test_a_pod_refused_by_quota_admission_fails_the_run_with_the_servers_words(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    refuse_pods(kube, namespace)
    apply_stack(kube, namespace, "quota", {"stack": "dev"})
    stack = wait_stack(
        kube,
        namespace,
        "quota",
        lambda s: last_update(s).get("state") == "failed",
        timeout=90,
        what="the run to fail on its pod creation",
    )
    message = last_update(stack)["message"]
    assert "cannot create its pod" in message and "quota" in message and "no-pods" in message


def test_an_enormous_spec_invalid_message_still_reaches_status(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # 3000 problems: a message the API server refused (over 32 KiB), so no status at all.
    cross = {"type": "Secret", "secret": {"name": "s", "key": "k", "namespace": "other"}}
    refs = {f"VAR_{index:05d}": cross for index in range(3000)}
    apply_stack(kube, namespace, "noisy", {"stack": "dev", "envRefs": refs})
    stack = wait_stack(
        kube,
        namespace,
        "noisy",
        lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
        timeout=60,
    )
    message = condition(stack, "Stalled")["message"]
    assert len(message) <= MAX_MESSAGE_CHARS
    assert "VAR_00000" in message and "characters omitted" in message
    assert stack["status"]["observedGeneration"] == stack["metadata"]["generation"]


def test_negative_retry_backoff_cap_is_ignored_and_the_first_wait_is_the_base(
    cluster: Any, kube: Kube, namespace: str, tmp_path: Path, controller_rbac: None
) -> None:
    bind_runner(kube, namespace)
    process = ControllerProcess(
        cluster, namespace, tmp_path / "controller", env={"PKOBATCH_RETRY__BASE": "10s"}
    )
    process.start()
    try:
        spec = {"stack": "dev", "serviceAccountName": "missing"}
        apply_stack(kube, namespace, "neg", {**spec, "retryMaxBackoffDurationSeconds": -1})
        stack = wait_stack(
            kube, namespace, "neg", lambda s: last_update(s).get("state") == "failed", timeout=90
        )
        failed_at = parse_time(last_update(stack)["lastResyncTime"])
        wait_until(
            lambda: (
                len(stack_jobs(kube, namespace, "neg")) >= 1
                and stack_jobs(kube, namespace, "neg")[-1]["metadata"]["name"]
                != last_update(stack)["name"]
            ),
            timeout=90,
            what="the retry's Job",
        )
        retry = stack_jobs(kube, namespace, "neg")[-1]
        retried_at = parse_time(retry["metadata"]["creationTimestamp"])
        assert failed_at is not None and retried_at is not None
        # PKO ignores a negative cap; the first wait is the base (a negative cap used to
        # make the wait negative: an immediate retry).
        assert (retried_at - failed_at).total_seconds() >= 9, (failed_at, retried_at)
    finally:
        process.stop()


def test_failures_count_across_commits_so_a_stack_failing_on_every_commit_stalls(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    repo = git_repo()
    git_secret(kube, namespace, git_server)
    apply_stack(kube, namespace, "flaky", git_spec(repo.http_url, serviceAccountName="missing"))
    wait_stack(
        kube,
        namespace,
        "flaky",
        lambda s: condition(s, "Stalled").get("reason") == "UpdateFailed",
        timeout=240,
        what="4 failed attempts on the first commit",
    )
    sha = repo.update({"NOTES.md": "another commit\n"}, "another commit")
    stack = wait_stack(
        kube,
        namespace,
        "flaky",
        lambda s: (
            last_update(s).get("lastAttemptedCommit") == sha
            and last_update(s).get("state") == "failed"
        ),
        timeout=120,
        what="the new commit's run to fail",
    )
    # PKO counts by generation and reconcile request: the new commit ran once, counted on,
    # and the Stack stays stalled instead of starting over (which used to mean: never stall).
    assert last_update(stack)["failures"] == 4
    assert condition(stack, "Stalled").get("reason") == "UpdateFailed"
    attempts = len(stack_jobs(kube, namespace, "flaky"))
    # A stalled Stack starts no run when it is reconciled again (a label is no new request).
    kube.merge_patch(STACKS, "flaky", {"metadata": {"labels": {"poke": "1"}}}, namespace)
    controller.caught_up()
    assert len(stack_jobs(kube, namespace, "flaky")) == attempts


def test_deleting_a_destroy_on_finalize_stack_that_never_ran_runs_the_destroy(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # As in PKO: the Pulumi stack may hold resources from before this Stack existed.
    spec = {"stack": "dev", "suspend": True, "destroyOnFinalize": True}
    apply_stack(kube, namespace, "legacy", {**spec, "serviceAccountName": "missing"})
    wait_stack(
        kube, namespace, "legacy", lambda s: condition(s, "Ready").get("reason") == "Suspended"
    )
    assert stack_jobs(kube, namespace, "legacy") == []
    kube.delete(STACKS, "legacy", namespace)
    wait_until(
        lambda: any(
            j["metadata"]["labels"].get(OPERATION_LABEL) == "destroy"
            for j in stack_jobs(kube, namespace, "legacy")
        ),
        timeout=60,
        what="a destroy Job",
    )
    stack = wait_stack(
        kube,
        namespace,
        "legacy",
        lambda s: (
            last_update(s).get("type") == "destroy" and last_update(s).get("state") == "failed"
        ),
        timeout=90,
    )
    assert FINALIZER in stack["metadata"]["finalizers"]  # a failed destroy keeps it
    kube.merge_patch(
        STACKS, "legacy", {"metadata": {"annotations": {ABANDON_ANNOTATION: "true"}}}, namespace
    )
    wait_until(
        lambda: kube.get_or_none(STACKS, "legacy", namespace) is None,
        timeout=60,
        what="the abandoned Stack to go",
    )


def test_a_first_run_and_a_run_after_a_spec_change_use_the_current_branch_head(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    git_repo: Callable[..., Any],
    git_server: Any,
) -> None:
    # With an hour between polls the cached head is old; a change of the Stack itself must
    # not run it (PKO runs ls-remote in that very reconcile).
    bind_runner(kube, namespace)
    process = ControllerProcess(
        cluster, namespace, tmp_path / "controller", env={"PKOBATCH_POLL_INTERVAL": "1h"}
    )
    process.start()
    try:
        repo = git_repo()
        git_secret(kube, namespace, git_server)
        # Fails at pod creation, so nothing needs Pulumi: only the commit each run was for.
        spec = git_spec(repo.http_url, serviceAccountName="missing")
        apply_stack(kube, namespace, "early", {**spec, "suspend": True})
        wait_stack(
            kube, namespace, "early", lambda s: condition(s, "Ready").get("reason") == "Suspended"
        )
        wait_until(
            lambda: process.metric("pkobatch_git_ls_remote_total") >= 1,
            timeout=60,
            what="the branch to be polled",
        )
        second = repo.update({"NOTES.md": "second\n"}, "second commit")
        apply_stack(kube, namespace, "late", spec)
        stack = wait_stack(kube, namespace, "late", lambda s: bool(last_update(s)), timeout=90)
        assert last_update(stack)["lastAttemptedCommit"] == second
        third = repo.update({"NOTES.md": "third\n"}, "third commit")
        apply_stack(kube, namespace, "early", spec)  # unsuspended: generation 2
        stack = wait_stack(kube, namespace, "early", lambda s: bool(last_update(s)), timeout=90)
        assert last_update(stack)["lastAttemptedCommit"] == third
    finally:
        process.stop()


def test_a_duration_too_long_for_the_controller_stalls_the_stack_instead_of_looping(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # The CRD admits any string here; this one overflowed while planning, on every reconcile.
    apply_stack(kube, namespace, "base", {"stack": "base", "suspend": True})
    requirement = {"succeededWithinDuration": "99999999999999h"}
    prerequisites = [{"name": "base", "requirement": requirement}]
    apply_stack(kube, namespace, "long", {"stack": "dev", "prerequisites": prerequisites})
    stack = wait_stack(
        kube,
        namespace,
        "long",
        lambda s: condition(s, "Stalled").get("reason") == "SpecInvalid",
        timeout=60,
    )
    message = condition(stack, "Stalled")["message"]
    assert "succeededWithinDuration" in message and "too long" in message
    assert "OverflowError" not in controller.log_text()


def test_stack_waits_for_its_program_then_runs_it_and_keeps_its_artifact(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    """A missing Program: Reconciling without a failure; once created (its watch event,
    no polling), the Stack's run carries that generation and status.artifact is kept
    (tests/integration/test_program_artifact_server.py: for Programs no Stack uses)."""
    apply_stack(kube, namespace, "uses-program", {"stack": "dev", "programRef": {"name": "web"}})
    stack = wait_stack(
        kube,
        namespace,
        "uses-program",
        lambda s: condition(s, "Reconciling").get("reason") == "WaitingForSource",
        timeout=60,
    )
    assert "Program web does not exist" in condition(stack, "Reconciling")["message"]
    assert "lastUpdate" not in stack["status"] and not condition(stack, "Stalled")
    program = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Program",
        "metadata": {"name": "web", "namespace": namespace},
        "program": {"variables": {"greeting": "hello"}, "outputs": {"greeting": "${greeting}"}},
    }
    kube.create(PROGRAMS, program, namespace)
    stack = wait_stack(
        kube, namespace, "uses-program", lambda s: bool(s["status"].get("currentUpdate"))
    )
    assert stack["status"]["currentUpdate"]["commit"] == "1"
    # The Program's own reconcile writes its status, not the Stack's: it may come second.
    wait_until(
        lambda: bool(kube.get(PROGRAMS, "web", namespace).get("status")),
        timeout=30,
        what="the Program's status",
    )
    stored = kube.get(PROGRAMS, "web", namespace)
    artifact = stored["status"]["artifact"]
    assert stored["status"]["observedGeneration"] == 1
    assert artifact["revision"] == "1"
    assert artifact["digest"].startswith("sha256:") and artifact["size"] > 0
    assert artifact["url"].endswith(f"/programs/{namespace}/web/1")


def github_app_secret(kube: Kube, namespace: str, name: str, app: Any, private_key: str) -> None:
    data = {"appID": app.app_id, "installationID": app.installation_id, "privateKey": private_key}
    create_secret(kube, namespace, name, data)


def github_app_spec(url: str, secret: str) -> dict[str, Any]:
    def ref(key: str) -> dict[str, Any]:
        return {"type": "Secret", "secret": {"name": secret, "key": key}}

    return {
        "stack": "dev",
        "projectRepo": url,
        "branch": "main",
        "gitAuth": {
            "githubApp": {
                "appID": ref("appID"),
                "installationID": ref("installationID"),
                "privateKey": ref("privateKey"),
            }
        },
    }


def test_github_app_branch_polling_exchanges_a_token_and_never_shows_a_credential(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    git_repo: Callable[..., Any],
    github_app: Any,
) -> None:
    """The poller signs a JWT with the app's key, gets an installation token from the
    (loopback) GitHub API, and ls-remotes over HTTPS with it; a wrong key is
    SourceUnavailable. No key, JWT or token appears in any status, Event or log."""
    bind_runner(kube, namespace)
    ca = str(github_app.ca_file)
    process = ControllerProcess(
        cluster, namespace, tmp_path / "controller", env={"SSL_CERT_FILE": ca, "GIT_SSL_CAINFO": ca}
    )
    process.start()
    try:
        repo = git_repo()
        url = github_app.repo_url(repo.bare)
        github_app_secret(kube, namespace, "app", github_app, github_app.private_key)
        github_app_secret(kube, namespace, "wrong", github_app, github_app.wrong_private_key)
        apply_stack(kube, namespace, "via-app", github_app_spec(url, "app"))
        apply_stack(kube, namespace, "wrong-key", github_app_spec(url, "wrong"))
        good = wait_stack(
            kube,
            namespace,
            "via-app",
            lambda s: (
                ((s.get("status") or {}).get("currentUpdate") or {}).get("commit") == repo.commit
            ),
            timeout=120,
        )
        bad = wait_stack(
            kube,
            namespace,
            "wrong-key",
            lambda s: condition(s, "Stalled").get("reason") == "SourceUnavailable",
            timeout=120,
        )
        message = condition(bad, "Stalled")["message"]
        assert "HTTP 401" in message and "check appID, installationID and privateKey" in message
        assert any(r.accepted for r in github_app.token_requests)
        assert any(not r.accepted for r in github_app.token_requests)
        events, _ = kube.list_objects(EVENTS, namespace)
        seen = "\n".join(
            [json.dumps(good), json.dumps(bad), json.dumps(events), process.log_text()]
        )
    finally:
        process.stop()
    secrets_ = [*github_app.issued]
    for key in (github_app.private_key, github_app.wrong_private_key):
        secrets_ += [line for line in key.splitlines() if len(line) > 20]
    leaked = [s for s in secrets_ if s in seen]
    assert leaked == [] and "eyJhbGciOiJSUzI1NiIs" not in seen


def test_a_missing_flux_source_is_named_once_its_kind_is_watched(
    controller: ControllerProcess, kube: Kube, namespace: str, flux_crds: Path
) -> None:
    """Flux's CRDs installed, the GitRepository absent: once the watch has listed, the
    Stack says the source does not exist (no event comes for an absent object)."""
    spec = {
        "stack": "dev",
        "fluxSource": {
            "sourceRef": {
                "apiVersion": "source.toolkit.fluxcd.io/v1",
                "kind": "GitRepository",
                "name": "absent",
            }
        },
    }
    apply_stack(kube, namespace, "from-absent", spec)
    stack = wait_stack(
        kube,
        namespace,
        "from-absent",
        lambda s: (
            "GitRepository absent does not exist" in condition(s, "Reconciling").get("message", "")
        ),
        timeout=60,
    )
    assert condition(stack, "Reconciling")["reason"] == "WaitingForSource"
    assert "lastUpdate" not in stack["status"]


# -- annotations over their bounds (issue 26, item 6) ------------------------------------

OVERSIZED = 250 * 1024
# Everything a Stack holds here but an oversized annotation: metadata, spec, status.
SMALL = 16 * 1024


def annotate(kube: Kube, namespace: str, name: str, key: str, value: str) -> None:
    kube.merge_patch(STACKS, name, {"metadata": {"annotations": {key: value}}}, namespace)


def test_an_oversized_operation_request_is_rejected_without_bloating_the_stack(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    # A suspended Stack still answers requests.
    apply_stack(kube, namespace, "big", {"stack": "dev", "suspend": True})
    wait_stack(kube, namespace, "big", lambda s: condition(s, "Ready").get("reason") == "Suspended")
    value = "refresh:" + "x" * OVERSIZED
    annotate(kube, namespace, "big", OPERATION_REQUEST_ANNOTATION, value)
    stack = wait_stack(
        kube,
        namespace,
        "big",
        lambda s: (s["status"].get("operationRequest") or {}).get("state") == "Rejected",
        timeout=120,
    )
    answer = stack["status"]["operationRequest"]
    assert len(answer["request"]) <= MAX_REQUEST_CHARS
    assert answer["request"].startswith("refresh:xxx")
    assert f"({len(value)} characters, sha256 " in answer["request"]
    assert (
        f"{OPERATION_REQUEST_ANNOTATION} is {len(value)} characters long, over its bound of "
        f"{MAX_REQUEST_CHARS}"
    ) in answer["message"]
    assert len(json.dumps(stack["status"])) < SMALL
    # The stored object is the annotation and a few KiB, not the annotation three times.
    assert len(json.dumps(stack)) < len(value) + SMALL
    events = wait_events(
        kube,
        namespace,
        lambda e: e["regarding"]["name"] == "big" and e["reason"] == "OperationRequestRejected",
        timeout=120,
    )
    assert all(len(e["note"]) <= 1024 and "over its bound" in e["note"] for e in events)
    controller.caught_up()
    assert stack_jobs(kube, namespace, "big") == []
    assert kube.get(STACKS, "big", namespace)["status"]["operationRequest"] == answer


def test_an_oversized_reconcile_request_is_refused_in_a_condition_and_never_stored(
    controller: ControllerProcess, kube: Kube, namespace: str
) -> None:
    apply_stack(kube, namespace, "long", {"stack": "dev", "suspend": True})
    annotate(kube, namespace, "long", RECONCILE_REQUEST_ANNOTATION, "ok-1")
    wait_stack(
        kube,
        namespace,
        "long",
        lambda s: (s.get("status") or {}).get("observedReconcileRequest") == "ok-1",
    )
    oversized = "r" * OVERSIZED
    annotate(kube, namespace, "long", RECONCILE_REQUEST_ANNOTATION, oversized)
    stack = wait_stack(
        kube,
        namespace,
        "long",
        lambda s: condition(s, "AnnotationsRefused").get("status") == "True",
        timeout=120,
    )
    refused = condition(stack, "AnnotationsRefused")
    assert refused["reason"] == "InvalidAnnotation"
    assert f"{RECONCILE_REQUEST_ANNOTATION} is {OVERSIZED} characters long" in refused["message"]
    assert stack["status"]["observedReconcileRequest"] == "ok-1"
    assert len(json.dumps(stack["status"])) < SMALL
    wait_events(
        kube,
        namespace,
        lambda e: e["regarding"]["name"] == "long" and e["reason"] == "AnnotationRefused",
        timeout=120,
    )

    annotate(kube, namespace, "long", RECONCILE_REQUEST_ANNOTATION, "ok-2")
    wait_stack(
        kube,
        namespace,
        "long",
        lambda s: (
            s["status"].get("observedReconcileRequest") == "ok-2"
            and not condition(s, "AnnotationsRefused")
        ),
        timeout=120,
    )
