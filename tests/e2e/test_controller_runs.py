"""The controller end to end: real control plane, real Job controller and node agent, the
real runner (``pkobatch job run``) and the real Pulumi CLI, test programs in real git
repositories served over HTTP with basic auth.

Each test starts the controller as a process under its own ServiceAccount with the RBAC of
deploy/kustomize/base (tests/helpers/controller_harness.py), with a 1 s retry base and a 2 s branch
polling interval so PKO's schedule runs in seconds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.controller_harness import (
    INSECURE_HTTP_GIT_HOSTS,
    LOOPBACK_GIT_HOST,
    ControllerProcess,
    applied_at,
    apply_stack,
    condition,
    grant_role,
    last_update,
    literal,
    ready,
    request_reconcile,
    seconds,
    set_passphrase,
    stack_jobs,
    stack_spec,
    wait_events,
    wait_other_job,
    wait_stack,
)
from helpers.sentinels import plant
from helpers.stale_lock import backend_locks, held_lock

from pkobatch.api.constants import (
    FINALIZER,
    OPERATION_REQUEST_ANNOTATION,
    STACK_LABEL,
)
from pkobatch.api.timestamps import parse_time
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import (
    CONFIGMAPS,
    EVENTS,
    JOBS,
    PODS,
    SECRETS,
    SERVICEACCOUNTS,
    STACKS,
    Kube,
)
from pkobatch.runner.embedded import fallback_env_name

JSON = dict[str, Any]
KUBECTL = str(Path(sys.executable).parent / "kubectl")


def kubectl(cluster: Any, *args: str) -> str:
    completed = subprocess.run(
        [KUBECTL, "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def create_service_account(kube: Kube, namespace: str, name: str) -> None:
    kube.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        namespace,
    )


# ---------------------------------------------------------------------------------------


def test_stack_from_git_runs_on_each_trigger(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
    kubectl(
        cluster, "wait", "-n", namespace, "stack/app", "--for=condition=Ready", "--timeout=300s"
    )
    stack = kube.get(STACKS, "app", namespace)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["type"] == "up"
    assert update["lastSuccessfulCommit"] == repo.commit
    outputs = stack["status"]["outputs"]
    assert outputs["token"] == "[secret]"
    assert outputs["directory"] == str(pulumi_env.files_dir)
    assert stack["status"]["projectInfo"]["runtime"] == "python"
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert len(list(pulumi_env.files_dir.iterdir())) == 2

    table = kubectl(cluster, "get", "stacks", "-n", namespace)
    header = table.splitlines()[0].split()
    assert header[:3] == ["NAME", "LAST", "UPDATE"] and "READY" in header and "STALLED" in header
    assert "succeeded" in table.splitlines()[1] and "True" in table.splitlines()[1]

    # A spec edit runs again.
    spec = stack_spec(repo, pulumi_env)
    spec["config"]["files"] = "3"
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube, namespace, "app", lambda s: ready(s) and last_update(s)["generation"] == 2
    )
    assert len(list(pulumi_env.files_dir.iterdir())) == 3

    # A new commit on the branch runs again.
    sha = repo.update({"NOTES.md": "new commit\n"}, "a new commit")
    stack = wait_stack(
        kube, namespace, "app", lambda s: ready(s) and last_update(s)["lastSuccessfulCommit"] == sha
    )

    # The reconcile-request annotation runs again, and is acknowledged.
    runs_before = len(stack_jobs(kube, namespace, "app"))
    request_reconcile(kube, namespace, "app", "now")
    stack = wait_stack(
        kube, namespace, "app", lambda s: ready(s) and last_update(s)["reconcileRequest"] == "now"
    )
    assert stack["status"]["observedReconcileRequest"] == "now"
    assert len(stack_jobs(kube, namespace, "app")) >= min(runs_before + 1, 5)

    # A requested refresh runs once and is acknowledged in status.operationRequest.
    kube.merge_patch(
        STACKS,
        "app",
        {"metadata": {"annotations": {OPERATION_REQUEST_ANNOTATION: "refresh:t1"}}},
        namespace,
    )
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (s["status"].get("operationRequest") or {}).get("state") == "Succeeded",
    )
    assert "-refresh-" in stack["status"]["operationRequest"]["jobName"]
    assert condition(stack, "Ready")["status"] == "True"


def test_failing_program_retries_then_stalls_and_a_fix_recovers(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    broken = git_repo("syntax-error")
    apply_stack(kube, namespace, "app", stack_spec(broken, pulumi_env))
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Stalled").get("reason") == "UpdateFailed",
        timeout=600,
    )
    update = last_update(stack)
    assert update["state"] == "failed" and update["failures"] == 3
    assert "up failed 4 times" in condition(stack, "Stalled")["message"]
    jobs = stack_jobs(kube, namespace, "app")
    assert len(jobs) == 4
    # Each retry waited PKO's backoff (base 1 s here): 1 s, 3 s, 9 s after the failed run
    # ended (the end time its result reports).
    for attempt in range(3):
        name = jobs[attempt]["metadata"]["name"]
        result = json.loads(kube.get(CONFIGMAPS, name, namespace)["data"]["result.json"])
        ended = parse_time(result["endTime"])
        next_start = parse_time(jobs[attempt + 1]["metadata"]["creationTimestamp"])
        assert ended is not None and next_start is not None
        assert (next_start - ended).total_seconds() >= 3**attempt - 1
    wait_events(kube, namespace, lambda e: e["reason"] == "StackUpdateFailure", count=4)

    # Nothing more happens while stalled (the last backoff would have been 27 s).
    time.sleep(30)
    assert len(stack_jobs(kube, namespace, "app")) == 4

    fixed = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(fixed, pulumi_env))
    stack = wait_stack(kube, namespace, "app", ready, timeout=300)
    assert condition(stack, "Stalled") == {}
    assert last_update(stack)["failures"] == 0


def test_destroy_on_finalize(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env, destroyOnFinalize=True))
    wait_stack(kube, namespace, "app", ready)
    assert len(list(pulumi_env.files_dir.iterdir())) == 2

    # A destroy that fails (the backend passphrase is wrong) keeps the finalizer.
    set_passphrase(kube, namespace, "not-the-passphrase")
    kube.delete(STACKS, "app", namespace)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            last_update(s).get("type") == "destroy" and last_update(s).get("state") == "failed"
        ),
    )
    assert FINALIZER in stack["metadata"]["finalizers"]
    assert stack["metadata"].get("deletionTimestamp")
    assert last_update(stack)["message"]
    assert len(list(pulumi_env.files_dir.iterdir())) == 2

    # Fixed: the next retry destroys, and only then the Stack goes away.
    set_passphrase(kube, namespace, secrets["pulumi"]["passphrase"])
    request_reconcile(kube, namespace, "app", "retry")
    wait_until(
        lambda: kube.get_or_none(STACKS, "app", namespace) is None,
        timeout=300,
        what="the Stack to be destroyed and deleted",
    )
    assert list(pulumi_env.files_dir.iterdir()) == []


def test_destroy_on_finalize_destroys_resources_of_a_stack_that_never_ran(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    # The migration case: a Pulumi stack deployed before (here by another Stack object,
    # deleted without destroy); a new Stack with destroyOnFinalize is deleted before its
    # first run completed. PKO still destroys; pkobatch used to drop the finalizer only.
    repo = git_repo()
    apply_stack(kube, namespace, "before", stack_spec(repo, pulumi_env))
    wait_stack(kube, namespace, "before", ready)
    kube.delete(STACKS, "before", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "before", namespace) is None,
        timeout=60,
        what="the first Stack to go (without destroy)",
    )
    assert len(list(pulumi_env.files_dir.iterdir())) == 2
    spec = stack_spec(repo, pulumi_env, destroyOnFinalize=True, suspend=True)
    apply_stack(kube, namespace, "after", spec)
    wait_stack(
        kube, namespace, "after", lambda s: condition(s, "Ready").get("reason") == "Suspended"
    )
    kube.delete(STACKS, "after", namespace)
    wait_until(
        lambda: kube.get_or_none(STACKS, "after", namespace) is None,
        timeout=300,
        what="the destroy on deletion",
    )
    assert list(pulumi_env.files_dir.iterdir()) == []


def test_deleted_job_or_pod_is_a_failed_run_and_a_retry(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    spec = stack_spec(repo, pulumi_env)
    spec["config"]["sleepSeconds"] = "30"
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube, namespace, "app", lambda s: bool((s.get("status") or {}).get("currentUpdate"))
    )
    first = stack["status"]["currentUpdate"]["name"]
    kube.delete(JOBS, first, namespace)
    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == first)
    assert last_update(stack)["state"] == "failed"
    assert "disappeared" in last_update(stack)["message"]

    # The retry starts after the backoff; then its pod is deleted.
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (s["status"].get("currentUpdate") or {}).get("name") not in (None, first),
    )
    second = stack["status"]["currentUpdate"]["name"]

    def pods() -> list[JSON]:
        return kube.list_objects(PODS, namespace, label_selector=f"job-name={second}")[0]

    # Deleted once it runs: a pod deleted before the node agent has bound it stays
    # terminating (the dev control plane runs no pod garbage collector to fail it), and the
    # run then ends only at its 5-minute start limit.
    wait_until(
        lambda: any((pod.get("status") or {}).get("phase") == "Running" for pod in pods()),
        timeout=120,
        what="the retry's pod running",
    )
    kube.delete(PODS, pods()[0]["metadata"]["name"], namespace)
    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == second)
    assert last_update(stack)["state"] == "failed"
    assert last_update(stack)["failures"] == 1
    assert last_update(stack)["message"]
    # Never wedged: the Stack goes on retrying; with a fast program the next run succeeds.
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
    wait_stack(kube, namespace, "app", ready, timeout=300)


def test_a_fixed_spec_replaces_a_run_stuck_on_a_missing_secret_at_once(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    broken = stack_spec(repo, pulumi_env)
    # PKO's scenario: the workspace's env names a Secret that does not exist yet.
    missing = {"secretKeyRef": {"name": "absent", "key": "x"}}
    broken["workspaceTemplate"] = {"spec": {"env": [{"name": "EXTRA", "valueFrom": missing}]}}
    apply_stack(kube, namespace, "app", broken)
    stack = wait_stack(
        kube, namespace, "app", lambda s: bool((s.get("status") or {}).get("currentUpdate"))
    )
    stuck = stack["status"]["currentUpdate"]["name"]

    def waiting_reasons() -> set[str]:
        pods = kube.list_objects(PODS, namespace, label_selector=f"job-name={stuck}")[0]
        return {
            str(((c.get("state") or {}).get("waiting") or {}).get("reason"))
            for pod in pods
            for c in (pod.get("status") or {}).get("containerStatuses") or ()
        }

    wait_until(
        lambda: "CreateContainerConfigError" in waiting_reasons(),
        timeout=120,
        what="the run's pod stuck on the missing Secret",
    )

    fixed_at = applied_at(apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env)))
    replacement = wait_other_job(kube, namespace, "app", stuck)
    # PKO's own test allows 30 s from the fix to the fixed spec's run (the start limit
    # that would otherwise end the stuck run is 5 minutes).
    created = replacement["metadata"]["creationTimestamp"]
    assert seconds(created) - fixed_at <= 30, (fixed_at, created)
    stack = wait_stack(kube, namespace, "app", ready, timeout=300)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["generation"] == 2
    wait_events(
        kube,
        namespace,
        lambda e: f"run {stuck} had not started when the Stack's spec changed" in e.get("note", ""),
    )
    # Exactly one run after the stuck one: the fixed spec's.
    assert len(stack_jobs(kube, namespace, "app")) == 1


def test_no_secret_value_leaks(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
    wait_stack(kube, namespace, "app", ready)
    kube.merge_patch(
        STACKS,
        "app",
        {"metadata": {"annotations": {OPERATION_REQUEST_ANNOTATION: "preview:p1"}}},
        namespace,
    )
    wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            (s["status"].get("operationRequest") or {}).get("state") in ("Succeeded", "Failed")
        ),
    )
    planted = [
        secrets["pulumi"]["token"],
        secrets["pulumi"]["passphrase"],
        secrets["git"]["password"],
    ]
    places = {
        "jobs": kube.list_objects(JOBS, namespace)[0],
        "configmaps": kube.list_objects(CONFIGMAPS, namespace)[0],
        "stacks": kube.list_objects(STACKS, namespace)[0],
        "events": kube.list_objects(EVENTS, namespace)[0],
    }
    for where, objects in places.items():
        text = json.dumps(objects)
        for value in planted:
            assert value not in text, f"a secret value is in {where}"
    log = controller.log_text()
    for value in planted:
        assert value not in log, "a secret value is in the controller's log"


def request(kube: Kube, namespace: str, value: str) -> JSON:
    kube.merge_patch(
        STACKS,
        "app",
        {"metadata": {"annotations": {OPERATION_REQUEST_ANNOTATION: value}}},
        namespace,
    )
    return wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (
            (s["status"].get("operationRequest") or {}).get("request") == value
            and s["status"]["operationRequest"]["state"] in ("Succeeded", "Failed", "Rejected")
        ),
    )


def test_requested_destroy_holds_until_up_and_cancel_stops_a_run(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
    wait_stack(kube, namespace, "app", ready)

    stack = request(kube, namespace, "destroy:t1")
    assert stack["status"]["operationRequest"]["state"] == "Succeeded"
    assert last_update(stack)["type"] == "destroy"
    assert condition(stack, "Stalled")["reason"] == "DestroyedOnRequest"
    assert list(pulumi_env.files_dir.iterdir()) == []
    # Held: a new commit does not bring the stack back.
    runs = len(stack_jobs(kube, namespace, "app"))
    repo.update({"NOTES.md": "x\n"}, "new commit while held")
    time.sleep(10)
    assert len(stack_jobs(kube, namespace, "app")) == runs
    assert list(pulumi_env.files_dir.iterdir()) == []

    stack = request(kube, namespace, "up:t2")
    assert stack["status"]["operationRequest"]["state"] == "Succeeded"
    stack = wait_stack(kube, namespace, "app", ready)
    assert len(list(pulumi_env.files_dir.iterdir())) == 2

    # Cancel: a slow update is stopped, recorded as failed, and the request acknowledged.
    slow = stack_spec(repo, pulumi_env, suspend=False)
    slow["config"]["content"] = "slow"
    slow["config"]["sleepSeconds"] = "60"
    apply_stack(kube, namespace, "app", slow)
    stack = wait_stack(kube, namespace, "app", lambda s: bool(s["status"].get("currentUpdate")))
    running = stack["status"]["currentUpdate"]["name"]
    # Once its pod runs: a spec edit replaces a run that has not started (as PKO does), and
    # then there would be nothing left to cancel.
    wait_until(
        lambda: any(
            (pod.get("status") or {}).get("phase") == "Running"
            for pod in kube.list_objects(PODS, namespace, label_selector=f"job-name={running}")[0]
        ),
        timeout=300,
        what="the slow update's pod to run",
    )
    suspended = {**slow, "suspend": True}
    apply_stack(kube, namespace, "app", suspended)
    stack = request(kube, namespace, "cancel:t3")
    assert stack["status"]["operationRequest"]["state"] == "Succeeded"
    assert stack["status"]["operationRequest"]["jobName"] == running
    assert last_update(stack)["name"] == running and "cancelled" in last_update(stack)["message"]
    wait_until(
        lambda: kube.get_or_none(JOBS, running, namespace) is None,
        timeout=120,
        what="the cancelled Job to be gone",
    )
    assert [
        j["metadata"]["name"] for j in stack_jobs(kube, namespace, "app") if not finished(j)
    ] == []


def finished(job: JSON) -> bool:
    return any(
        c["type"] in ("Complete", "Failed") and c["status"] == "True"
        for c in job.get("status", {}).get("conditions") or ()
    )


def test_drift_is_detected_and_remediated(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    spec = stack_spec(repo, pulumi_env, driftDetection={"schedule": "* * * * *", "remediate": True})
    apply_stack(kube, namespace, "app", spec)
    wait_stack(kube, namespace, "app", ready)
    target = pulumi_env.files_dir / "file-0.txt"
    target.write_text("changed behind Pulumi's back")
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Drifted").get("reason") == "Remediated",
        timeout=240,
    )
    check = stack["status"]["lastDriftCheck"]
    assert check["state"] == "succeeded" and check["driftedResources"] >= 1
    assert target.read_text() == "hello 0"
    assert condition(stack, "Ready")["status"] == "True"
    wait_events(kube, namespace, lambda e: e["reason"] == "DriftDetected")


# ---------------------------------------------------------------------------------------
# Run inputs (issue 11, items 2, 6, 7): inline secrets, a large spec, the Job's UID
# ---------------------------------------------------------------------------------------

INLINE_SENTINEL = plant("inline-secret")
# Appended to the test program: what it saw of config "token" and "blob".
REPORTING_PROGRAM = """
import hashlib

