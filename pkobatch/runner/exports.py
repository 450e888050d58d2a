"""``spec.exportOutputs``: a stack's outputs, for other workloads, in a ConfigMap and a Secret.

After a successful ``up`` the runner reads the outputs a second time, with
``--show-secrets`` (``RunnerWorkspace.stack_outputs_with_secrets``; the result keeps the
masked read), registers every secret value with the run's redactor at once, and writes:

- plain outputs to the ConfigMap ``configMap.name``, secret ones to the Secret
  ``secret.name``: an output is secret when its masked value holds ``[secret]`` anywhere
  (Pulumi's secrets, and values holding a secret the run knows), so a partly secret object
  goes to the Secret whole and no secret ever lands in the ConfigMap;
- strings as they are, every other value JSON-encoded;
- each object owned by the Stack (the garbage collector removes it with the Stack), created,
  or updated when it is already the Stack's; an object of the same name that the Stack does
  not own is never overwritten.

After a successful destroy both objects are deleted. This module decides what goes where
(pure); ``pkobatch.runner.report.OutputsWriter`` makes the API calls.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pkobatch.api.constants import API_VERSION, KIND
from pkobatch.api.objects import JSON
from pkobatch.api.run import SECRET_PLACEHOLDER, StackRef
from pkobatch.api.stack.spec import DATA_KEY_PATTERN, ExportOutputs

MAX_KEY_LENGTH: Final = 253


class ExportFailed(Exception):
    """The outputs could not be written (or their objects deleted); the message says why."""


@dataclass(frozen=True)
class ExportTargetObject:
    kind: str  # "ConfigMap" | "Secret"
    name: str

    def describe(self, namespace: str) -> str:
        return f"{self.kind} {namespace}/{self.name}"


class OutputsSink(Protocol):
    """Where exported outputs go (the cluster, in a Job)."""

    def write(self, body: JSON) -> None:
        """Create ``body``, or update the existing object of its name if the Stack owns it."""

    def remove(self, target: ExportTargetObject, stack: StackRef) -> str:
        """Delete ``target`` if the Stack owns it; a note on what happened."""


@dataclass
class ExportPlan:
    config_map: dict[str, str] = field(default_factory=dict)
    secret: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def holds_secret(masked: Any) -> bool:
    """Whether a masked output value is, or contains, ``[secret]``."""
    if isinstance(masked, str):
        return masked == SECRET_PLACEHOLDER
    if isinstance(masked, Mapping):
        return any(holds_secret(item) for item in masked.values())
    if isinstance(masked, list):
        return any(holds_secret(item) for item in masked)
    return False


def encode_output(value: Any) -> str:
    """A string as it is; any other value as JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def secret_strings(value: Any) -> list[str]:
    """What a redactor must know of a secret output: its encoded form and every string in it."""
    found = [encode_output(value)]
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def hidden_values(masked: Any, value: Any) -> list[str]:
    """Every string of ``value`` that ``masked`` (the same value as the result holds it)
    hides behind ``[secret]``: what the run's redactor must learn before the plaintext read
    is used for anything. An output missing from ``masked`` is hidden as a whole."""
    if masked == SECRET_PLACEHOLDER and value != SECRET_PLACEHOLDER:
        return secret_strings(value)
    if isinstance(masked, Mapping) and isinstance(value, Mapping):
        return [
            found
            for key, item in value.items()
            for found in hidden_values(masked.get(key, SECRET_PLACEHOLDER), item)
        ]
    if isinstance(masked, list) and isinstance(value, list) and len(masked) == len(value):
        return [found for pair in zip(masked, value, strict=True) for found in hidden_values(*pair)]
    return [] if masked == value else secret_strings(value)


def plan_export(
    spec: ExportOutputs, masked: Mapping[str, Any], values: Mapping[str, Any]
) -> ExportPlan:
    """Which output goes to which object under which key.

    ``masked`` are the outputs as the result holds them, ``values`` the same outputs read with
    ``--show-secrets``. An output missing from ``masked`` counts as secret.
    """
    plan = ExportPlan()
    chosen = spec.outputs if spec.outputs is not None else sorted(values)
    keys = spec.keys or {}
    used: dict[str, str] = {}
    for name in chosen:
        if name not in values:
            plan.notes.append(f"exportOutputs: the stack has no output {name!r}; not exported")
            continue
        key = keys.get(name, name)
        if not DATA_KEY_PATTERN.fullmatch(key) or len(key) > MAX_KEY_LENGTH:
            plan.notes.append(
                f"exportOutputs: output {name!r} is not a valid ConfigMap/Secret key; "
                f"rename it with exportOutputs.keys.{name}; not exported"
            )
            continue
        if key in used:
            plan.notes.append(
                f"exportOutputs: outputs {used[key]!r} and {name!r} both go to key {key!r}; "
                f"{name!r} is not exported (rename one in exportOutputs.keys)"
            )
            continue
        secret = holds_secret(masked.get(name, SECRET_PLACEHOLDER))
        if secret and spec.secret is None:
            if spec.outputs is not None:
                plan.notes.append(
                    f"exportOutputs: output {name!r} is secret and exportOutputs.secret is "
                    "not set; not exported"
                )
            continue
        if not secret and spec.config_map is None:
            if spec.outputs is not None:
                plan.notes.append(
                    f"exportOutputs: output {name!r} is not secret and exportOutputs.configMap "
                    "is not set; not exported"
                )
            continue
        used[key] = name
        (plan.secret if secret else plan.config_map)[key] = encode_output(values[name])
    return plan


def export_targets(spec: ExportOutputs) -> list[ExportTargetObject]:
    targets = []
    if spec.config_map is not None:
        targets.append(ExportTargetObject("ConfigMap", spec.config_map.name))
    if spec.secret is not None:
        targets.append(ExportTargetObject("Secret", spec.secret.name))
    return targets


def owner_reference(stack: StackRef) -> JSON:
    # No blockOwnerDeletion: setting it needs update on stacks/finalizers, which a run lacks.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": stack.name,
        "uid": stack.uid,
        "controller": True,
    }


def export_objects(spec: ExportOutputs, plan: ExportPlan, stack: StackRef) -> list[JSON]:
    """The ConfigMap and Secret to write, each owned by the Stack."""
    objects: list[JSON] = []
    for target in export_targets(spec):
        metadata: JSON = {
            "name": target.name,
            "namespace": stack.namespace,
            "ownerReferences": [owner_reference(stack)],
        }
        if target.kind == "ConfigMap":
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": metadata,
                    "data": dict(plan.config_map),
                }
            )
        else:
            data = {
                key: base64.b64encode(value.encode("utf-8")).decode("ascii")
                for key, value in plan.secret.items()
            }
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": metadata,
                    "data": data,
                }
            )
    return objects
