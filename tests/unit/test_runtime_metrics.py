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
