"""The runtime's metrics: controller-runtime's names under the controller name given, and the
request hook."""

from __future__ import annotations

from pkobatch.runtime.metrics import Metrics


def test_controller_label_is_the_name_given() -> None:
    metrics = Metrics("stack-controller")
    metrics.reconcile_finished("success", 0.1)
    assert (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_total",
            {"controller": "stack-controller", "result": "success"},
        )
        == 1.0
    )
    text = metrics.exposition()[1].decode()
    assert "controller_runtime_reconcile_time_seconds_bucket" in text
    assert "process_resident_memory_bytes" in text


def test_requests_are_counted_by_code_method_and_host() -> None:
    metrics = Metrics("stack-controller")
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
    metrics = Metrics("stack-controller")
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
