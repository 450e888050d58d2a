"""Notifications end to end: the real controller, control plane and Pulumi runs, and real
HTTP receivers on loopback (docs/notifications.md).

One Stack's receiver gets exactly one signed message per event — run failed, stalled,
recovered, drift detected, destroyed — including an event that was pending (its receiver
holding the request unanswered) when the controller was SIGKILLed. A second Stack uses the
namespace default: a Slack receiver that gets its stall, and two that are down, one refusing
connections, one accepting and never answering; neither delays the first Stack's messages,
and the refused one is given up with a ``NotificationFailed`` Event. A Stack in approval mode
announces its plan awaiting approval once. The receivers'
URLs and the signing key are sentinels: they appear in no body, status, Event or log. A
``flux`` receiver gets events in Flux's format, each one checked as notification-controller's
event server reads it (tests/fixture_plugins/receivers.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fixture_plugins.receivers import (
    HELD,
    HangingServer,
    Receiver,
    flux_event_problems,
    flux_metadata,
    hook_secret,
    pending,
    receivers,
)
from helpers.controller_harness import (
    ControllerProcess,
    apply_stack,
    bind_runner,
    condition,
    free_port,
    ready,
    stack_spec,
    wait_stack,
)
from helpers.sentinels import plant
from test_program_runtimes import PROGRAM_RULES, grant_program_rules, kubernetes_spec

from pkobatch.dev.processes import wait_until
from pkobatch.kube.client import CONFIGMAPS, EVENTS, STACKS, Kube

JSON = dict[str, Any]


def events_of(messages: list[JSON], stack: str) -> list[str]:
    return sorted(m["eventId"] for m in messages if m["stack"]["name"] == stack)


def test_each_event_reaches_its_receiver_once_signed_across_a_restart(
    cluster: Any,
    kube: Kube,
    namespace: str,
    tmp_path: Path,
    controller_rbac: None,
    pulumi_bin: Path,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
    hanging: HangingServer,
) -> None:
    bind_runner(kube, namespace)
    inbox, port = receivers_on_loopback()
    slack, slack_port = receivers_on_loopback()
    signing_key = plant("notify-signing-key")
    ops_url = f"http://127.0.0.1:{port}/hook?t={plant('notify-url')}"
    hook_secret(kube, namespace, "ops-hook", ops_url, signing_key)
    refused_url = f"http://127.0.0.1:{free_port()}/x?t={plant('notify-refused-url')}"
    hook_secret(kube, namespace, "refused-hook", refused_url)
    hook_secret(kube, namespace, "hanging-hook", f"http://127.0.0.1:{hanging.port}/x")
    hook_secret(kube, namespace, "chat-hook", f"http://127.0.0.1:{slack_port}/services/T/B")
    # The namespace default: for every Stack without spec.notifications.
    default = {
        "receivers": [
            *receivers("refused", "hanging")["receivers"],
            {
                "name": "chat",
                "type": "slack",
                "secretRef": {"name": "chat-hook"},
                "events": ["stalled"],
            },
        ]
    }
    kube.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "notifications",
                "labels": {"pkobatch.io/notifications": "default"},
            },
            "data": {"notifications.yaml": json.dumps(default)},
        },
        namespace,
    )
    settings = {
        "PKOBATCH_RETRY__MAX_FAILURES": "1",
        "PKOBATCH_NOTIFICATIONS__BACKOFF_BASE": "1s",
        "PKOBATCH_NOTIFICATIONS__BACKOFF_CAP": "2s",
        "PKOBATCH_NOTIFICATIONS__MAX_ATTEMPTS": "3",
        # The hanging receiver keeps its request open all test long.
        "PKOBATCH_NOTIFICATIONS__TIMEOUT": "1h",
    }
    controller = ControllerProcess(cluster, namespace, tmp_path / "controller", env=settings)
    controller.start()
    try:
        broken = git_repo("syntax-error")
        # A Stack whose receivers (the namespace default) are down, one refusing, one
        # hanging, fails like any other...
        apply_stack(kube, namespace, "other", stack_spec(broken, pulumi_env, stack="other"))
        wait_until(lambda: hanging.open_requests() == 1, timeout=600, what="a hanging delivery")

        # ... and while its delivery hangs, every event of "app" reaches "ops".
        app = receivers("ops")
        apply_stack(
            kube,
            namespace,
            "app",
            stack_spec(broken, pulumi_env, destroyOnFinalize=True, notifications=app),
        )
        # First failure, the retry's failure, then Stalled (at most 1 failure retried).
        wait_until(
            lambda: len(events_of(inbox.accepted(), "app")) == 3,
            timeout=600,
            what="run-failed twice and stalled for app",
        )
        failed = events_of(inbox.accepted(), "app")
        assert [e.split("/")[0] for e in failed] == ["run-failed", "run-failed", "stalled"]
        assert hanging.open_requests() == 1
        # The hanging delivery is in flight, "other"'s later events wait behind it.
        assert controller.metric("pkobatch_notifications_queue_depth") >= 1
        stalled = wait_stack(
            kube,
            namespace,
            "other",
            lambda s: condition(s, "Stalled").get("reason") == "UpdateFailed",
        )
        assert pending(stalled), "other's events stay pending while its receivers are down"
        wait_until(
            lambda: any(
                e["reason"] == "NotificationFailed"
                and "to receiver refused failed: delivery failed (attempt 3 of 3)"
                in e.get("note", "")
                for e in kube.list_objects(EVENTS, namespace)[0]
            ),
            timeout=120,
            what="the refused receiver to be given up",
        )
        assert controller.metric("pkobatch_notifications_retried_total") >= 2
        assert controller.metric("pkobatch_notifications_failed_total", event="run-failed") >= 1
        assert controller.metric("pkobatch_notifications_sent_total", event="stalled") >= 2
        # The default's Slack receiver got "other"'s stall; "app" has its own list.
        wait_until(lambda: len(slack.accepted()) == 1, timeout=120, what="the Slack message")
        (text,) = [m["text"] for m in slack.accepted()]
        assert text.startswith(f"[stalled] Stack {namespace}/other: stalled (UpdateFailed)")
        assert text.endswith(f"Details: `pkobatch describe -n {namespace} other`")

        # The fix succeeds while "ops" holds its requests unanswered: the recovery is
        # pending in the status when the controller is SIGKILLed, and sent once after.
        inbox.holding.set()
        fixed = git_repo()
        apply_stack(
            kube,
            namespace,
            "app",
            stack_spec(fixed, pulumi_env, destroyOnFinalize=True, notifications=app),
        )
        wait_until(
            lambda: any(r.answered == HELD for r in inbox.requests()),
            timeout=300,
            what="the recovery's first attempt",
        )
        assert any(
            k.startswith("run-recovered/") for k in pending(kube.get(STACKS, "app", namespace))
        )
        controller.kill()
        inbox.holding.clear()
        inbox.release.set()
        controller.start()
        wait_until(
            lambda: any(e.startswith("run-recovered/") for e in events_of(inbox.accepted(), "app")),
            timeout=300,
            what="run-recovered after the restart",
        )
        wait_stack(kube, namespace, "app", lambda s: ready(s) and not pending(s))

        # A scheduled drift check finds a file changed behind Pulumi's back.
        drift = stack_spec(
            fixed,
            pulumi_env,
            destroyOnFinalize=True,
            notifications=app,
            driftDetection={"schedule": "* * * * *"},
        )
        apply_stack(kube, namespace, "app", drift)
        wait_stack(kube, namespace, "app", lambda s: ready(s) and current(s))
        (pulumi_env.files_dir / "file-0.txt").write_text("changed behind Pulumi's back")
        wait_until(
            lambda: any(
                e.startswith("drift-detected/") for e in events_of(inbox.accepted(), "app")
            ),
            timeout=300,
            what="drift-detected",
        )

        kube.delete(STACKS, "app", namespace)
        wait_until(
            lambda: any(e.startswith("destroyed/") for e in events_of(inbox.accepted(), "app")),
            timeout=300,
            what="destroyed",
        )
        # Every delivery settled: nothing more can arrive for "app".
        wait_until(
            lambda: kube.get_or_none(STACKS, "app", namespace) is None,
            timeout=120,
            what="app to be gone",
        )
        assert hanging.open_requests() == 1
    finally:
        controller.stop()

    assert len(slack.accepted()) == 1
    assert all("X-Pkobatch-Signature" not in r.headers for r in slack.requests())

    messages = [m for m in inbox.accepted() if m["stack"]["name"] == "app"]
    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids)), f"a message was accepted twice: {ids}"
    assert sorted(m["event"] for m in messages) == sorted(
        ["run-failed", "run-failed", "stalled", "run-recovered", "drift-detected", "destroyed"]
    )
    for request in inbox.requests():
        text = request.body.decode() + json.dumps(request.headers)
        assert signing_key not in text and ops_url not in text
        digest = hmac.new(signing_key.encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers["X-Pkobatch-Signature"] == f"sha256={digest}"
        body = json.loads(request.body)
        assert request.headers["X-Pkobatch-Delivery"] == body["id"]
        assert body["describe"] == f"pkobatch describe -n {namespace} {body['stack']['name']}"
    recovered = next(m for m in messages if m["event"] == "run-recovered")
    assert recovered["run"]["operation"] == "up" and recovered["stack"]["stack"] == "dev"
    destroyed = next(m for m in messages if m["event"] == "destroyed")
    assert destroyed["run"]["operation"] == "destroy"
    log = controller.log_text()
    assert "notify-url" not in log and "notify-refused-url" not in log
    assert "notify-signing-key" not in log


def current(stack: JSON) -> bool:
    last = (stack.get("status") or {}).get("lastUpdate") or {}
    return bool(last.get("generation") == stack["metadata"]["generation"])


def test_a_plan_awaiting_approval_is_announced_once(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    kubernetes_provider: Path,
    receivers_on_loopback: Callable[[], tuple[Receiver, int]],
) -> None:
    inbox, port = receivers_on_loopback()
    signing_key = plant("notify-approval-key")
    hook_secret(kube, namespace, "ops-hook", f"http://127.0.0.1:{port}/hook", signing_key)
    grant_program_rules(kube, namespace, PROGRAM_RULES)
    spec = kubernetes_spec(git_repo("k8s-yaml"), pulumi_env, namespace)
    spec["approval"] = {"required": True}
    spec["notifications"] = {**receivers("ops"), "events": ["approval-pending"]}
    apply_stack(kube, namespace, "app", spec)
    stack = wait_stack(
        kube,
        namespace,
        "app",
        lambda s: (s.get("status") or {}).get("approval", {}).get("state") == "Pending",
        what="a plan awaiting approval",
    )
    record = stack["status"]["approval"]
    wait_until(lambda: len(inbox.accepted()) == 1, timeout=120, what="the approval message")
    wait_stack(kube, namespace, "app", lambda s: not pending(s), what="the delivery recorded")
    (message,) = inbox.accepted()
    assert message["event"] == "approval-pending"
    assert message["eventId"] == f"approval-pending/{record['planID']}"
    assert message["run"] == {"name": record["previewJob"], "operation": "preview"}
    assert message["summary"].startswith(f"plan {record['planID']} awaits approval")
    (request,) = inbox.requests()
    digest = hmac.new(signing_key.encode(), request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Pkobatch-Signature"] == f"sha256={digest}"
    # Nothing else happens until someone approves: no second message.
    assert len(inbox.accepted()) == 1


def test_a_flux_receiver_gets_events_notification_controller_takes(
    controller: ControllerProcess,
    kube: Kube,
    namespace: str,
    git_repo: Callable[..., Any],
    pulumi_env: Any,
    secrets: JSON,
    receivers_on_loopback: Callable[..., tuple[Receiver, int]],
) -> None:
    # Answers as notification-controller's event server does: 202, or 400 for a body it
    # cannot take (recorded with what is wrong).
    inbox, port = receivers_on_loopback(202, flux_event_problems)
    hook_secret(kube, namespace, "nc-hook", f"http://127.0.0.1:{port}/")
    flux = {
        "receivers": [{"name": "nc", "type": "flux", "secretRef": {"name": "nc-hook"}}],
        "events": ["run-failed", "run-recovered"],
    }
    broken = git_repo("syntax-error")
    apply_stack(kube, namespace, "app", stack_spec(broken, pulumi_env, notifications=flux))
    wait_until(lambda: len(inbox.accepted()) >= 1, timeout=600, what="the run-failed event")
    fixed = git_repo()
    apply_stack(kube, namespace, "app", stack_spec(fixed, pulumi_env, notifications=flux))
    wait_until(
        lambda: any(e["reason"] == "RunRecovered" for e in inbox.accepted()),
        timeout=600,
        what="the run-recovered event",
    )

    stack = wait_stack(kube, namespace, "app", lambda s: ready(s) and not pending(s))
    assert [(r.answered, r.problems) for r in inbox.requests()] == [
        (202, []) for _ in inbox.requests()
    ]
    failed, *_, recovered = inbox.accepted()
    reference = {
        "apiVersion": "pulumi.com/v1",
        "kind": "Stack",
        "namespace": namespace,
        "name": "app",
        "uid": stack["metadata"]["uid"],
    }
    for event in (failed, recovered):
        assert event["involvedObject"] == reference
        assert event["reportingController"] == "pkobatch.io/controller"
        assert event["reportingInstance"] == socket.gethostname()
    assert (failed["severity"], failed["reason"]) == ("error", "RunFailed")
    assert failed["message"].startswith("up app-up-")
    assert flux_metadata(failed)["revision"] == f"sha1:{broken.commit}"
    assert (recovered["severity"], recovered["reason"]) == ("info", "RunRecovered")
    assert flux_metadata(recovered) == {
        "event": "run-recovered",
        "revision": f"sha1:{fixed.commit}",
        "run": stack["status"]["lastUpdate"]["name"],
        "operation": "up",
    }
