"""Saved Pulumi update plans of ``spec.approval`` (see ``pkobatch.controller.approval``).

A preview of kind ``approval`` runs ``preview --save-plan`` and stores the plan file,
gzip-compressed, in a Secret (the plan holds the stack's config, secret values encrypted
with its secrets provider, and every planned input: it belongs where secrets belong, never
in the result ConfigMap). The Secret is immutable and owned by the preview's Job, so it goes
when the Job goes; the result reports only the plan's id and the resources it changes.

The approved ``up`` reads that Secret, refuses a plan whose id is not the approved one (the
id is recomputed from the plan, the commit just checked out and the spec), and runs
``up --plan``: Pulumi then refuses every operation the plan does not allow.

This module is pure but for the ``PlanStore`` the caller gives (the cluster, in a Job).
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Mapping
from typing import Any, Final, Protocol

from pkobatch.api.objects import JSON
from pkobatch.api.run import (
    JOB_UID_ENV,
    MAX_PLAN_BYTES,
    MAX_PLANNED_RESOURCES,
    PLAN_KEY,
    PlannedStep,
    StackRef,
)
from pkobatch.runner.failures import RunFailure

PLAN_LABEL: Final = "pkobatch.io/plan-of"
# The stack settings a plan's config ciphertexts depend on: a new stack gets its passphrase
# salt (or encrypted data key) when the preview creates it, in a file the preview's workspace
# holds; the approved update restores them (they are not secret: projects commit them).
ENCRYPTION_KEYS: Final = ("encryptionsalt", "encryptedkey")
# Steps of a plan that change nothing.
_UNCHANGED: Final = frozenset({"same", "read"})


class PlanStore(Protocol):
    """Where plan Secrets live (the cluster, in a Job)."""

    def create_plan(self, body: JSON) -> None:
        """Create the plan Secret ``body``."""

    def read_plan(self, name: str) -> JSON:
        """The plan Secret ``name``."""


def planned_steps(plan: Mapping[str, Any]) -> tuple[list[PlannedStep], int]:
    """The resources a plan file changes (at most ``MAX_PLANNED_RESOURCES``), and their count."""
    changed = []
    for urn, resource in sorted((plan.get("resourcePlans") or {}).items()):
        steps = [
            str(step) for step in (resource or {}).get("steps") or () if str(step) not in _UNCHANGED
        ]
        if steps:
            changed.append(PlannedStep(urn=str(urn), op=",".join(steps)))
    return changed[:MAX_PLANNED_RESOURCES], len(changed)


def plan_secret(
    name: str,
    plan: bytes,
    plan_id: str,
    stack: StackRef,
    job: str,
    env: Mapping[str, str],
    encryption: Mapping[str, str] | None = None,
) -> JSON:
    """The Secret that holds ``plan``, owned by the run's Job (its UID from the pod's env)."""
    compressed = gzip.compress(plan, mtime=0)
    if len(compressed) > MAX_PLAN_BYTES:
        raise RunFailure(
            "JobFailed",
            f"the saved plan is {len(compressed)} bytes compressed, more than a Secret can hold "
            f"({MAX_PLAN_BYTES}); split the stack, or turn spec.approval.required off",
        )
    job_uid = env.get(JOB_UID_ENV, "")
    if not job_uid:
        raise RunFailure(
            "JobFailed",
            f"${JOB_UID_ENV} is unset: the plan's Secret could not be owned by the run's Job",
        )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": name,
            "namespace": stack.namespace,
            "labels": {PLAN_LABEL: job},
            "annotations": {"pkobatch.io/plan-id": plan_id},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid}
            ],
        },
        "data": {
            PLAN_KEY: base64.b64encode(compressed).decode("ascii"),
            **{
                key: base64.b64encode(value.encode()).decode("ascii")
                for key, value in (encryption or {}).items()
                if key in ENCRYPTION_KEYS and value
            },
        },
    }


def encryption_from_secret(secret: Mapping[str, Any]) -> dict[str, str]:
    """The stack settings ``plan_secret`` kept beside the plan."""
    data = secret.get("data") or {}
    return {key: base64.b64decode(data[key]).decode() for key in ENCRYPTION_KEYS if data.get(key)}


def plan_from_secret(secret: Mapping[str, Any], name: str) -> bytes:
    """The plan file a plan Secret holds."""
    data = (secret.get("data") or {}).get(PLAN_KEY)
    if not data:
        raise RunFailure("PlanMismatch", f"Secret {name} holds no plan (key {PLAN_KEY})")
    try:
        return gzip.decompress(base64.b64decode(data))
    except (ValueError, OSError, EOFError):
        raise RunFailure("PlanMismatch", f"Secret {name} does not hold a readable plan") from None


def load_plan(text: bytes) -> JSON:
    try:
        loaded = json.loads(text)
    except ValueError:
        raise RunFailure("ProgramError", "pulumi saved a plan that is not JSON") from None
    if not isinstance(loaded, dict):
        raise RunFailure("ProgramError", "pulumi saved a plan that is not a JSON object")
    return loaded
