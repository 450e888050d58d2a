"""Why a run's pod failed, or cannot start, for a reason outside the program (pure).

``pod_cause`` reads a pod's status as the kubelet and the scheduler wrote it — an OOM kill
(with the limit it met), an eviction, image pull errors, a container that cannot be created
or configured, no node that fits, a container its node lost — and says it in words that name
what to change. ``pkobatch.controller.outcome`` turns a cause into the run's ``Outcome``: at
once for a pod that ended, after ``POD_START_LIMIT`` (``FIXED_BY_SPEC_LIMIT`` where only a
spec change can help) for one that waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

# How long a run's pod may stay unable to start (image pull errors, a container that cannot
# be created, no node to schedule it on) before the run is failed with that cause, instead
# of waiting for the Job's deadline (an hour by default) with nothing to show.
POD_START_LIMIT: Final = timedelta(minutes=5)
# The same for a pod no wait can start: an image the node must never pull
# (``imagePullPolicy: Never`` and not on the node) or an invalid image name.
FIXED_BY_SPEC_LIMIT: Final = timedelta(seconds=30)
# The label the Job controller puts on its pods (Kubernetes 1.27+).
JOB_CONTROLLER_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
# Waiting reasons the kubelet gives a container it cannot start.
_IMAGE_PULL_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
_FIXED_BY_SPEC_REASONS: Final = frozenset({"ErrImageNeverPull", "InvalidImageName"})
_CONTAINER_CONFIG_REASONS: Final = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
# Terminated reasons of a container its node lost without an exit status: containerd's for a
# task whose shim was gone when it started again (a node reboot, a crash of the runtime), the
# kubelet's for a container its runtime no longer knows.
_LOST_CONTAINER_REASONS: Final = frozenset({"Unknown", "ContainerStatusUnknown"})
_RESOURCES_HINT: Final = "spec.workspaceTemplate.spec.resources (or the Job template's defaults)"


@dataclass(frozen=True)
class PodCause:
    """Why a run's pod failed, or cannot start, for a reason outside the program."""

    reason: str
    message: str
    # The pod cannot start (it waits); False: it ended.
    waiting: bool
    # How long a waiting pod may wait before the run fails with this cause.
    start_limit: timedelta = POD_START_LIMIT


def _container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]


def _memory_limit(pod: Mapping[str, Any], container: str) -> str:
    spec = pod.get("spec") or {}
    for item in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        if item.get("name") == container:
            return str(((item.get("resources") or {}).get("limits") or {}).get("memory") or "")
    return ""


def pod_cause(pod: Mapping[str, Any]) -> PodCause | None:
    """What the kubelet and scheduler say about a run's pod, in words a user can act on;
    None when the pod shows no cause outside the program (it ran and exited)."""
    status = pod.get("status") or {}
    if status.get("reason") == "Evicted":
        return PodCause(
            "Evicted",
            f"the run's pod was evicted by its node ({status.get('message') or 'no message'}); "
            f"give the run resource requests that match its use in {_RESOURCES_HINT} so the "
            "node does not run short, or free the node; the run is retried",
            waiting=False,
        )
    for container in _container_statuses(pod):
        name = str(container.get("name") or "")
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                limit = _memory_limit(pod, name)
                within = f"its memory limit of {limit}" if limit else "the node's memory"
                return PodCause(
                    "OOMKilled",
                    f"the run's container {name} ran out of memory and was killed (OOMKilled, "
                    f"exit code {terminated.get('exitCode', 137)}): it needed more than "
                    f"{within}; raise limits.memory in {_RESOURCES_HINT}",
                    waiting=False,
                )
            if terminated.get("reason") in _LOST_CONTAINER_REASONS:
                return PodCause(
                    "Interrupted",
                    f"the run's container {name} was lost by its node "
                    f"({terminated['reason']}, exit code {terminated.get('exitCode')}: the "
                    "node rebooted, or its container runtime was restarted after the "
                    "container's processes were killed); it will be retried",
                    waiting=False,
                )
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        detail = str(waiting.get("message") or "no message")
        if reason in _IMAGE_PULL_REASONS:
            return PodCause(
                "ImagePullFailed",
                f"the run's container {name} cannot start: its image {container.get('image')} "
                f"cannot be pulled ({reason}: {detail}); check the image name and tag "
                "(spec.workspaceTemplate.spec.image or the controller's runner image) and the "
                "pod's imagePullSecrets",
                waiting=True,
                start_limit=FIXED_BY_SPEC_LIMIT
                if reason in _FIXED_BY_SPEC_REASONS
                else POD_START_LIMIT,
            )
        if reason in _CONTAINER_CONFIG_REASONS:
            return PodCause(
                "ContainerConfigError",
                f"the run's container {name} cannot be created ({reason}: {detail}); create "
                "the Secret or ConfigMap it names, or fix the reference in the Stack's "
                "envRefs, secretsRef, env or envFrom",
                waiting=True,
            )
    for condition in status.get("conditions") or ():
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return PodCause(
                "Unschedulable",
                f"no node can run the run's pod ({condition.get('message') or 'Unschedulable'}); "
                f"lower its requests in {_RESOURCES_HINT}, fix its nodeSelector, affinity or "
                "tolerations (spec.workspaceTemplate.spec.podTemplate or spec.jobTemplate), or "
                "add capacity",
                waiting=True,
            )
    return None