from pulumi.runtime.config import is_config_secret

pulumi.export(
    "tokenSha256",
    pulumi.Output.unsecret(token.apply(lambda t: hashlib.sha256(t.encode()).hexdigest())),
)
pulumi.export("tokenIsSecretConfig", is_config_secret(f"{pulumi.get_project()}:token"))
pulumi.export("blobSha256", hashlib.sha256((config.get("blob") or "").encode()).hexdigest())
"""


def reporting_repo(git_repo: Callable[..., Any]) -> Any:
    repo = git_repo()
    program = (repo.worktree / "__main__.py").read_text()
    repo.update({"__main__.py": program + REPORTING_PROGRAM}, "report what the program sees")
    return repo


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_log(cluster: Any, namespace: str, job: str) -> str:
    return "\n".join(
        path.read_text(errors="replace")
        for path in sorted((cluster.log_dir / namespace).glob(f"{job}-*.log"))
    )


def assert_not_leaked(
    cluster: Any,
    kube: Kube,
    controller: ControllerProcess,
    namespace: str,
    job: str,
    values: list[str],
) -> str:
    """Fails when one of ``values`` is in the namespace's Jobs, Pods, ConfigMaps, Stack
    statuses or Events, the run's log or the controller's log; returns the run's log."""
    log = run_log(cluster, namespace, job)
    places = {
        "jobs": kube.list_objects(JOBS, namespace)[0],
        "pods": kube.list_objects(PODS, namespace)[0],
        "configmaps": kube.list_objects(CONFIGMAPS, namespace)[0],
        "stacks (status)": [s.get("status") for s in kube.list_objects(STACKS, namespace)[0]],
        "events": kube.list_objects(EVENTS, namespace)[0],
        "the run's log": log,
        "the controller's log": controller.log_text(),
    }
    for where, found in places.items():
        text = found if isinstance(found, str) else json.dumps(found)
        for value in values:
            assert value not in text, f"a secret value is in {where}"
    return log


