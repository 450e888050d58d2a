"""What a Stack's author can make the controller reach, on the real control plane and the
real controller process (docs/security.md): Flux source watches stay bounded by the kinds
the operator allows, and notifications neither go to internal addresses nor tell the author
what answered, and go on counting their attempts across a controller restart."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixture_plugins.receivers import Receiver, hook_secret, pending, receivers
from helpers.controller_harness import (
    CONTROLLER_NAMESPACE,
    CONTROLLER_SA,
    NOTIFICATIONS_ALLOWED_CIDRS,
    ControllerProcess,
    apply_stack,
    condition,
    wait_events,
    wait_stack,
)

from pkobatch.dev.processes import free_port, wait_until
from pkobatch.kube.client import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    STACKS,
    Invalid,
    Kube,
    NotFound,
)

JSON = dict[str, Any]
# The controller may read kind Gadget, whose CRD no one installs: the API server answers 404.
GADGET_RBAC = "pkobatch-tests-gadgets"
# A spec the controller stalls on at once (SpecInvalid): its `stalled` event is notified.
INVALID = {"stack": "dev", "envRefs": {"X": {"type": "Env", "env": {"name": "X"}}}}


def flux_spec(kind: str, api_version: str = "source.toolkit.fluxcd.io/v1") -> JSON:
    return {
        "stack": "dev",
        "fluxSource": {"sourceRef": {"apiVersion": api_version, "kind": kind, "name": "src"}},
    }


def spec_invalid(stack: JSON) -> bool:
    return condition(stack, "Stalled").get("reason") == "SpecInvalid"


@pytest.fixture
def gadget_rbac(kube: Kube, controller_rbac: None) -> Iterator[None]:
    """What an operator adding a kind grants: get, list and watch on its resource."""
    kube.create(
        CLUSTERROLES,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": GADGET_RBAC},
            "rules": [
                {
                    "apiGroups": ["source.toolkit.fluxcd.io"],
                    "resources": ["gadgets"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
    )
    kube.create(
        CLUSTERROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": GADGET_RBAC},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": GADGET_RBAC,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": CONTROLLER_SA,
                    "namespace": CONTROLLER_NAMESPACE,
                }
            ],
        },
    )
    yield
    for resource in (CLUSTERROLEBINDINGS, CLUSTERROLES):
        with contextlib.suppress(NotFound):
            kube.delete(resource, GADGET_RBAC)


@pytest.fixture
def start_controller(
    cluster: Any, namespace: str, tmp_path: Path, controller_rbac: None
) -> Iterator[Callable[..., ControllerProcess]]:
    """``start(**env)``: the real controller for the test's namespace, stopped after it."""
    started: list[ControllerProcess] = []

    def start(**env: str) -> ControllerProcess:
        process = ControllerProcess(
            cluster, namespace, tmp_path / f"controller-{len(started)}", env=env
        )
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()


def idle_threads(controller: ControllerProcess) -> int:
    """The controller's threads with nothing to do: the fewest of a few looks (a scrape of its
    metrics is served on a thread of its own that ends with the answer)."""
    seen: list[int] = []

    def enough() -> bool:
        seen.append(controller.threads())
        return len(seen) >= 10

    wait_until(enough, timeout=30, interval=0.3, what="a look at the controller's threads")
    return min(seen)


