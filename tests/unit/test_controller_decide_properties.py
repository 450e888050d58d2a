"""``decide`` never fails for any spec the CRD admits (issue 11: huge integers wedged Stacks).

Specs are generated from the generated CRD's own schema (types, enums, minimum/maximum), so
a field added to the models is covered without touching this file. Strings the controller
interprets (cron, time zone, durations, git source) are drawn mostly from meaningful values:
random text would nearly always stop at validation, far from the time arithmetic that
overflowed. Each spec meets a random history (no run yet, a success, a failure with any
failure count, a deletion) at a random time.

``decide`` itself turns an exception into ``Stalled/ReconcileError`` (``Decision.error``), so the
property checked is stronger than "does not raise": planning never needed that fallback.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pkobatch.api.constants import FINALIZER, RECONCILE_REQUEST_ANNOTATION
from pkobatch.api.crd import generate_crd
from pkobatch.api.messages import MAX_MESSAGE_CHARS
from pkobatch.config import Settings
from pkobatch.controller.decide import decide
from pkobatch.controller.decision import Observed, SourceHead
from pkobatch.controller.job_builder import builtin_template

JSON = dict[str, Any]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SHA1, SHA2 = "1" * 40, "2" * 40
SPEC_SCHEMA: JSON = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
    "properties"
]["spec"]
TEMPLATE = builtin_template()

CRONS = st.sampled_from(["0 3 * * *", "H * * * *", "*/5 * * * *", "* * * * *", "0 0 31 2 *"])
DURATIONS = st.sampled_from(
    ["1h", "0s", "90s", "-5m", "8760h", "99999999999999h", "9" * 40, "1e400", "h"]
)
MEANINGFUL: dict[str, st.SearchStrategy[Any]] = {
    "spec.stack": st.sampled_from(["dev", "org/project/dev", ""]),
    "spec.projectRepo": st.sampled_from(["https://git.example/app.git", ""]),
    "spec.branch": st.sampled_from(["main", "refs/heads/release", ""]),
    "spec.commit": st.sampled_from([SHA1, "1111111", ""]),
    "spec.schedule": CRONS,
    "spec.driftDetection.schedule": CRONS,
    "spec.timeZone": st.sampled_from(["UTC", "Europe/Berlin", "Pacific/Kiritimati"]),
    "spec.prerequisites[].name": st.sampled_from(["base", "other"]),
    "spec.prerequisites[].requirement.succeededWithinDuration": DURATIONS,
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(INT64_MIN, INT64_MAX) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def integers(node: JSON) -> st.SearchStrategy[int]:
    low, high = node.get("minimum", INT64_MIN), node.get("maximum", INT64_MAX)
    edges = [v for v in (-1, 0, 1, 3, 9, 10, 59, 60, 86400) if low <= v <= high]
    return st.sampled_from([low, high]) | st.sampled_from(edges) | st.integers(low, high)


def from_schema(node: JSON, path: str) -> st.SearchStrategy[Any]:
    """Values the API server admits for ``node`` (CEL rules aside: a superset is stronger)."""
    if path in MEANINGFUL:
        return MEANINGFUL[path] | st.text(max_size=6)
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "integer":
        return integers(node)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(max_size=10)
    if kind == "array":
        return st.lists(from_schema(node["items"], f"{path}[]"), max_size=3)
    if kind == "object" and "properties" in node:
        properties = node["properties"]
        required = set(node.get("required") or ())
        return st.fixed_dictionaries(
            {k: from_schema(v, f"{path}.{k}") for k, v in properties.items() if k in required},
            optional={
                k: from_schema(v, f"{path}.{k}") for k, v in properties.items() if k not in required
            },
        )
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        values = from_schema(node["additionalProperties"], f"{path}.*")
        return st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=3)
    if kind == "object":
        return st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3)
    return JSON_VALUES


def valid_spec_with_random_timing() -> st.SearchStrategy[JSON]:
    """A runnable git Stack whose timing fields (and schedules) are anything admitted."""
    properties = SPEC_SCHEMA["properties"]
    timing = {
        name: from_schema(properties[name], f"spec.{name}")
        for name in (
            "resyncFrequencySeconds",
            "retryMaxBackoffDurationSeconds",
            "timeoutSeconds",
            "continueResyncOnCommitMatch",
            "schedule",
            "driftDetection",
            "prerequisites",
            "destroyOnFinalize",
            "preview",
            "updateTemplate",
            "workspaceTemplate",
        )
    }
    base = {"stack": "dev", "projectRepo": "https://git.example/app.git", "branch": "main"}
    return st.fixed_dictionaries({}, optional=timing).map(lambda extra: {**base, **extra})


@st.composite
def histories(draw: st.DrawFn) -> tuple[JSON, JSON]:
    """(metadata changes, status) of a Stack at some point of its life."""
    generation = draw(st.integers(1, 5))
    request = draw(st.sampled_from(["", "r1"]))
    at = START - timedelta(seconds=draw(st.integers(0, 400 * 86400)))
    last: JSON | None = draw(
        st.none()
        | st.fixed_dictionaries(
            {
                # Mostly the current generation and request: the failure-count paths.
                "generation": st.sampled_from([generation, generation, generation - 1]),
                "reconcileRequest": st.sampled_from([request, request, "old"]),
                "name": st.just("app-up-0123456789"),
                "type": st.sampled_from(["up", "preview", "destroy"]),
                "state": st.sampled_from(["succeeded", "failed"]),
                "message": st.text(max_size=20),
                "lastAttemptedCommit": st.sampled_from([SHA1, SHA2, ""]),
                "lastSuccessfulCommit": st.sampled_from([SHA1, ""]),
                "lastResyncTime": st.just(at.strftime("%Y-%m-%dT%H:%M:%SZ")),
                "failures": st.sampled_from([0, 1, 2, 3]) | st.integers(0, 60),
            }
        )
    )
    meta: JSON = {"generation": generation}
    if request:
        meta["annotations"] = {RECONCILE_REQUEST_ANNOTATION: request}
    if draw(st.integers(0, 4)) == 0:
        meta["deletionTimestamp"] = START.strftime("%Y-%m-%dT%H:%M:%SZ")
    return meta, ({"lastUpdate": last} if last else {})


def observed(spec: JSON, history: tuple[JSON, JSON], head: SourceHead, seconds: int) -> Observed:
    meta, status = history
    stack = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "metadata": {
            "name": "app",
            "namespace": "team",
            "uid": "stack-uid",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "finalizers": [FINALIZER],
            "annotations": {},
            **meta,
        },
        "spec": spec,
        "status": status,
    }
    base = {
        "metadata": {"name": "base", "generation": 1},
        "status": {
            "lastUpdate": {
                "state": "succeeded",
                "generation": 1,
                "lastResyncTime": "2025-06-01T00:00:00Z",
            }
        },
    }
    return Observed(
        stack=stack,
        jobs=[],
        results={},
        now=START + timedelta(seconds=seconds),
        source=head,
        prerequisites={"base": base, "other": None},
    )


HEADS = st.sampled_from(
    [SourceHead(commit=SHA1), SourceHead(commit=SHA2), SourceHead(), SourceHead(error="gone")]
)
CHECKS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CHECKS
@given(
    # Anything admitted (mostly stopped by validation), and runnable Stacks with any timing.
    spec=from_schema(SPEC_SCHEMA, "spec") | valid_spec_with_random_timing(),
    history=histories(),
    head=HEADS,
    seconds=st.integers(0, 10**7),
)
def test_decide_never_fails_for_any_admitted_spec(
    spec: JSON, history: tuple[JSON, JSON], head: SourceHead, seconds: int
) -> None:
    result = decide(observed(spec, history, head, seconds), Settings(), TEMPLATE)
    assert not result.error, result.error
    json.dumps(result.status)
    for condition in (result.status or {}).get("conditions") or ():
        assert len(condition["message"]) <= MAX_MESSAGE_CHARS
    assert all(len(event.message) <= MAX_MESSAGE_CHARS for event in result.events)
    if result.requeue_after is not None:
        assert START + timedelta(seconds=result.requeue_after) > START