def test_inline_secrets_reach_the_program_as_secrets_and_appear_nowhere_else(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    git_server: Any,
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = reporting_repo(git_repo)
    spec = stack_spec(repo, pulumi_env, secrets={"token": INLINE_SENTINEL})
    del spec["secretsRef"]
    # A Literal git password is an inline secret too (the controller polls with it as well).
    spec["gitAuth"]["basicAuth"]["password"] = literal(git_server.password)
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", ready)
    outputs = stack["status"]["outputs"]
    assert outputs["tokenSha256"] == sha256(INLINE_SENTINEL)
    assert outputs["tokenIsSecretConfig"] is True
    assert outputs["token"] == "[secret]"

    [job] = stack_jobs(kube, namespace, "app")
    name = job["metadata"]["name"]
    assert_not_leaked(
        cluster, kube, controller, namespace, name, [INLINE_SENTINEL, git_server.password]
    )
    # The values are in the run's Secret, owned by its Job: gone with the Job.
    run_secret = kube.get(SECRETS, f"{name}-secrets", namespace)
    assert run_secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    kube.delete(JOBS, name, namespace, propagation="Background")
    wait_until(
        lambda: kube.get_or_none(SECRETS, f"{name}-secrets", namespace) is None,
        timeout=120,
        what="the garbage collector removing the run's Secret",
    )


def test_a_megabyte_config_value_runs(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    blob = "".join(f"{i:07x}\n" for i in range(128 * 1024))  # 1 MiB
    repo = reporting_repo(git_repo)
    spec = stack_spec(repo, pulumi_env)
    spec["config"]["blob"] = blob
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(kube, namespace, "app", ready)
    assert stack["status"]["outputs"]["blobSha256"] == sha256(blob)
    [job] = stack_jobs(kube, namespace, "app")
    assert last_update(stack)["name"] == job["metadata"]["name"]
    # The Job records what ran: the snapshot's ConfigMaps and their digest.
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--snapshot-configmap" in args and "--snapshot-sha256" in args
    assert len(json.dumps(job)) < 64 * 1024


def test_a_runner_that_cannot_read_its_job_still_owns_its_result(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    # Like the pkobatch-runner role, without `get` on Jobs: the runner's read of its Job fails
    # as it would during an API outage, with no way around it but the pod's own label.
    account = "runner-without-job-read"
    create_service_account(kube, namespace, account)
    grant_role(
        kube,
        namespace,
        account,
        [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update"]}],
        account,
    )
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env, serviceAccountName=account))
    stack = wait_stack(kube, namespace, "app", ready)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["failures"] == 0
    [job] = stack_jobs(kube, namespace, "app")  # no second run
    name = job["metadata"]["name"]
    result = kube.get(CONFIGMAPS, name, namespace)
    [owner] = result["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])
    log = run_log(cluster, namespace, name)
    assert "could not read Job" in log and "owned by the Job's UID" in log


def test_a_run_whose_service_account_has_no_role_binding_at_all_reaches_ready_once(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    # A PKO manifest's ServiceAccount: nothing of pkobatch's bound to it (PKO #805).
    account = "pko-workspace"
    create_service_account(kube, namespace, account)
    repo = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env, serviceAccountName=account))
    stack = wait_stack(kube, namespace, "app", ready)
    update = last_update(stack)
    assert update["state"] == "succeeded" and update["failures"] == 0
    assert stack["status"]["outputs"]["directory"] == str(pulumi_env.files_dir)
    [job] = stack_jobs(kube, namespace, "app")  # exactly one update run
    name = job["metadata"]["name"]
    assert "termination message" in run_log(cluster, namespace, name)
    # The controller wrote the result ConfigMap from the pod's report, as the runner would.
    result = kube.get(CONFIGMAPS, name, namespace)
    [owner] = result["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Job", job["metadata"]["uid"])
    assert result["metadata"]["labels"][STACK_LABEL] == "app"
    assert json.loads(result["data"]["result.json"])["state"] == "succeeded"


def test_exports_without_the_rights_they_need_stall_naming_them_before_any_update(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    account = "pko-workspace"
    create_service_account(kube, namespace, account)
    repo = git_repo()
    spec = stack_spec(
        repo,
        pulumi_env,
        serviceAccountName=account,
        exportOutputs={"configMap": {"name": "app-outputs"}},
    )
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Stalled").get("reason") == "MissingPermission",
    )
    message = condition(stack, "Stalled")["message"]
    for verb in ("create", "get", "update"):
        assert f"{verb} configmaps in namespace {namespace} (for spec.exportOutputs)" in message
    assert last_update(stack)["failures"] == 0
    # No update ran: the program's files do not exist, and there was one run only.
    assert not pulumi_env.files_dir.exists() or not any(pulumi_env.files_dir.iterdir())
    assert len(stack_jobs(kube, namespace, "app")) == 1

    # Granted the rights, the Stack runs again on request and exports.
    grant_role(
        kube,
        namespace,
        "exports",
        [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "update"]}],
        account,
    )
    request_reconcile(kube, namespace, "app", "granted")
    wait_stack(kube, namespace, "app", lambda s: ready(s) and condition(s, "Stalled") == {})
    assert kube.get(CONFIGMAPS, "app-outputs", namespace)["data"]