def test_flux_source_watches_are_bounded_by_the_kinds_the_operator_allows(
    start_controller: Callable[..., ControllerProcess],
    kube: Kube,
    namespace: str,
    gadget_rbac: None,
) -> None:
    """Issue 26, item 4: 30 Stacks naming made-up kinds took the controller from 20 to 50
    threads that stayed after the Stacks were deleted, retrying `list failed: 404` forever."""
    controller = start_controller(PKOBATCH_EXTRA_FLUX_SOURCE_KINDS="Gadget")
    controller.caught_up()
    baseline = idle_threads(controller)

    # Admission refuses any group but Flux's, and what is no kind name.
    for api_version, kind in (("example.invalid/v1", "Gadget"), ("v1", "Secret")):
        with pytest.raises(
            Invalid, match=re.escape("spec.fluxSource.sourceRef must name a Flux source")
        ):
            apply_stack(kube, namespace, "other-group", flux_spec(kind, api_version))
    with pytest.raises(
        Invalid, match=re.escape("spec.fluxSource.sourceRef.kind is not a kind name")
    ):
        apply_stack(kube, namespace, "not-a-kind", flux_spec("gadgets"))

    # Made-up kinds of Flux's group pass admission; the controller refuses them, watching none.
    made_up = [f"made-up-{index}" for index in range(30)]
    for index, name in enumerate(made_up):
        apply_stack(kube, namespace, name, flux_spec(f"MadeUp{index}"))
    for name in made_up:
        stalled = condition(wait_stack(kube, namespace, name, spec_invalid, timeout=120), "Stalled")
        assert "is not a Flux source kind this controller reads" in stalled["message"]
        assert "(GitRepository, OCIRepository, Bucket, Gadget)" in stalled["message"]
        assert "PKOBATCH_EXTRA_FLUX_SOURCE_KINDS" in stalled["message"]
    controller.caught_up()
    wait_until(
        lambda: controller.threads() <= baseline,
        timeout=60,
        what=f"the controller's threads to stay at {baseline} (no watch of a made-up kind)",
    )
    # A reflector names its resource (madeup<n>s) when it lists, watches or fails.
    assert re.search(r"madeup\d+s", controller.log_text().lower()) is None

    # An allowed kind the server does not serve: the Stack waits and says why; the watch
    # retries with backoff only while a Stack needs it.
    apply_stack(kube, namespace, "gadget", flux_spec("Gadget"))
    waiting = wait_stack(
        kube,
        namespace,
        "gadget",
        lambda s: "cannot list them" in condition(s, "Reconciling").get("message", ""),
        timeout=120,
    )
    message = condition(waiting, "Reconciling")["message"]
    assert condition(waiting, "Reconciling")["reason"] == "WaitingForSource"
    assert "Gadget (source.toolkit.fluxcd.io/v1)" in message and "404" in message
    wait_until(lambda: controller.threads() > baseline, timeout=60, what="the watch of Gadget")

    for name in [*made_up, "gadget"]:
        kube.delete(STACKS, name, namespace)
    wait_until(
        lambda: all(kube.get_or_none(STACKS, n, namespace) is None for n in [*made_up, "gadget"]),
        timeout=180,
        what="the Stacks to be gone",
    )
    wait_until(
        lambda: controller.threads() <= baseline,
        timeout=120,
        what=f"the controller's threads to return to {baseline} (the Gadget watch stopped)",
    )


def stalling_stack_notifying(kube: Kube, namespace: str, urls: dict[str, str]) -> None:
    """Stack "app", stalled at once, notifying a webhook receiver per name of ``urls`` (its
    Secret ``<name>-hook`` holding that URL)."""
    for name, url in urls.items():
        hook_secret(kube, namespace, f"{name}-hook", url)
    apply_stack(kube, namespace, "app", {**INVALID, "notifications": receivers(*urls)})


def notified_failures(kube: Kube, namespace: str, count: int) -> list[str]:
    events = wait_events(
        kube,
        namespace,
        lambda e: e.get("reason") == "NotificationFailed",
        count=count,
        timeout=180,
        what=f"{count} NotificationFailed Event(s)",
    )
    return sorted(str(e.get("note") or "") for e in events)


