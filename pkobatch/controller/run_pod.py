"""The run's pod: its run container, the runner injected into an image that is not the
runner image, PKO's ``share`` volume, and a writable ``/tmp`` under a read-only root.

Pure edits of a pod spec, used by the Job builder (``pkobatch.controller.job_builder``), which
applies them to the final pod so no template layer can undo them. ``JobBuildError`` is the
refusal of every builder step: the Stack asks for something a Job cannot do.
"""

from __future__ import annotations

import copy
from typing import Final

from pkobatch.api.constants import RUN_CONTAINER_NAME
from pkobatch.api.objects import JSON
from pkobatch.api.run import DYNAMIC_ENV_VAR
from pkobatch.config import JobSettings

# The runner bundle injected into runs whose image is not the runner image.
BUNDLE_VOLUME: Final = "pkobatch-runner"
# PKO's "share" volume, where its workspace pod keeps the dynamic environment file
# ($PULUMI_ENV): templates written for PKO mount it by this name.
SHARE_VOLUME: Final = "share"
SHARE_MOUNT_PATH: Final = "/share"
DYNAMIC_ENV_FILE: Final = f"{SHARE_MOUNT_PATH}/.env"
BUNDLE_MOUNT_PATH: Final = "/pkobatch"
# The init container copies the bundle directory here; its launcher is the run's command.
INJECTED_BUNDLE: Final = f"{BUNDLE_MOUNT_PATH}/runner"
INJECTED_RUNNER: Final = f"{INJECTED_BUNDLE}/pkobatch-runner"
BUNDLE_INIT_CONTAINER: Final = "pkobatch-runner"
# A run container with a read-only root filesystem gets a writable /tmp (an emptyDir).
TMP_VOLUME: Final = "pkobatch-tmp"
TMP_DIR: Final = "/tmp"
JOB_RUN_ARGS: Final = ("job", "run")
# The user PKO runs workspace pods as (its "restricted" security profile): stock images such
# as pulumi/pulumi:<version>-nonroot name their user ("pulumi"), which runAsNonRoot cannot
# verify without a numeric runAsUser.
PKO_RUN_AS_USER: Final = 1000
# Pod Security Standard "restricted", whatever the template says.
RESTRICTED_SECURITY_CONTEXT: Final[JSON] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


class JobBuildError(ValueError):
    """The Stack asks for something a Job cannot do; the message says what to change."""


def run_container(pod_spec: JSON) -> JSON:
    for container in pod_spec.get("containers") or []:
        if container.get("name") == RUN_CONTAINER_NAME:
            return dict(container)
    raise JobBuildError(f"the Job template has no container named {RUN_CONTAINER_NAME!r}")


def replace_run_container(pod_spec: JSON, container: JSON) -> None:
    pod_spec["containers"] = [
        container if c.get("name") == RUN_CONTAINER_NAME else c for c in pod_spec["containers"]
    ]


def with_named(items: list[JSON] | None, item: JSON, *, first: bool = False) -> list[JSON]:
    """``items`` with ``item`` in place of the one of the same name, else added."""
    others = [i for i in items or [] if i.get("name") != item["name"]]
    return [item, *others] if first else [*others, item]


def share_dynamic_env(pod_spec: JSON) -> None:
    """PKO's dynamic environment, so its manifests work unchanged: the ``share`` emptyDir
    (unless a template defines that volume), mounted in the run container where PKO mounts
    it, and ``$PULUMI_ENV`` naming the file on it in every container and init container, as
    PKO sets it after merging the pod template."""
    if not any(v.get("name") == SHARE_VOLUME for v in pod_spec.get("volumes") or []):
        pod_spec["volumes"] = [
            *(pod_spec.get("volumes") or []),
            {"name": SHARE_VOLUME, "emptyDir": {}},
        ]
    runner = run_container(pod_spec)
    mounts = runner.get("volumeMounts") or []
    if not any(
        m.get("name") == SHARE_VOLUME or m.get("mountPath") == SHARE_MOUNT_PATH for m in mounts
    ):
        runner["volumeMounts"] = [*mounts, {"name": SHARE_VOLUME, "mountPath": SHARE_MOUNT_PATH}]
    replace_run_container(pod_spec, runner)
    variable = {"name": DYNAMIC_ENV_VAR, "value": DYNAMIC_ENV_FILE}
    for kind in ("initContainers", "containers"):
        for container in pod_spec.get(kind) or []:
            container["env"] = with_named(container.get("env"), variable)


def runner_command(pod_spec: JSON, runner: JSON, settings: JobSettings) -> list[str]:
    """The run container's command. In the runner image it is ``settings.command``; in any
    other image it is the runner bundle, which an init container from the runner image
    copies into an ``emptyDir`` shared with the run container (added to ``pod_spec`` and
    ``runner`` here). The init container gets the run container's resources, so the pod's
    effective request does not grow and a quota that requires requests admits it. Unless a
    template names a user, the run container runs as PKO runs workspace pods (uid/gid 1000)."""
    if runner.get("image") == settings.image:
        return list(settings.command)
    mount = {"name": BUNDLE_VOLUME, "mountPath": BUNDLE_MOUNT_PATH}
    init: JSON = {
        "name": BUNDLE_INIT_CONTAINER,
        "image": settings.bundle_image or settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["cp", "-R", settings.runner_bundle, INJECTED_BUNDLE],
        "volumeMounts": [mount],
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY_CONTEXT),
    }
    if runner.get("resources"):
        init["resources"] = copy.deepcopy(runner["resources"])
    pod_spec["initContainers"] = with_named(pod_spec.get("initContainers"), init, first=True)
    pod_spec["volumes"] = with_named(
        pod_spec.get("volumes"), {"name": BUNDLE_VOLUME, "emptyDir": {}}
    )
    runner["volumeMounts"] = with_named(runner.get("volumeMounts"), {**mount, "readOnly": True})
    pod_context = pod_spec.get("securityContext") or {}
    context = runner.setdefault("securityContext", {})
    if "runAsUser" not in pod_context and "runAsUser" not in context:
        context["runAsUser"] = PKO_RUN_AS_USER
        if "runAsGroup" not in pod_context:
            context.setdefault("runAsGroup", PKO_RUN_AS_USER)
    return [INJECTED_RUNNER, *JOB_RUN_ARGS]


def writable_tmp(pod_spec: JSON, runner: JSON) -> None:
    """A run container whose root filesystem is read-only (``readOnlyRootFilesystem``, set
    by a template) gets an ``emptyDir`` at ``/tmp`` unless a template mounts something there,
    and ``TMPDIR`` and ``HOME`` set to it unless its ``env`` sets them: the runner's
    workspace, Pulumi's home and the CLI's temporary files need a writable directory."""
    if not (runner.get("securityContext") or {}).get("readOnlyRootFilesystem"):
        return
    mounts = runner.get("volumeMounts") or []
    if not any(m.get("mountPath", "").rstrip("/") == TMP_DIR for m in mounts):
        pod_spec["volumes"] = with_named(
            pod_spec.get("volumes"), {"name": TMP_VOLUME, "emptyDir": {}}
        )
        runner["volumeMounts"] = with_named(mounts, {"name": TMP_VOLUME, "mountPath": TMP_DIR})
    named = {e.get("name") for e in runner.get("env") or []}
    runner["env"] = [
        *(runner.get("env") or []),
        *({"name": name, "value": TMP_DIR} for name in ("TMPDIR", "HOME") if name not in named),
    ]