def test_a_large_snapshot_its_service_account_may_not_read_stalls_naming_the_right(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    # A PKO manifest's ServiceAccount, and a spec whose snapshot travels in ConfigMaps.
    account = "pko-workspace"
    create_service_account(kube, namespace, account)
    spec = stack_spec(git_repo(), pulumi_env, serviceAccountName=account)
    spec["config"]["blob"] = "x" * (80 * 1024)
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: condition(s, "Stalled").get("reason") == "MissingPermission",
    )
    message = condition(stack, "Stalled")["message"]
    assert f"ServiceAccount {account} may not get configmaps in namespace {namespace}" in message
    assert f"Grant it get on configmaps in namespace {namespace}" in message
    assert last_update(stack)["failures"] == 0
    assert not pulumi_env.files_dir.exists() or not any(pulumi_env.files_dir.iterdir())
    assert len(stack_jobs(kube, namespace, "app")) == 1  # not retried

    grant_role(
        kube,
        namespace,
        "snapshot",
        [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
        account,
    )
    request_reconcile(kube, namespace, "app", "granted")
    wait_stack(kube, namespace, "app", lambda s: ready(s) and condition(s, "Stalled") == {})


# -- stale Pulumi locks ----------------------------------------------------------------------


def container_main_pid(pod_name: str) -> int | None:
    """The pid of the pod's container process: the child of its node-agent reaper."""
    marker = f"pkobatch.dev.reaper\0--hostname\0{pod_name}\0".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker not in (proc / "cmdline").read_bytes():
                continue
            children = (proc / "task" / proc.name / "children").read_text().split()
        except OSError:
            continue
        return int(children[0]) if children else None
    return None


def test_a_hard_killed_runs_lock_is_removed_by_the_next_run(
    controller: ControllerProcess,
    kube: Kube,
    cluster: Any,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    spec = stack_spec(repo, pulumi_env)
    spec["config"]["sleepSeconds"] = "600"
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube, namespace, "app", lambda s: bool((s.get("status") or {}).get("currentUpdate"))
    )
    first = stack["status"]["currentUpdate"]["name"]
    # Commands before the update (stack select, config) hold the lock for a moment only.
    wait_until(
        lambda: held_lock(pulumi_env.backend_url) is not None,
        timeout=240,
        what="the update's stack lock",
    )
    lock = held_lock(pulumi_env.backend_url)
    assert lock is not None
    (pod,) = kube.list_objects(PODS, namespace, label_selector=f"job-name={first}")[0]
    runner = container_main_pid(pod["metadata"]["name"])
    assert runner is not None
    # The lock names the pod: its hostname is the pod's name.
    assert json.loads(lock.read_text())["hostname"] == pod["metadata"]["name"]

    # As the OOM killer would: no cleanup runs; the node agent ends the rest of the pod.
    os.kill(runner, signal.SIGKILL)
    stack = wait_stack(kube, namespace, "app", lambda s: last_update(s).get("name") == first)
    assert last_update(stack)["state"] == "failed"
    assert lock.exists(), "the killed run's lock is what this test is about"

    # The retry (fast program now) finds the lock of the finished run and removes it.
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
    stack = wait_stack(kube, namespace, "app", ready, timeout=300)
    second = last_update(stack)["name"]
    assert last_update(stack)["state"] == "succeeded"
    assert not lock.exists()
    (removed,) = wait_events(kube, namespace, lambda e: e["reason"] == "StaleLockRemoved")
    assert removed["regarding"]["name"] == "app"
    assert first in removed["note"] and pod["metadata"]["name"] in removed["note"]
    (second_pod,) = kube.list_objects(PODS, namespace, label_selector=f"job-name={second}")[0]
    log = cluster.pod_logs.read(namespace, second_pod["metadata"]["name"])
    lines = [entry for entry in log.splitlines() if "removed the stale Pulumi lock" in entry]
    assert len(lines) == 1, log
    (line,) = lines
    # (The project name in the lock's path is scrubbed: it contains the git user name.)
    assert lock.name in line and first in line and "which has finished" in line


def test_a_lock_held_by_a_live_foreign_run_is_never_removed(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    tmp_path: Path,
) -> None:
    repo = git_repo()
    # A person's `pulumi up` of the same stack from a laptop (here: `pkobatch run`).
    manifest = tmp_path / "laptop.yaml"
    laptop_spec = stack_spec(repo, pulumi_env)
    laptop_spec["config"]["sleepSeconds"] = "600"
    body = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": "laptop", "namespace": namespace},
    }
    manifest.write_text(json.dumps({**body, "spec": laptop_spec}))
    # Secret values go through the environment, never the argument list.
    secret_env = {
        fallback_env_name("PKOBATCH_SECRET", name, key): value
        for name, data in secrets.items()
        for key, value in data.items()
    }
    laptop = subprocess.Popen(
        [sys.executable, "-m", "pkobatch.main", "run", "-f", str(manifest), "-o", "json"],
        env={
            **pulumi_env.env,
            "HOME": str(tmp_path / "home"),
            "TMPDIR": str(tmp_path),
            # The test's git server is plain HTTP on loopback.
            INSECURE_HTTP_GIT_HOSTS: LOOPBACK_GIT_HOST,
            **secret_env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: held_lock(pulumi_env.backend_url) is not None,
            timeout=240,
            what="the laptop's lock",
        )
        (lock,) = backend_locks(pulumi_env.backend_url)
        holder = json.loads(lock.read_text())

        apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env))
        stack = wait_stack(
            kube, namespace, "app", lambda s: last_update(s).get("state") == "failed"
        )

        update = last_update(stack)
        assert "locked" in update["message"]
        assert f"{holder['hostname']} (pid {holder['pid']})" in update["message"]
        assert lock.exists()
        assert laptop.poll() is None, "the live run was disturbed"
        (conflict,) = wait_events(
            kube, namespace, lambda e: e["reason"] == "StackUpdateConflictDetected", timeout=120
        )
        assert conflict["type"] == "Warning" and conflict["regarding"]["name"] == "app"
        assert update["name"] in conflict["note"] and "locked" in conflict["note"]
        events, _ = kube.list_objects(EVENTS, namespace)
        assert not [e for e in events if e["reason"] == "StaleLockRemoved"]
        assert not [e for e in events if e["reason"] == "StackUpdateFailure"]
    finally:
        laptop.terminate()
        laptop.wait(timeout=120)