def test_the_default_sends_no_notification_to_loopback_link_local_or_the_controller(
    start_controller: Callable[..., ControllerProcess],
    kube: Kube,
    namespace: str,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    """Issue 26, item 7: a Stack's author made the controller POST to its own metrics port
    and other internal addresses. By default nothing is sent there, and the author's Event
    reads the same as for a receiver that is down."""
    inbox, port = receivers_on_loopback()
    controller = start_controller(
        **{
            NOTIFICATIONS_ALLOWED_CIDRS: "",
            "PKOBATCH_NOTIFICATIONS__MAX_ATTEMPTS": "2",
            "PKOBATCH_NOTIFICATIONS__BACKOFF_BASE": "1s",
        }
    )
    urls = {
        "inbox": f"http://127.0.0.1:{port}/hook",
        "byname": f"http://localhost:{port}/hook",
        "metrics": f"http://127.0.0.1:{controller.port}/metrics",
        "metadata": "http://169.254.169.254/latest/meta-data/",
    }
    stalling_stack_notifying(kube, namespace, urls)

    notes = notified_failures(kube, namespace, len(urls))
    event = stall_event(notes)
    assert notes == sorted(
        f"notification {event} to receiver {name} failed: delivery failed (attempt 2 of 2)"
        for name in urls
    )
    assert inbox.requests() == []
    log = controller.log_text()
    for name in ("inbox", "metrics"):
        assert f"to receiver {name}: destination refused: 127.0.0.1 is a loopback address" in log
    assert "to receiver byname: destination refused: " in log
    assert "169.254.169.254 is a link-local address" in log
    assert controller.metric("pkobatch_notifications_sent_total") == 0


def stall_event(notes: list[str]) -> str:
    """The one event the notes are about: the Stack's stall."""
    (event,) = {note.split()[1] for note in notes}
    assert event.startswith("stalled/SpecInvalid/")
    return event


def test_failure_events_name_the_receiver_and_a_generic_reason_only(
    start_controller: Callable[..., ControllerProcess],
    kube: Kube,
    namespace: str,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    """Issue 26, item 7: the Events told the author what answered (status codes, TLS
    errors). Now they say which receiver and that delivery failed; the log says why."""
    missing, missing_port = receivers_on_loopback()
    missing.answer = 404
    broken, broken_port = receivers_on_loopback()
    broken.answer = 500
    controller = start_controller(
        PKOBATCH_NOTIFICATIONS__MAX_ATTEMPTS="2", PKOBATCH_NOTIFICATIONS__BACKOFF_BASE="1s"
    )
    closed_port = free_port()
    urls = {
        "missing": f"http://127.0.0.1:{missing_port}/hook",
        "broken": f"http://127.0.0.1:{broken_port}/hook",
        "tls": f"https://127.0.0.1:{broken_port}/hook",
        "closed": f"http://127.0.0.1:{closed_port}/hook",
    }
    stalling_stack_notifying(kube, namespace, urls)

    notes = notified_failures(kube, namespace, len(urls))
    failed = f"notification {stall_event(notes)} to receiver"
    # A 404 is not retried: what the attempt count says of an allowed receiver.
    assert notes == sorted(
        [
            f"{failed} missing failed: delivery failed (attempt 1 of 2)",
            f"{failed} broken failed: delivery failed (attempt 2 of 2)",
            f"{failed} tls failed: delivery failed (attempt 2 of 2)",
            f"{failed} closed failed: delivery failed (attempt 2 of 2)",
        ]
    )
    log = controller.log_text()
    assert "answered HTTP 404" in log and "answered HTTP 500" in log
    assert "SSL" in log and "Connection refused" in log
    assert [r.answered for r in missing.requests()] == [404]
    assert len(broken.requests()) == 2


def test_a_restarted_controller_goes_on_counting_attempts(
    start_controller: Callable[..., ControllerProcess],
    kube: Kube,
    namespace: str,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    """Issue 26, item 7: one event got 5 attempts, the controller restarted, then 8 more,
    and the Event said "8 of 8". The count is in the outbox now, so a restart continues it."""
    broken, port = receivers_on_loopback()
    broken.answer = 500
    settings = {
        "PKOBATCH_NOTIFICATIONS__MAX_ATTEMPTS": "4",
        # Attempt 3 comes 6s after attempt 2: time to kill the controller in between.
        "PKOBATCH_NOTIFICATIONS__BACKOFF_BASE": "3s",
    }
    first = start_controller(**settings)
    stalling_stack_notifying(kube, namespace, {"broken": f"http://127.0.0.1:{port}/hook"})

    def attempts(stack: JSON) -> int:
        entries = list(pending(stack).values())
        return int(((entries[0].get("attempts") or {}) if entries else {}).get("broken") or 0)

    wait_stack(kube, namespace, "app", lambda s: attempts(s) == 2, timeout=120)
    first.kill()
    assert len(broken.requests()) == 2

    start_controller(**settings)
    (note,) = notified_failures(kube, namespace, 1)
    assert note.endswith("to receiver broken failed: delivery failed (attempt 4 of 4)")
    assert len(broken.requests()) == 4
    deliveries = {r.headers["X-Pkobatch-Delivery"] for r in broken.requests()}
    assert len(deliveries) == 1
    wait_stack(kube, namespace, "app", lambda s: not pending(s), timeout=60)
