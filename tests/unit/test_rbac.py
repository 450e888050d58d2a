"""The API call list in pkobatch/kube/rbac.py is well-formed and keeps its documented limits.

The manifests are checked against this list in test_kustomize.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from pkobatch.api.constants import FLUX_SOURCE_KINDS
from pkobatch.controller.stores import flux_source_resource
from pkobatch.kube import client
from pkobatch.kube.rbac import (
    CONTROLLER_API_CALLS,
    CONTROLLER_OWN_NAMESPACE_RESOURCES,
    RUNNER_API_CALLS,
    ApiCall,
)

KUBERNETES_VERBS = {
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
}
# The Flux sources a Stack may name by default (the controller watches them on demand).
FLUX_SOURCES = {
    (resource.group, resource.plural) for resource in map(flux_source_resource, FLUX_SOURCE_KINDS)
}
KNOWN_RESOURCES = {
    (value.group, value.plural)
    for value in vars(client).values()
    if isinstance(value, client.Resource)
} | FLUX_SOURCES
CALL_LISTS = {"controller": CONTROLLER_API_CALLS, "runner": RUNNER_API_CALLS}


@pytest.mark.parametrize("owner", sorted(CALL_LISTS))
def test_no_call_is_listed_twice(owner: str) -> None:
    counts = Counter(CALL_LISTS[owner])
    assert [call for call, n in counts.items() if n > 1] == []


@pytest.mark.parametrize("owner", sorted(CALL_LISTS))
def test_every_call_uses_a_kubernetes_verb(owner: str) -> None:
    assert [call for call in CALL_LISTS[owner] if call[2] not in KUBERNETES_VERBS] == []


@pytest.mark.parametrize("owner", sorted(CALL_LISTS))
def test_every_call_names_a_resource_pkobatch_kube_defines(owner: str) -> None:
    """Catches typos such as "configmap" or group "core" (the core group is "")."""

    def base(call: ApiCall) -> tuple[str, str]:
        return call[0], call[1].split("/")[0]

    unknown = [call for call in CALL_LISTS[owner] if base(call) not in KNOWN_RESOURCES]
    assert unknown == []


def test_the_controller_may_read_the_flux_source_kinds_it_accepts_by_default() -> None:
    granted = {
        (group, resource): {v for g, r, v in CONTROLLER_API_CALLS if (g, r) == (group, resource)}
        for group, resource, _ in CONTROLLER_API_CALLS
        if group == "source.toolkit.fluxcd.io"
    }
    assert granted == {source: {"get", "list", "watch"} for source in FLUX_SOURCES}


def test_controller_reads_secrets_only_by_name() -> None:
    """The documented exceptions: `get` for git credentials, `create` for a run's Secret of
    inline secret values; never list, watch, change or delete Secrets."""
    secret_verbs = {verb for group, resource, verb in CONTROLLER_API_CALLS if resource == "secrets"}
    assert secret_verbs == {"get", "create"}


def test_runner_touches_no_stacks_and_secrets_only_to_export_outputs() -> None:
    """spec.exportOutputs writes one Secret (checked to be the Stack's before an update or a
    delete); a run never lists or watches Secrets and never touches a Stack."""
    resources = {resource for _, resource, _ in RUNNER_API_CALLS}
    assert resources.isdisjoint({"stacks", "stacks/status"})
    secret_verbs = {verb for _, resource, verb in RUNNER_API_CALLS if resource == "secrets"}
    assert secret_verbs == {"create", "get", "update", "delete"}


def test_own_namespace_resources_are_controller_calls() -> None:
    called = {(group, resource) for group, resource, _ in CONTROLLER_API_CALLS}
    assert called >= CONTROLLER_OWN_NAMESPACE_RESOURCES
