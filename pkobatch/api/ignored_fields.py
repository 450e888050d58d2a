"""PKO fields pkobatch accepts but ignores, each with the reason.

Most exist only for PKO's long-lived workspace pod (StatefulSet, gRPC Service, Workspace
and Update objects), which pkobatch replaces with one Job per run. The controller reports
the ones a Stack uses in an Event; docs/migration.md lists them all (a test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from pkobatch.api.stack.spec import StackSpec


class NoopField(NamedTuple):
    path: str
    reason: str


_FROM_STACK: Final = "pkobatch derives it from the Stack's own fields"

NOOP_FIELDS: Final[tuple[NoopField, ...]] = (
    NoopField(
        "spec.workspaceReclaimPolicy",
        "there is no long-lived workspace to keep or delete: every run is a Job that ends",
    ),
    NoopField(
        "spec.retryOnUpdateConflict",
        "ignored by PKO v2 too: a 409 update conflict is retried with the normal backoff",
    ),
    NoopField(
        "spec.expectNoRefreshChanges",
        "ignored by PKO v2 too; use updateTemplate.spec.expectNoChanges",
    ),
    NoopField(
        "spec.workspaceTemplate.spec.serviceTemplate",
        "there is no workspace Service: the controller does not call into the run's pod",
    ),
    NoopField("spec.workspaceTemplate.spec.git", f"{_FROM_STACK} (projectRepo, branch, ...)"),
    NoopField("spec.workspaceTemplate.spec.flux", f"{_FROM_STACK} (fluxSource)"),
    NoopField("spec.workspaceTemplate.spec.stacks", f"{_FROM_STACK} (stack, config, ...)"),
    NoopField("spec.workspaceTemplate.spec.projectInfo", f"{_FROM_STACK} (status.projectInfo)"),
    NoopField(
        "spec.updateTemplate.spec.workspaceName",
        "a Stack runs against no Workspace object: the Stack itself says what to run",
    ),
    NoopField("spec.updateTemplate.spec.stackName", "it is always spec.stack"),
    NoopField("spec.updateTemplate.spec.type", "the controller decides the operation of a run"),
)


def _lookup(manifest: Mapping[str, Any], path: str) -> bool:
    node: Any = {"spec": manifest}
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return node is not None


def noop_fields_in_use(spec: StackSpec) -> list[NoopField]:
    """The no-op fields this spec sets (for an Event telling the user they are ignored)."""
    manifest = spec.to_manifest()
    return [noop for noop in NOOP_FIELDS if _lookup(manifest, noop.path)]
