"""The Stack controller's metrics: computed at scrape time from the stores, and recorded
by the reconciler."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import Stores


def stack(name: str, *, ready: str | None, reason: str = "", suspend: bool = False) -> Any:
    status = {"conditions": [{"type": "Ready", "status": ready, "reason": reason}]} if ready else {}
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "spec": {"stack": f"org/{name}/dev", "suspend": suspend},
        "status": status,
    }


def job(name: str, finished: str | None) -> Any:
    conditions = [{"type": finished, "status": "True"}] if finished else []
    return {
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1"},
        "status": {"conditions": conditions},
    }


def test_stack_info_and_active_jobs_follow_the_stores() -> None:
    metrics = StackMetrics(CollectorRegistry())
    stores = Stores.empty()
    metrics.track_stores(stores)
    stores.stacks.upsert(stack("a", ready="True", reason="ProcessingCompleted"))
    stores.stacks.upsert(stack("b", ready=None, suspend=True))
    for name, finished in [("j1", None), ("j2", "Complete"), ("j3", "Failed"), ("j4", None)]:
        stores.jobs.upsert(job(name, finished))
    labels = {
        "namespace": "ns",
        "name": "a",
        "stack": "org/a/dev",
        "ready": "True",
        "reason": "ProcessingCompleted",
        "suspended": "false",
    }
    assert metrics.registry.get_sample_value("pkobatch_stack_info", labels) == 1.0
    labels_b = {**labels, "name": "b", "stack": "org/b/dev", "ready": "Unknown", "reason": ""}
    assert (
        metrics.registry.get_sample_value("pkobatch_stack_info", {**labels_b, "suspended": "true"})
        == 1.0
    )
    assert metrics.registry.get_sample_value("pkobatch_jobs_active") == 2.0
    stores.stacks.delete(stack("a", ready=None))
    assert metrics.registry.get_sample_value("pkobatch_stack_info", labels) is None


def pko_stack(name: str, namespace: str, status: dict[str, Any]) -> Any:
    return {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "spec": {"stack": f"org/{name}/dev"},
        "status": status,
    }


def test_pko_gauges_and_per_stack_health_follow_the_stores() -> None:
    """PKO's stacks_active/stacks_failing/stacks_reconciling with PKO's labels, and the
    per-Stack gauges the alerts read (Stalled with its reason, Drifted, failures in a row)."""
    metrics = StackMetrics(CollectorRegistry())
    stores = Stores.empty()
    metrics.track_stores(stores)
    failing_status = {
        "lastUpdate": {"state": "failed", "failures": 3},
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "NotReadyStalled"},
            {"type": "Stalled", "status": "True", "reason": "UpdateFailed"},
            {"type": "Reconciling", "status": "False", "reason": "StackProcessing"},
        ],
    }
    running_status = {
        "lastUpdate": {"state": "succeeded"},
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "NotReadyInProgress"},
            {"type": "Reconciling", "status": "True", "reason": "StackProcessing"},
            {"type": "Drifted", "status": "True", "reason": "DriftDetected"},
        ],
    }
    stores.stacks.upsert(pko_stack("broken", "team-a", failing_status))
    stores.stacks.upsert(pko_stack("busy", "team-b", running_status))
    stores.stacks.upsert(pko_stack("new", "team-b", {}))
    value = metrics.registry.get_sample_value
    broken = {"namespace": "team-a", "name": "broken"}
    busy = {"namespace": "team-b", "name": "busy"}
    new = {"namespace": "team-b", "name": "new"}
    assert value("stacks_active") == 3.0
    assert value("programs_active") == 0.0
    stores.programs.upsert(
        {
            "kind": "Program",
            "metadata": {"name": "p", "namespace": "team-a", "resourceVersion": "1"},
        }
    )
    assert value("programs_active") == 1.0
    assert [value("stacks_failing", k) for k in (broken, busy, new)] == [1.0, 0.0, 0.0]
    assert [value("stacks_reconciling", k) for k in (broken, busy, new)] == [0.0, 1.0, 0.0]
    assert value("pkobatch_stack_stalled", {**broken, "reason": "UpdateFailed"}) == 1.0
    assert value("pkobatch_stack_stalled", {**busy, "reason": ""}) == 0.0
    assert [value("pkobatch_stack_drifted", k) for k in (broken, busy, new)] == [0.0, 1.0, 0.0]
    assert value("pkobatch_stack_consecutive_failures", broken) == 3.0
    assert value("pkobatch_stack_consecutive_failures", new) == 0.0
    stores.stacks.delete(pko_stack("broken", "team-a", {}))
    assert value("stacks_active") == 2.0
    assert value("stacks_failing", broken) is None


def test_admission_gauges_read_the_waiting_count_at_scrape_time() -> None:
    metrics = StackMetrics(CollectorRegistry())
    waiting = [0]
    metrics.track_admission(lambda: waiting[0], 7)
    assert metrics.registry.get_sample_value("pkobatch_jobs_max_active") == 7.0
    assert metrics.registry.get_sample_value("pkobatch_jobs_waiting") == 0.0
    waiting[0] = 4
    assert metrics.registry.get_sample_value("pkobatch_jobs_waiting") == 4.0


def test_operation_metrics_are_preinitialised_and_recorded() -> None:
    metrics = StackMetrics(CollectorRegistry())
    labels = {"operation": "up", "result": "succeeded"}
    assert metrics.registry.get_sample_value("pkobatch_stack_operations_total", labels) == 0.0
    metrics.operation_finished("up", "succeeded", 42.0)
    assert metrics.registry.get_sample_value("pkobatch_stack_operations_total", labels) == 1.0
    assert (
        metrics.registry.get_sample_value(
            "pkobatch_stack_operation_duration_seconds_sum", {"operation": "up"}
        )
        == 42.0
    )


def test_stacks_and_programs_of_namespaces_out_of_scope_are_not_reported() -> None:
    metrics = StackMetrics(CollectorRegistry())
    stores = Stores.empty()
    metrics.track_stores(stores, lambda namespace: namespace == "selected")
    stores.stacks.upsert(pko_stack("in", "selected", {}))
    stores.stacks.upsert(pko_stack("out", "other", {}))
    for namespace in ("selected", "other"):
        stores.programs.upsert(
            {"kind": "Program", "metadata": {"name": "p", "namespace": namespace}}
        )
    assert metrics.registry.get_sample_value("stacks_active") == 1.0
    assert metrics.registry.get_sample_value("programs_active") == 1.0
    assert (
        metrics.registry.get_sample_value("stacks_failing", {"namespace": "selected", "name": "in"})
        == 0.0
    )
    assert (
        metrics.registry.get_sample_value("stacks_failing", {"namespace": "other", "name": "out"})
        is None
    )
