"""Every Kubernetes API call pkobatch makes, as (API group, resource, verb).

This list is the source of truth for the RBAC in ``deploy/kustomize``: a unit test renders
the manifests and fails when a role grants less (a call would be forbidden) or more (least
privilege) than these calls need. When you add an API call to the controller or the runner,
append it here in the same change; the test then names the manifest rule to update.

Deliberate limits, documented in ``docs/install.md``:

- Secrets: the controller may only ``get`` them (git credentials for branch polling) and
  ``create`` them (a run's Secret of the secret values a Stack holds inline). It never lists,
  watches, changes or deletes Secrets; run pods receive secret values through the kubelet.
- Leases: the controller uses them only in its own namespace (leader election), so they are
  granted by a Role there, not by the cluster-wide ClusterRole.
- The runner touches Secrets only for ``spec.exportOutputs`` (the Secret of a Stack's secret
  outputs) and ``spec.approval`` (a preview creates the Secret of its saved plan, owned by
  its Job; the approved update reads it), and only in namespaces that bind its ClusterRole
  with a RoleBinding. RBAC cannot limit ``create`` to names with a prefix (``resourceNames``
  does not apply to ``create``), so plans need no new rule: the runner already needs create,
  get, update and delete on Secrets of its namespace for exportOutputs. The controller never
  deletes a plan Secret itself: it deletes the preview Job that owns it.

The group of the core API is the empty string. Subresources are written ``stacks/status``.
"""

from __future__ import annotations

from typing import Final

from pkobatch.api.objects import JSON

ApiCall = tuple[str, str, str]
"""(API group, resource, verb), e.g. ``("batch", "jobs", "create")``."""

