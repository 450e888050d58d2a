"""The API rights a run needs for the features of its spec, checked before any operation.

A run needs no API rights for its result: when it may not write its result ConfigMap, the
result goes through its pod's termination message (``pkobatch.runner.report``). Two features
write objects with the run's own ServiceAccount and so need rights: ``spec.exportOutputs``
(an ``up`` creates, reads and updates the ConfigMap and Secret it names; a ``destroy`` reads
and deletes them) and ``spec.approval`` (a preview creates its saved plan's Secret; the
approved ``up`` reads it). ``needed_rights`` lists them for a run; ``missing_rights`` asks
the API server about each (a SelfSubjectAccessReview, ``AccessReview``) before the run
checks out its program, so a missing right fails the run before Pulumi changes anything —
never after an update that then could not record its exports — with ``MissingPermission``
naming verb, resource and namespace; the controller stalls the Stack at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pkobatch.api.run import RunSnapshot
from pkobatch.api.stack.spec import StackSpec
from pkobatch.runner.exports import export_targets
from pkobatch.runner.failures import RunFailure

_PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets"}


@dataclass(frozen=True)
class Right:
    verb: str
    # The core API's resource, plural ("configmaps", "secrets").
    resource: str
    namespace: str
    # The feature that needs it, for the message.
    feature: str

    def describe(self) -> str:
        return f"{self.verb} {self.resource} in namespace {self.namespace}"


class AccessReview(Protocol):
    """Asks the API server whether the run may do something (the cluster, in a Job)."""

    def allowed(self, right: Right) -> bool:
        """Whether the run's ServiceAccount has ``right`` (True when the answer is unknown:
        the call itself then tells)."""


def needed_rights(snapshot: RunSnapshot, spec: StackSpec) -> list[Right]:
    """The rights the run's features need, in the order they are used."""
    namespace = snapshot.stack.namespace
    rights: list[Right] = []
    export = spec.export_outputs
    if export is not None and not snapshot.drift_check:
        verbs = {"up": ("create", "get", "update"), "destroy": ("get", "delete")}
        for target in export_targets(export):
            for verb in verbs.get(snapshot.operation, ()):
                rights.append(Right(verb, _PLURALS[target.kind], namespace, "spec.exportOutputs"))
    if snapshot.save_plan is not None:
        rights.append(Right("create", "secrets", namespace, "spec.approval (the saved plan)"))
    if snapshot.apply_plan is not None:
        rights.append(Right("get", "secrets", namespace, "spec.approval (the approved plan)"))
    return list(dict.fromkeys(rights))


def check_rights(rights: list[Right], review: AccessReview | None) -> None:
    """Raise ``MissingPermission`` naming every right of ``rights`` the run lacks."""
    if review is None:
        return
    missing = [right for right in rights if not review.allowed(right)]
    if not missing:
        return
    listed = "; ".join(f"{right.describe()} (for {right.feature})" for right in missing)
    raise RunFailure(
        "MissingPermission",
        f"the run's ServiceAccount may not {listed}; nothing was run. Grant it these "
        "rights — bind the pkobatch-runner ClusterRole in this namespace with a RoleBinding "
        "(docs/install.md) — or drop the feature from the spec",
    )
