"""Pod-level causes of a failed run (pkobatch.controller.pod_causes.pod_cause and its uses), from
pod statuses in the shapes a kubelet and the scheduler write them (Kubernetes 1.3x)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from pkobatch.controller.outcome import (
    job_outcome,
    next_pod_start_check,
    pod_start_outcome,
    pod_status_matters,
)
from pkobatch.controller.pod_causes import FIXED_BY_SPEC_LIMIT, POD_START_LIMIT, pod_cause

NOW = datetime(2026, 2, 1, 8, 0, tzinfo=UTC)
SPEC = yaml.safe_load(
    """
containers:
- name: pulumi
  image: pkobatch/runner:0.9.9
  resources: {limits: {memory: 256Mi}, requests: {memory: 256Mi}}
"""
)

OOM_KILLED = yaml.safe_load(
    """
phase: Failed
containerStatuses:
- name: pulumi
  image: docker.io/pkobatch/runner:0.9.9
  imageID: docker.io/pkobatch/runner@sha256:9f2c
  containerID: containerd://4b1e
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 137
      reason: OOMKilled
      startedAt: "2026-02-01T07:58:01Z"
      finishedAt: "2026-02-01T07:58:40Z"
      containerID: containerd://4b1e
"""
)
IMAGE_PULL_BACK_OFF = yaml.safe_load(
    """
phase: Pending
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: "2026-02-01T07:50:00Z"}
- {type: Ready, status: "False", reason: ContainersNotReady,
   message: "containers with unready status: [pulumi]"}
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  imageID: ""
  ready: false
  started: false
  restartCount: 0
  state:
    waiting:
      reason: ImagePullBackOff
      message: Back-off pulling image "pkobatch/runner:0.9.9"
"""
)
ERR_IMAGE_PULL = yaml.safe_load(
    """
phase: Pending
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  imageID: ""
  ready: false
  restartCount: 0
  state:
    waiting:
      reason: ErrImagePull
      message: 'failed to pull and unpack image "docker.io/pkobatch/runner:0.9.9": failed to
        resolve reference "docker.io/pkobatch/runner:0.9.9": docker.io/pkobatch/runner:0.9.9:
        not found'
"""
)
CONFIG_ERROR = yaml.safe_load(
    """
phase: Pending
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  ready: false
  restartCount: 0
  state:
    waiting:
      reason: CreateContainerConfigError
      message: secret "pulumi-api" not found
"""
)
UNSCHEDULABLE = yaml.safe_load(
    """
phase: Pending
conditions:
- type: PodScheduled
  status: "False"
  reason: Unschedulable
  lastProbeTime: null
  lastTransitionTime: "2026-02-01T07:50:00Z"
  message: '0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are
    available: 3 No preemption victims found for incoming pod.'
"""
)
EVICTED = yaml.safe_load(
    """
phase: Failed
reason: Evicted
message: 'The node was low on resource: memory. Threshold quantity: 100Mi, available: 91Mi.
  Container pulumi was using 1300Mi, request is 256Mi, has larger consumption of memory. '
conditions:
- type: DisruptionTarget
  status: "True"
  reason: TerminationByKubelet
  message: 'The node was low on resource: memory. Threshold quantity: 100Mi, available: 91Mi.'
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  ready: false
  restartCount: 0
  state:
    terminated: {exitCode: 137, reason: ContainerStatusUnknown,
      message: The container could not be located when the pod was terminated}
"""
)
# As the kubelet reports a run container whose shim and processes were killed while
# containerd was down (a reboot): containerd, started again, knows no exit status.
LOST = yaml.safe_load(
    """
phase: Failed
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  ready: false
  restartCount: 0
  state:
    terminated: {exitCode: 255, reason: Unknown,
      startedAt: "2026-02-01T07:58:01Z", finishedAt: "2026-02-01T07:58:40Z"}
"""
)
EXITED = yaml.safe_load(
    """
phase: Failed
containerStatuses:
- name: pulumi
  image: pkobatch/runner:0.9.9
  ready: false
  restartCount: 0
  state:
    terminated: {exitCode: 1, reason: Error}