def test_refused_git_credentials_and_a_stack_that_cannot_be_selected_have_pkos_event_reasons(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    # A pinned commit: no branch poll, so the run itself meets the git server's refusal.
    bad_token = stack_spec(repo, pulumi_env, commit=repo.commit)
    del bad_token["branch"]
    bad_token["gitAuth"] = {"accessToken": literal("not-the-git-servers-token")}
    apply_stack(kube, namespace, "bad-token", bad_token)
    # useLocalStackOnly and a stack nobody created: selecting it fails.
    apply_stack(
        kube,
        namespace,
        "absent",
        stack_spec(repo, pulumi_env, stack="nowhere", useLocalStackOnly=True),
    )
    expected = {
        "bad-token": (
            "StackGitAuthenticationFailure",
            "gitAuthentication",
            "Authentication failed",
        ),
        "absent": ("StackInitializationFailure", "stackInitialization", "does not exist"),
    }
    for name, (event_reason, failed_step, words) in expected.items():
        stack = wait_stack(
            kube, namespace, name, lambda s: last_update(s).get("state") == "failed", timeout=300
        )
        job = last_update(stack)["name"]
        result = json.loads(kube.get(CONFIGMAPS, job, namespace)["data"]["result.json"])
        assert result["failedStep"] == failed_step
        assert words in result["message"]
        (event, *_) = wait_events(
            kube,
            namespace,
            lambda e, name=name, reason=event_reason: (
                e["regarding"]["name"] == name and e["reason"] == reason
            ),
            timeout=120,
        )
        assert event["type"] == "Warning" and f"up {job} failed" in event["note"]
    events, _ = kube.list_objects(EVENTS, namespace)
    assert not [e for e in events if e["reason"] == "StackUpdateFailure"]


def test_outputs_that_cannot_be_read_after_an_update_have_pkos_event_reason(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    tmp_path: Path,
) -> None:
    # The passphrase comes from a file, as from a mounted Secret, and is rotated while the
    # update runs: Pulumi read it before the update, so the update succeeds; reading the
    # outputs in plaintext for spec.exportOutputs (`stack output --show-secrets`) afterwards
    # meets the new one, which cannot decrypt the stack's secrets.
    passphrase_file = tmp_path / "passphrase"
    passphrase_file.write_text(pulumi_env.passphrase)
    hold = tmp_path / "hold"
    export = {"configMap": {"name": "app-outputs"}, "secret": {"name": "app-secret-outputs"}}
    repo = git_repo()
    spec = stack_spec(repo, pulumi_env, exportOutputs=export)
    del spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE"]
    spec["envRefs"]["PULUMI_CONFIG_PASSPHRASE_FILE"] = literal(str(passphrase_file))
    spec["config"]["holdUntil"] = str(hold)
    apply_stack(kube, namespace, "app", spec)
    try:
        wait_until(
            lambda: held_lock(pulumi_env.backend_url) is not None,
            timeout=300,
            what="the update to hold the stack's lock",
        )
        passphrase_file.write_text(plant("rotated-passphrase"))
    finally:
        hold.touch()

    (event, *_) = wait_events(
        kube,
        namespace,
        lambda e: e["regarding"]["name"] == "app" and e["reason"] == "StackOutputRetrievalFailure",
        timeout=300,
    )
    assert event["type"] == "Warning" and "incorrect passphrase" in event["note"]
    job = event["note"].removeprefix("up ").split()[0]
    result = json.loads(kube.get(CONFIGMAPS, job, namespace)["data"]["result.json"])
    assert (result["state"], result["failedStep"]) == ("failed", "outputRetrieval")
    assert result["commit"] == repo.commit
    # The update itself went through: the program's files exist; nothing was exported.
    assert len(list(pulumi_env.files_dir.iterdir())) == 2
    assert kube.get_or_none(CONFIGMAPS, "app-outputs", namespace) is None
    assert kube.get_or_none(SECRETS, "app-secret-outputs", namespace) is None
    events, _ = kube.list_objects(EVENTS, namespace)
    assert not [e for e in events if e["reason"] == "StackUpdateFailure" and job in e["note"]], (
        "the run's failure has PKO's reason for it, not the generic one"
    )

    # The right passphrase back: the next run exports the outputs.
    passphrase_file.write_text(pulumi_env.passphrase)
    request_reconcile(kube, namespace, "app", "passphrase-restored")
    wait_stack(kube, namespace, "app", ready, timeout=300)
    assert kube.get(CONFIGMAPS, "app-outputs", namespace)["data"]["directory"] == str(
        pulumi_env.files_dir
    )


# ---------------------------------------------------------------------------------------
# Outputs for other workloads (issue 12, item 4): spec.exportOutputs
# ---------------------------------------------------------------------------------------


def test_exported_outputs_reach_a_config_map_and_a_secret_and_go_with_a_destroy(
    controller: ControllerProcess,
    cluster: Any,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
) -> None:
    repo = git_repo()
    export = {
        "configMap": {"name": "app-outputs"},
        "secret": {"name": "app-secret-outputs"},
        "outputs": ["directory", "paths", "token"],
        "keys": {"token": "TOKEN"},
    }
    apply_stack(kube, namespace, "app", stack_spec(repo, pulumi_env, exportOutputs=export))
    stack = wait_stack(kube, namespace, "app", ready)
    uid = stack["metadata"]["uid"]
    assert stack["status"]["outputs"]["token"] == "[secret]"

    config_map = kube.get(CONFIGMAPS, "app-outputs", namespace)
    secret = kube.get(SECRETS, "app-secret-outputs", namespace)
    for obj in (config_map, secret):
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Stack", "app", uid)
    assert config_map["data"]["directory"] == str(pulumi_env.files_dir)
    paths = json.loads(config_map["data"]["paths"])
    assert len(paths) == 2 and all(p.startswith(str(pulumi_env.files_dir)) for p in paths)
    assert set(config_map["data"]) == {"directory", "paths"}
    # The secret output (the sentinel of the `pulumi` Secret) is in the export Secret only.
    token = secrets["pulumi"]["token"]
    assert secret["type"] == "Opaque" and set(secret["data"]) == {"TOKEN"}
    assert base64.b64decode(secret["data"]["TOKEN"]).decode() == token
    [job] = stack_jobs(kube, namespace, "app")
    log = assert_not_leaked(cluster, kube, controller, namespace, job["metadata"]["name"], [token])
    assert "exported 2 plain output(s) and 1 secret output(s)" in log

    # The next up updates the Stack's own objects in place.
    spec = stack_spec(repo, pulumi_env, exportOutputs=export)
    spec["config"]["files"] = "3"
    apply_stack(kube, namespace, "app", spec)
    wait_stack(kube, namespace, "app", lambda s: ready(s) and last_update(s)["generation"] == 2)
    updated = kube.get(CONFIGMAPS, "app-outputs", namespace)
    assert updated["metadata"]["uid"] == config_map["metadata"]["uid"]
    assert len(json.loads(updated["data"]["paths"])) == 3
    assert kube.get(SECRETS, "app-secret-outputs", namespace)["data"] == secret["data"]

    stack = request(kube, namespace, "destroy:t1")
    assert stack["status"]["operationRequest"]["state"] == "Succeeded"
    assert last_update(stack)["type"] == "destroy" and last_update(stack)["state"] == "succeeded"
    assert kube.get_or_none(CONFIGMAPS, "app-outputs", namespace) is None
    assert kube.get_or_none(SECRETS, "app-secret-outputs", namespace) is None

    # An object of that name that the Stack does not own is never overwritten: the run fails.
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-outputs"}}
    kube.create(CONFIGMAPS, {**foreign, "data": {"mine": "yes"}}, namespace)
    stack = request(kube, namespace, "up:t2")
    assert last_update(stack)["type"] == "up" and last_update(stack)["state"] == "failed"
    assert (
        "ConfigMap " + namespace + "/app-outputs exists and is not owned by Stack app"
        in (last_update(stack)["message"])
    )
    assert kube.get(CONFIGMAPS, "app-outputs", namespace)["data"] == {"mine": "yes"}