CONTROLLER_API_CALLS: Final[tuple[ApiCall, ...]] = (
    # Stacks: reflector (list/watch), finalizer and annotation writes.
    ("pulumi.com", "stacks", "get"),
    ("pulumi.com", "stacks", "list"),
    ("pulumi.com", "stacks", "watch"),
    ("pulumi.com", "stacks", "update"),
    ("pulumi.com", "stacks", "patch"),
    ("pulumi.com", "stacks/status", "get"),
    ("pulumi.com", "stacks/status", "update"),
    ("pulumi.com", "stacks/status", "patch"),
    # Owner references with blockOwnerDeletion need update on the owner's finalizers.
    ("pulumi.com", "stacks/finalizers", "update"),
    # Programs named in spec.programRef (watched; status.artifact kept like PKO's).
    ("pulumi.com", "programs", "get"),
    ("pulumi.com", "programs", "list"),
    ("pulumi.com", "programs", "watch"),
    ("pulumi.com", "programs/status", "patch"),
    # PKO's Workspaces (status kept) and Updates (each run as a Job, status kept, deleted
    # after spec.ttlAfterCompleted; their Jobs are owned by them with blockOwnerDeletion).
    ("auto.pulumi.com", "workspaces", "get"),
    ("auto.pulumi.com", "workspaces", "list"),
    ("auto.pulumi.com", "workspaces", "watch"),
    ("auto.pulumi.com", "workspaces/status", "patch"),
    ("auto.pulumi.com", "updates", "get"),
    ("auto.pulumi.com", "updates", "list"),
    ("auto.pulumi.com", "updates", "watch"),
    ("auto.pulumi.com", "updates", "delete"),
    ("auto.pulumi.com", "updates/status", "patch"),
    ("auto.pulumi.com", "updates/finalizers", "update"),
    # Flux sources named in spec.fluxSource: read-only (watched once a Stack names a kind).
    ("source.toolkit.fluxcd.io", "gitrepositories", "get"),
    ("source.toolkit.fluxcd.io", "gitrepositories", "list"),
    ("source.toolkit.fluxcd.io", "gitrepositories", "watch"),
    ("source.toolkit.fluxcd.io", "ocirepositories", "get"),
    ("source.toolkit.fluxcd.io", "ocirepositories", "list"),
    ("source.toolkit.fluxcd.io", "ocirepositories", "watch"),
    ("source.toolkit.fluxcd.io", "buckets", "get"),
    ("source.toolkit.fluxcd.io", "buckets", "list"),
    ("source.toolkit.fluxcd.io", "buckets", "watch"),
    # One Job per run. Patched: its shard label, when its Stack moves to another controller
    # shard (docs/sharding.md).
    ("batch", "jobs", "get"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("batch", "jobs", "create"),
    ("batch", "jobs", "patch"),
    ("batch", "jobs", "delete"),
    # Result ConfigMaps written by the runner; deleted with history pruning; patched: the
    # shard label, as for Jobs. Created: the snapshot of a run too large for the Job's
    # arguments (owned by its Job).
    ("", "configmaps", "get"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "configmaps", "create"),
    ("", "configmaps", "patch"),
    ("", "configmaps", "delete"),
    # Pods of run Jobs: why a Job failed without a result (OOM, image pull, eviction).
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("", "events", "create"),
    ("", "events", "patch"),
    # The Job controller's FailedCreate Events of a Job that has no pod (missing
    # ServiceAccount, quota, admission): listed per Job by field selector, never watched.
    ("", "events", "list"),
    # Git credentials for branch polling; a run's Secret of inline secret values (owned by its
    # Job). The only Secret access (see the module docstring).
    ("", "secrets", "get"),
    ("", "secrets", "create"),
    # The run cache (PKOBATCH_RUN_CACHE__ENABLED): one claim per namespace, created once and
    # then read from a watch of the claims the controller labels. Never updated or deleted.
    ("", "persistentvolumeclaims", "list"),
    ("", "persistentvolumeclaims", "watch"),
    ("", "persistentvolumeclaims", "create"),
    # Leader election, in the controller's own namespace only.
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    # A Stack in a terminating namespace cannot start new runs.
    ("", "namespaces", "get"),
    # PKOBATCH_NAMESPACE_SELECTOR: the namespaces whose labels match it (their labels only).
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    # Secure metrics (pkobatch.runtime.secure_metrics): a scraper's token and its right to
    # get /metrics.
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
)

# Granted by a Role in the controller's namespace instead of the ClusterRole.
CONTROLLER_OWN_NAMESPACE_RESOURCES: Final[frozenset[tuple[str, str]]] = frozenset(
    {("coordination.k8s.io", "leases")}
)

# Not listed: the run's SelfSubjectAccessReviews (pkobatch.runner.rights), which every
# authenticated user may create (Kubernetes' system:basic-user), so no role grants them.
RUNNER_API_CALLS: Final[tuple[ApiCall, ...]] = (
    # The run reads its own Job (labels and deadline; its UID also comes from the pod's label).
    ("batch", "jobs", "get"),
    # The run's result ConfigMap (named after the Job, immutable); get also reads a large
    # snapshot. Deleted: one of its name that is not the run's own (a forgery, a left-over),
    # before the run creates its own.
    ("", "configmaps", "create"),
    ("", "configmaps", "get"),
    ("", "configmaps", "delete"),
    # spec.exportOutputs: the outputs' ConfigMap and Secret (owned by the Stack), checked to be
    # the Stack's before an update or delete; deleted after a destroy. Secrets in the run's own
    # namespace only (a RoleBinding): a Stack's author can already hand any of them to a run.
    # spec.approval: a preview creates its saved plan's Secret, the approved update gets it.
    ("", "configmaps", "update"),
    ("", "secrets", "create"),
    ("", "secrets", "get"),
    ("", "secrets", "update"),
    ("", "secrets", "delete"),
)


def access_review(group: str, resource: str, verb: str, namespace: str | None) -> JSON:
    """A SelfSubjectAccessReview of ``verb`` on ``resource`` (``name/subresource``) of
    ``group`` in ``namespace`` (None: cluster-wide)."""
    resource_name, _, subresource = resource.partition("/")
    attributes = {"group": group, "resource": resource_name, "verb": verb}
    if subresource:
        attributes["subresource"] = subresource
    if namespace:
        attributes["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
