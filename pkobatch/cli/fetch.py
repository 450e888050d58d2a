"""Reading Stacks and what belongs to them (runs, pods, Events) from the API server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import click
from click.shell_completion import CompletionItem

from pkobatch.api.constants import MANAGED_BY_LABEL, MANAGED_BY_VALUE, STACK_LABEL
from pkobatch.api.objects import JSON
from pkobatch.cli.runs import RunRecord, build_runs
from pkobatch.cli.session import (
    CRD_MISSING_MESSAGE,
    CommandFailed,
    GlobalOptions,
    Session,
    crd_missing,
)
from pkobatch.kube.client import (
    CONFIGMAPS,
    CORE_EVENTS,
    JOBS,
    PODS,
    STACKS,
    Gone,
    Kube,
    KubeError,
    NotFound,
    Resource,
    WatchEvent,
)

# The Job controller labels its pods with the Job's name (both spellings since 1.27).
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"


def not_found(session: Session, name: str, namespace: str) -> CommandFailed:
    if crd_missing(session.kube):
        return CommandFailed(CRD_MISSING_MESSAGE)
    return CommandFailed(
        f'stack "{name}" not found in namespace "{namespace}" '
        "(list them with `pkobatch get`, or pass -n NAMESPACE)"
    )


def get_stack(session: Session, name: str) -> JSON:
    return get_stack_in(session, session.namespace, name)


def get_stack_in(session: Session, namespace: str, name: str) -> JSON:
    try:
        return session.kube.get(STACKS, name, namespace)
    except NotFound:
        raise not_found(session, name, namespace) from None


def list_stacks(session: Session, label_selector: str | None = None) -> list[JSON]:
    items, _ = session.kube.list_objects(
        STACKS, session.list_namespace, label_selector=label_selector or None
    )
    return sorted(items, key=object_key)


def object_key(obj: JSON) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def runs_selector(stack_name: str) -> str:
    # Stack names are at most 42 characters (CRD rule), so the label value is the name.
    return f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{STACK_LABEL}={stack_name}"


def list_runs(kube: Kube, namespace: str, stack_name: str) -> list[RunRecord]:
    selector = runs_selector(stack_name)
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=selector)
    configmaps, _ = kube.list_objects(CONFIGMAPS, namespace, label_selector=selector)
    return build_runs(jobs, configmaps)


def run_pods(kube: Kube, namespace: str, job_name: str) -> list[JSON]:
    """Pods of a run's Job, newest first."""
    pods, _ = kube.list_objects(PODS, namespace, label_selector=f"{JOB_NAME_LABEL}={job_name}")
    return sorted(
        pods,
        key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""),
        reverse=True,
    )


def stack_events(kube: Kube, stack: JSON) -> list[JSON]:
    """Events of the Stack, of its run Jobs and of their pods."""
    metadata = stack.get("metadata") or {}
    namespace, name = str(metadata.get("namespace")), str(metadata.get("name"))
    events, _ = kube.list_objects(
        CORE_EVENTS,
        namespace,
        field_selector=f"involvedObject.kind=Stack,involvedObject.name={name}",
    )
    related = related_objects(kube, namespace, name)
    for kind in ("Job", "Pod"):
        names = related[kind]
        if names:
            more, _ = kube.list_objects(
                CORE_EVENTS, namespace, field_selector=f"involvedObject.kind={kind}"
            )
            events += [e for e in more if (e.get("involvedObject") or {}).get("name") in names]
    return events


def related_objects(kube: Kube, namespace: str, stack_name: str) -> dict[str, set[str]]:
    """Names of the Stack's run Jobs and pods (both carry the Stack label)."""
    selector = runs_selector(stack_name)
    jobs, _ = kube.list_objects(JOBS, namespace, label_selector=selector)
    pods, _ = kube.list_objects(PODS, namespace, label_selector=selector)
    return {
        "Job": {str((j.get("metadata") or {}).get("name")) for j in jobs},
        "Pod": {str((p.get("metadata") or {}).get("name")) for p in pods},
    }


def complete_stack_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Shell completion of Stack names in the namespace the command line names so far."""
    session = Session(GlobalOptions.from_context(ctx))
    try:
        items, _ = session.kube.list_objects(STACKS, session.namespace)
    except KubeError:
        return []
    finally:
        session.close()
    names = sorted(str((item.get("metadata") or {}).get("name") or "") for item in items)
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def follow_changes(
    session: Session,
    resource: Resource,
    namespace: str | None,
    resource_version: str,
    *,
    relist: Callable[[], str],
    on_event: Callable[[WatchEvent], None],
    deadline: float | None,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> None:
    """Watch ``resource`` from ``resource_version`` until ``deadline`` (monotonic; None:
    until interrupted), calling ``on_event`` for every change (not for bookmarks). When the
    server answers that the version has expired (410), ``relist()`` catches up and returns
    the version to watch from."""
    while deadline is None or time.monotonic() < deadline:
        window = 300 if deadline is None else max(1, int(deadline - time.monotonic()))
        try:
            stream = session.kube.watch(
                resource,
                namespace,
                resource_version=resource_version,
                label_selector=label_selector,
                field_selector=field_selector,
                timeout_seconds=window,
            )
            for event in stream:
                version = (event.object.get("metadata") or {}).get("resourceVersion")
                resource_version = str(version or resource_version)
                if event.type != "BOOKMARK":
                    on_event(event)
                if deadline is not None and time.monotonic() >= deadline:
                    stream.stop()
        except Gone:
            resource_version = relist()