"""
)


def pod(status: dict[str, Any], created: datetime = NOW - timedelta(minutes=1)) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "app-up-1-x7k2p",
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "labels": {"batch.kubernetes.io/job-name": "app-up-1"},
        },
        "spec": SPEC,
        "status": status,
    }


def job(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "app-up-1",
            "uid": "job-uid",
            "creationTimestamp": (NOW - POD_START_LIMIT - timedelta(seconds=30)).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        },
        "spec": {"activeDeadlineSeconds": 3600},
        "status": status,
    }


def failed_job(reason: str, message: str = "") -> dict[str, Any]:
    condition = {
        "type": "Failed",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-02-01T07:59:00Z",
    }
    return job(conditions=[condition], failed=1)


@pytest.mark.parametrize(
    ("status", "reason", "words"),
    [
        (OOM_KILLED, "OOMKilled", ["ran out of memory", "256Mi", "limits.memory", "137"]),
        (IMAGE_PULL_BACK_OFF, "ImagePullFailed", ["pkobatch/runner:0.9.9", "imagePullSecrets"]),
        (ERR_IMAGE_PULL, "ImagePullFailed", ["not found", "spec.workspaceTemplate.spec.image"]),
        (CONFIG_ERROR, "ContainerConfigError", ['secret "pulumi-api" not found', "Secret"]),
        (UNSCHEDULABLE, "Unschedulable", ["3 Insufficient memory", "lower its requests"]),
        (EVICTED, "Evicted", ["low on resource: memory", "resource requests"]),
    ],
)
def test_pod_causes_say_what_to_change(status: Any, reason: str, words: list[str]) -> None:
    cause = pod_cause(pod(status))
    assert cause is not None and cause.reason == reason
    for word in words:
        assert word in cause.message


def test_a_pod_whose_program_failed_has_no_pod_cause() -> None:
    assert pod_cause(pod(EXITED)) is None


def test_an_oom_killed_run_fails_with_that_cause() -> None:
    failed = failed_job(
        "PodFailurePolicy", "Container pulumi for pod ns/p failed with exit code 137"
    )
    assert pod_status_matters(failed, NOW)
    outcome = job_outcome(failed, None, "stack-uid", NOW, [pod(OOM_KILLED)])
    assert outcome is not None and outcome.reason == "OOMKilled"
    assert outcome.message.startswith("run app-up-1 failed: the run's container pulumi ran out")
    # Without its pod (already gone) the Job's own words remain.
    unknown = job_outcome(failed, None, "stack-uid", NOW, [])
    assert unknown is not None and unknown.reason == "JobFailed"


def test_a_container_its_node_lost_is_an_interruption() -> None:
    failed = failed_job("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    outcome = job_outcome(failed, None, "stack-uid", NOW, [pod(LOST)])
    assert outcome is not None and outcome.reason == "Interrupted"
    assert "container pulumi was lost by its node (Unknown, exit code 255" in outcome.message
    assert "it will be retried" in outcome.message


def test_an_eviction_stays_an_interruption_with_the_kubelets_words() -> None:
    failed = failed_job(
        "PodFailurePolicy",
        "Pod ns/app-up-1-x7k2p has condition DisruptionTarget matching FailJob rule at index 0",
    )
    outcome = job_outcome(failed, None, "stack-uid", NOW, [pod(EVICTED)])
    assert outcome is not None and outcome.reason == "Interrupted"
    assert "low on resource: memory" in outcome.message


def test_a_deadline_reached_before_the_pod_started_names_why() -> None:
    failed = failed_job("DeadlineExceeded", "Job was active longer than specified deadline")
    outcome = job_outcome(failed, None, "stack-uid", NOW, [pod(IMAGE_PULL_BACK_OFF)])
    assert outcome is not None and outcome.reason == "DeadlineExceeded"
    assert "without starting" in outcome.message and "ImagePullBackOff" in outcome.message


@pytest.mark.parametrize("status", [IMAGE_PULL_BACK_OFF, CONFIG_ERROR, UNSCHEDULABLE])
def test_a_pod_that_cannot_start_fails_the_run_after_the_limit(status: Any) -> None:
    running = job(active=1, ready=0)
    assert pod_status_matters(running, NOW)
    early = pod(status, created=NOW - POD_START_LIMIT + timedelta(seconds=5))
    assert pod_start_outcome(running, [early], NOW) is None
    late = pod(status, created=NOW - POD_START_LIMIT)
    outcome = pod_start_outcome(running, [late], NOW)
    assert outcome is not None and outcome.state == "failed"
    assert outcome.message.startswith("run app-up-1 could not start for 5 minutes: ")
    # A ready pod, or one without such a cause, is left alone.
    assert pod_start_outcome(job(active=1, ready=1), [late], NOW) is None
    assert pod_start_outcome(running, [pod(EXITED, created=NOW - POD_START_LIMIT)], NOW) is None


def test_pods_are_read_only_when_they_alone_can_tell() -> None:
    young = job(active=1)
    young["metadata"]["creationTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert not pod_status_matters(young, NOW)
    assert not pod_status_matters(job(active=1, ready=1), NOW)
    # A finished Job's pod vouches for its result (fold.trusted_result).
    complete = job(conditions=[{"type": "Complete", "status": "True"}])
    assert pod_status_matters(complete, NOW)


NEVER_PULLED = yaml.safe_load(
    """
phase: Pending
containerStatuses:
  - name: pulumi
    image: example.com/never-loaded:1
    ready: false
    state:
      waiting:
        reason: ErrImageNeverPull
        message: 'Container image "example.com/never-loaded:1" is not present with pull
          policy of Never'
"""
)


def test_a_pod_only_a_spec_change_can_start_fails_the_run_sooner() -> None:
    running = job(active=1, ready=0)
    created = NOW - FIXED_BY_SPEC_LIMIT
    running["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert pod_status_matters(running, NOW)
    early = pod(NEVER_PULLED, created=created + timedelta(seconds=5))
    assert pod_start_outcome(running, [early], NOW) is None
    outcome = pod_start_outcome(running, [pod(NEVER_PULLED, created=created)], NOW)
    assert outcome is not None and outcome.reason == "ImagePullFailed"
    assert outcome.message.startswith("run app-up-1 could not start for 30 seconds: ")
    assert "example.com/never-loaded:1" in outcome.message
    # A pull that may yet succeed gets the whole limit.
    assert pod_start_outcome(running, [pod(ERR_IMAGE_PULL, created=created)], NOW) is None


def test_the_next_start_check_is_the_next_limit() -> None:
    created = NOW - timedelta(seconds=10)
    assert next_pod_start_check(created, NOW) == created + FIXED_BY_SPEC_LIMIT
    later = NOW + FIXED_BY_SPEC_LIMIT
    assert next_pod_start_check(created, later) == created + POD_START_LIMIT
