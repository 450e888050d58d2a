"""Namespaces selected by label (``PKOBATCH_NAMESPACE_SELECTOR``, docs/install.md#watched-
namespaces) on the real control plane: the controller, under the RBAC of deploy/kustomize/base,
watching every namespace, reconciles only the Stacks of namespaces whose labels match; a
namespace that gains the label is picked up, one that loses it is left alone.

A reconciled Stack shows it in its status (suspended Stacks: ``Ready`` with reason
``Suspended``, no Job needed); one never reconciled has no status and no finalizer. Changes
of one kind reach the controller in order on one watch, so a later Stack (or Namespace) that
is reconciled proves the controller has taken every earlier change of that kind.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    delete_namespace,
    stack_jobs,
    wait_stack,
)

from pkobatch.api.constants import FINALIZER
from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import NAMESPACES, STACKS, Kube

pytestmark = pytest.mark.timeout(600)
JSON = dict[str, Any]
LABEL = "pkobatch-test/selected"


def suspended(kube: Kube, namespace: str, name: str) -> None:
    apply_stack(kube, namespace, name, {"stack": "dev", "suspend": True})


def wait_reconciled(kube: Kube, namespace: str, name: str) -> None:
    wait_stack(
        kube,
        namespace,
        name,
        lambda s: condition(s, "Ready").get("reason") == "Suspended",
        timeout=120,
        what=f"the controller to reconcile Stack {namespace}/{name}",
    )


def untouched(kube: Kube, namespace: str, name: str) -> bool:
    stack = kube.get(STACKS, name, namespace)
    return not stack.get("status") and FINALIZER not in (stack["metadata"].get("finalizers") or [])


def label(kube: Kube, namespace: str, value: str | None) -> None:
    kube.merge_patch(NAMESPACES, namespace, {"metadata": {"labels": {LABEL: value}}})


@pytest.fixture
def more_namespaces(kube: Kube, namespace: str) -> Iterator[list[str]]:
    """Two namespaces besides the test's, deleted at the end like the test's own."""
    names = [f"{namespace}-{suffix}"[:63] for suffix in ("b", "c")]
    for name in names:
        kube.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
    try:
        yield names
    finally:
        for name in names:
            delete_namespace(kube, name)


def test_only_stacks_of_namespaces_with_matching_labels_are_reconciled(
    cluster: Any,
    kube: Kube,
    namespace: str,
    more_namespaces: list[str],
    tmp_path: Path,
    controller_rbac: None,
) -> None:
    token = secrets.token_hex(4)
    a, (b, c) = namespace, more_namespaces
    label(kube, a, token)
    controller = ControllerProcess(
        cluster, "", tmp_path / "controller", {"PKOBATCH_NAMESPACE_SELECTOR": f"{LABEL}={token}"}
    )
    controller.start()
    try:
        suspended(kube, b, "s")
        suspended(kube, a, "s")
        wait_reconciled(kube, a, "s")
        assert untouched(kube, b, "s")

        # B gains the label: its Stack, unchanged since, is reconciled.
        label(kube, b, token)
        wait_reconciled(kube, b, "s")

        # A loses it. C, whose Stack already exists, gains it afterwards: once C's Stack is
        # reconciled, the controller has seen A's change too (one Namespace watch).
        suspended(kube, c, "s")
        label(kube, a, None)
        label(kube, c, token)
        wait_reconciled(kube, c, "s")
        # A new Stack in A is left alone; one in B, created after it, is reconciled.
        suspended(kube, a, "late")
        suspended(kube, b, "barrier")
        wait_reconciled(kube, b, "barrier")
        assert untouched(kube, a, "late")
        # Nothing of A was deleted or changed: its first Stack keeps its status and finalizer.
        first = kube.get(STACKS, "s", a)
        assert condition(first, "Ready").get("reason") == "Suspended"
        assert FINALIZER in first["metadata"]["finalizers"]
        log = controller.log_text()
        assert f"namespace {b} selected" in log
        assert f"namespace {a} no longer selected" in log
        # A's Stacks are cached but not reported: B's two and C's one are.
        scraped = controller.scrape()
        assert f'name="barrier",namespace="{b}"' in scraped
        assert f'namespace="{a}"' not in scraped
        assert controller.metric("stacks_active") == 3.0
    finally:
        controller.stop()


def test_a_run_of_a_namespace_that_leaves_the_selector_frees_its_run_slot(
    cluster: Any,
    kube: Kube,
    namespace: str,
    more_namespaces: list[str],
    tmp_path: Path,
    controller_rbac: None,
) -> None:
    """One run slot (``PKOBATCH_MAX_ACTIVE_JOBS=1``). A's Job holds it (no node here: its pod
    never runs, so the Job stays active); B's Stack waits for it. When A loses its label,
    nothing here will ever see A's Job end, so its slot is released and B's run starts."""
    token = secrets.token_hex(4)
    a, (b, _) = namespace, more_namespaces
    for selected_namespace in (a, b):
        label(kube, selected_namespace, token)
        bind_runner(kube, selected_namespace)
    controller = ControllerProcess(
        cluster,
        "",
        tmp_path / "controller",
        {"PKOBATCH_NAMESPACE_SELECTOR": f"{LABEL}={token}", "PKOBATCH_MAX_ACTIVE_JOBS": "1"},
    )
    controller.start()
    try:
        apply_stack(kube, a, "first", {"stack": "dev"})
        wait_until(lambda: bool(stack_jobs(kube, a, "first")), timeout=120, what="A's Job")
        apply_stack(kube, b, "second", {"stack": "dev"})
        wait_stack(
            kube,
            b,
            "second",
            lambda s: "waiting for a free run slot" in str(s.get("status")),
            timeout=120,
            what="B's Stack to wait for the run slot A's Job holds",
        )
        assert stack_jobs(kube, b, "second") == []

        label(kube, a, None)
        wait_until(
            lambda: bool(stack_jobs(kube, b, "second")),
            timeout=120,
            what="B's Job, once A's namespace left the selector",
        )
        # A's Job is left alone: another controller may own that namespace now.
        assert len(stack_jobs(kube, a, "first")) == 1
    finally:
        controller.stop()
