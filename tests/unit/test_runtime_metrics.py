"""Metrics computed at scrape time from the stores, and the request hook."""

from __future__ import annotations

from typing import Any

from pkobatch.runtime.interfaces import Stores
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.store import Store


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
    metrics = Metrics()
    stores = Stores(stacks=Store(), jobs=Store(), configmaps=Store(), programs=Store())
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
    metrics = Metrics()
    stores = Stores(stacks=Store(), jobs=Store(), configmaps=Store(), programs=Store())
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
    metrics = Metrics()
    waiting = [0]
    metrics.track_admission(lambda: waiting[0], 7)
    assert metrics.registry.get_sample_value("pkobatch_jobs_max_active") == 7.0
    assert metrics.registry.get_sample_value("pkobatch_jobs_waiting") == 0.0
    waiting[0] = 4
    assert metrics.registry.get_sample_value("pkobatch_jobs_waiting") == 4.0


def test_controller_label_is_pkos_stack_controller() -> None:
    metrics = Metrics()
    metrics.reconcile_finished("success", 0.1)
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_total",
            {"controller": "stack-controller", "result": "success"},
        )
        == 1.0
    )


def test_requests_are_counted_by_code_method_and_host() -> None:
    metrics = Metrics()
    metrics.set_api_server("https://10.0.0.1:6443")
    metrics.request_done("WATCH", "/apis/pulumi.com/v1/stacks", 200)
    metrics.request_done("PUT", "/apis/coordination.k8s.io/v1/leases", 0)
    assert (
        metrics.registry.get_sample_value(
            "rest_client_requests_total", {"code": "200", "method": "GET", "host": "10.0.0.1:6443"}
        )
        == 1.0
    )
    assert (
        metrics.registry.get_sample_value(
            "rest_client_requests_total",
            {"code": "<error>", "method": "PUT", "host": "10.0.0.1:6443"},
        )
        == 1.0
    )


def test_rate_limiter_waits_are_a_histogram_by_verb_and_host() -> None:
    metrics = Metrics()
    metrics.set_api_server("https://10.0.0.1:6443")
    metrics.rate_limiter_waited("WATCH", 0.0)
    metrics.rate_limiter_waited("PATCH", 0.3)
    metrics.rate_limiter_waited("PATCH", 0.2)
    labels = {"verb": "PATCH", "host": "10.0.0.1:6443"}
    sample = metrics.registry.get_sample_value
    assert sample("rest_client_rate_limiter_duration_seconds_count", labels) == 2.0
    assert sample("rest_client_rate_limiter_duration_seconds_sum", labels) == 0.5
    assert (
        sample("rest_client_rate_limiter_duration_seconds_count", {**labels, "verb": "GET"}) == 1.0
    )


def test_operation_metrics_are_preinitialised_and_recorded() -> None:
    metrics = Metrics()
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
    text = metrics.exposition().decode()
    assert "controller_runtime_reconcile_time_seconds_bucket" in text
    assert "process_resident_memory_bytes" in text
