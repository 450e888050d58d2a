"""The composition root of ``pkobatch controller``: wires the Stack reconciler into the
generic runtime (``pkobatch.runtime``).

``build_manager`` says what is watched (Stacks by the label selector and the controller's
shard, in the namespaces the namespace list and selector give; Jobs and ConfigMaps labelled
managed-by pkobatch, of the same shard; Programs, each of which the main controller also
reconciles (its ``status.artifact``, ``controller.program_artifacts``); the Flux source
kinds Stacks name, while they do; PKO's Workspaces and Updates, which the main controller
runs (``controller.auto_objects``); the run cache claims, when the run cache is enabled)
and which Stack each watched object wakes (``pkobatch.controller.stores``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from pkobatch.api.constants import KIND, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from pkobatch.config import Settings
from pkobatch.controller.cache_transforms import cache_job, cache_result, cache_stack
from pkobatch.controller.reconcile import StackReconciler, build_reconciler
from pkobatch.controller.run_cache import RUN_CACHE_SELECTOR
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import (
    Stores,
    no_stack,
    owning_stack,
    owning_stack_or_update,
    program_and_stacks_naming_it,
    stacks_naming_flux_source,
    stacks_naming_program,
    the_stack,
    the_update,
    the_workspace_and_its_updates,
)
from pkobatch.kube.client import (
    CONFIGMAPS,
    JOBS,
    PERSISTENTVOLUMECLAIMS,
    PROGRAMS,
    STACKS,
    UPDATES,
    WORKSPACES,
    Kube,
)
from pkobatch.runtime.interfaces import Enqueuer, ObjectKey, Reconciler
from pkobatch.runtime.manager import (
    LeaderElection,
    Manager,
    ManagerOptions,
    QueueEnqueuer,
    Watch,
    exit_on_lost_lease,
)
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.on_demand_watches import OnDemandWatches
from pkobatch.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

# PKO's controller name, so PKO's dashboards select pkobatch's series (the runtime's
# ``controller`` label).
CONTROLLER_NAME: Final = "stack-controller"
MANAGED_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
ReconcilerFactory = Callable[[Kube, Stores, Settings, StackMetrics, Enqueuer], Reconciler]
"""``build_reconciler(kube, stores, settings, metrics, enqueuer) -> Reconciler``."""


def manager_options(settings: Settings) -> ManagerOptions:
    election = settings.leader_election
    return ManagerOptions(
        kind=KIND,
        namespaces=settings.namespaces,
        namespace_filter=settings.namespace_filter,
        workers=settings.workers,
        leader_election=(
            LeaderElection(
                lease_name=settings.lease_name,
                lease_namespace=election.lease_namespace,
                lease_duration=election.lease_duration.total_seconds(),
                renew_deadline=election.renew_deadline.total_seconds(),
                retry_period=election.retry_period.total_seconds(),
            )
            if election.enabled
            else None
        ),
        health_addr=settings.health_addr,
        metrics_addr=settings.metrics_addr,
        metrics_secure=settings.metrics_secure,
        metrics_cert_dir=settings.metrics_cert_dir,
    )


def build_manager(
    kube: Kube,
    settings: Settings,
    metrics: Metrics,
    reconciler_factory: ReconcilerFactory = build_reconciler,
    *,
    identity: str | None = None,
    on_lost_lease: Callable[[], None] = exit_on_lost_lease,
    read_timeout: float = 90.0,
) -> Manager:
    """The Stack controller on the runtime: stores, watches, the reconciler
    ``reconciler_factory`` builds, its metrics."""
    queue: WorkQueue[ObjectKey] = WorkQueue(metrics=metrics.queue_hooks())
    stores = Stores.empty()
    flux_sources = OnDemandWatches(
        kube,
        [*settings.namespaces] or [None],
        stacks_naming_flux_source(stores.stacks),
        queue.add,
        metrics=metrics,
        read_timeout=read_timeout,
    )
    stores.flux_sources = flux_sources
    stack_metrics = StackMetrics(metrics.registry)
    reconciler = reconciler_factory(kube, stores, settings, stack_metrics, QueueEnqueuer(queue))
    # The transforms keep only what the controller reads (``controller.cache_transforms``).
    # A shard's Jobs and results carry its label: each controller caches only its share.
    children = ",".join(part for part in (MANAGED_SELECTOR, settings.shard_selector) if part)
    # Every key is a cached Stack's, so the Stacks' resync covers them all.
    # The echoes of the Stack reconciler's own writes, and a run's start, wake nothing
    # (``controller.echoes``).
    own_writes = reconciler.own_writes if isinstance(reconciler, StackReconciler) else None
    # PKO's Workspaces and Updates are the main controller's (a shard runs only Stacks);
    # their Jobs and results wake them too.
    owner_of_run = (
        owning_stack(stores.stacks)
        if settings.shard
        else owning_stack_or_update(stores.stacks, stores.updates)
    )
    watches = [
        Watch(
            STACKS,
            stores.stacks,
            the_stack,
            settings.stack_selector,
            cache_stack,
            echo=own_writes.echoed_stack if own_writes else None,
        ),
        Watch(
            JOBS,
            stores.jobs,
            owner_of_run,
            children,
            cache_job,
            resync=False,
            echo=reconciler.echoed_job if isinstance(reconciler, StackReconciler) else None,
        ),
        Watch(
            CONFIGMAPS,
            stores.configmaps,
            owner_of_run,
            children,
            cache_result,
            resync=False,
        ),
        # The main controller keeps every Program's status.artifact (a shard only wakes its
        # Stacks: ``controller.program_artifacts``); a resync rechecks them, writing nothing
        # when they are current.
        Watch(
            PROGRAMS,
            stores.programs,
            program_and_stacks_naming_it(stores.stacks)
            if not settings.shard
            else stacks_naming_program(stores.stacks),
            resync=not settings.shard,
        ),
    ]
    # Helm installs the CRDs of its crds/ directory only at install time: after an upgrade
    # without them, the rest of the controller must still run.
    if not settings.shard and kube.serves(WORKSPACES) and kube.serves(UPDATES):
        watches += [
            Watch(WORKSPACES, stores.workspaces, the_workspace_and_its_updates(stores.updates)),
            Watch(UPDATES, stores.updates, the_update),
        ]
    elif not settings.shard:
        log.warning(
            "PKO's Workspace and Update CRDs (%s) are not installed: Workspaces and Updates are "
            "not run. Apply crds/ (kubectl apply -k crds/) and restart the controller",
            WORKSPACES.api_version,
        )
    if settings.run_cache.enabled:
        # The claims of every shard's runs: a namespace has one, whoever created it.
        watches.append(
            Watch(
                PERSISTENTVOLUMECLAIMS,
                stores.run_caches,
                no_stack,
                RUN_CACHE_SELECTOR,
                resync=False,
            )
        )
    manager = Manager(
        kube,
        queue,
        reconciler,
        watches,
        manager_options(settings),
        metrics=metrics,
        also_stop=[flux_sources],
        identity=identity,
        on_lost_lease=on_lost_lease,
        resync_period=settings.resync_period.total_seconds(),
        read_timeout=read_timeout,
    )
    # Stacks of namespaces the controller does not reconcile are cached but not reported.
    stack_metrics.track_stores(stores, manager.in_scope)
    if isinstance(reconciler, StackReconciler):
        reconciler.scope_to(manager.in_scope)
    return manager
