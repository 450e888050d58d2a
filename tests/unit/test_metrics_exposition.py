"""The controller's scrape: every metric family with its type and labels, the same in the text
format the controller always served, in OpenMetrics and gzipped (tests/fixtures/monitoring/
metric-families.json holds them as they were when the exposition was negotiated first), and
docs/install.md's metrics table says no more than the exposition has."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from pkobatch.controller.delivery import NotificationMetrics
from pkobatch.controller.stack_metrics import StackMetrics
from pkobatch.controller.stores import Stores
from pkobatch.runtime.metrics import Metrics
from pkobatch.runtime.workqueue import WorkQueue

REPO = Path(__file__).resolve().parents[2]
FAMILIES = REPO / "tests" / "fixtures" / "monitoring" / "metric-families.json"
INSTALL_DOC = REPO / "docs" / "install.md"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# Labels the formats add to samples, not the family's own.
SAMPLE_LABELS = {"le", "quantile"}
# Runtime collectors that differ between interpreters, not the controller's.
RUNTIME_FAMILIES = re.compile(r"^(process_|python_)")

Families = dict[str, dict[str, Any]]


def controller_metrics() -> Metrics:
    """The registry the controller serves, with one Stack and a sample of every labelled
    family, as ``pkobatch.controller.composition`` wires it."""
    metrics = Metrics("stack-controller")
    metrics.set_max_concurrent(4)
    metrics.track_queue(WorkQueue())
    stack_metrics = StackMetrics(metrics.registry)
    stores = Stores.empty()
    stack_metrics.track_stores(stores)
    stack_metrics.track_admission(lambda: 0, 50)
    NotificationMetrics(metrics.registry, lambda: 0)
    stores.stacks.upsert(
        {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"stack": "org/web/dev"},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Done"}]},
        }
    )
    metrics.set_api_server("https://127.0.0.1:6443")
    metrics.set_leader("pkobatch-controller", True)
    metrics.request_done("GET", "/api/v1/configmaps", 200)
    metrics.rate_limiter_waited("GET", 0.0)
    metrics.watch_event("stacks", "ADDED")
    metrics.watch_restarted("stacks", "expired")
    hooks = metrics.queue_hooks()
    hooks.depth(0)
    hooks.added()
    hooks.retried()
    return metrics


def families(parsed: Any) -> Families:
    found: Families = {}
    for family in parsed:
        # The text format gives each counter's and histogram's creation time a gauge of its
        # own; OpenMetrics keeps it in the family.
        if RUNTIME_FAMILIES.match(family.name) or family.name.endswith("_created"):
            continue
        labels = {
            name
            for sample in family.samples
            if not sample.name.endswith("_created")
            for name in sample.labels
            if name not in SAMPLE_LABELS
        }
        found[family.name] = {"type": family.type, "labels": sorted(labels)}
    return found


def scrape(metrics: Metrics, accept: str = "", accept_encoding: str = "") -> tuple[Any, str]:
    headers, body = metrics.exposition(accept, accept_encoding)
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return headers, body.decode()


def test_text_format_is_the_default_and_keeps_every_family() -> None:
    headers, text = scrape(controller_metrics())
    assert headers == {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    assert families(parse_text(text)) == json.loads(FAMILIES.read_text())


def test_openmetrics_when_asked_with_the_same_families() -> None:
    headers, text = scrape(controller_metrics(), OPENMETRICS)
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    assert families(parse_openmetrics(text)) == json.loads(FAMILIES.read_text())


@pytest.mark.parametrize("accept", ["", OPENMETRICS])
def test_gzip_when_the_client_accepts_it(accept: str) -> None:
    metrics = controller_metrics()
    headers, body = metrics.exposition(accept, "gzip, deflate")
    assert headers["Content-Encoding"] == "gzip"
    parse = parse_openmetrics if accept else parse_text
    assert families(parse(gzip.decompress(body).decode())) == json.loads(FAMILIES.read_text())
    assert "Content-Encoding" not in metrics.exposition(accept, "identity")[0]


def documented_metrics() -> dict[str, set[str]]:
    """docs/install.md's metrics table: each metric it names, with the labels it claims
    (``{a, b}`` in the second column; none if it names none)."""
    text = INSTALL_DOC.read_text().split("\n| Metric |", 1)[1].split("\n\n", 1)[0]
    claimed: dict[str, set[str]] = {}
    for names, kind in re.findall(r"^\| (`.+?) \| (.+?) \|", text, flags=re.MULTILINE):
        labels = re.search(r"`\{([a-z_, ]+)\}`", kind)
        for name in re.findall(r"`([a-z_]+)`", names):
            claimed[name] = {label.strip() for label in labels[1].split(",")} if labels else set()
    return claimed


def test_install_doc_claims_only_labels_the_controller_sets() -> None:
    exposed = families(parse_text(scrape(controller_metrics())[1]))
    by_sample_name = {
        f"{name}_total" if family["type"] == "counter" else name: set(family["labels"])
        for name, family in exposed.items()
    }
    claimed = documented_metrics()
    assert len(claimed) >= 30, claimed
    for name, labels in claimed.items():
        assert name in by_sample_name, f"docs/install.md names {name}, which is not exported"
        assert by_sample_name[name] == labels, f"{name}: exported {by_sample_name[name]}"
