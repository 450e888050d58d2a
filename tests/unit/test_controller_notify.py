"""The pure part of notifications: events from status transitions, receivers, the outbox
in the status, bodies, signature, retry timing."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from fixture_plugins.receivers import flux_event_problems, flux_metadata

from pkobatch.api.stack.spec import NOTIFICATION_EVENTS, Notifications
from pkobatch.controller.notify import (
    MAX_PENDING,
    Occurrence,
    attempts_made,
    attempts_patch,
    delivered_patch,
    delivery_id,
    destination_refusal,
    flux_body,
    namespace_default,
    occurrences,
    pending_of,
    receivers_for,
    retry_delay,
    signature,
    slack_body,
    stack_notifications,
    verdict,
    webhook_body,
    with_pending,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STACK = {
    "metadata": {"name": "web", "namespace": "team-a", "uid": "u-1"},
    "spec": {"stack": "dev"},
}


def last(name: str, state: str, operation: str = "up", message: str = "") -> dict[str, Any]:
    return {
        "lastUpdate": {
            "name": name,
            "type": operation,
            "state": state,
            "message": message,
            "lastResyncTime": "2026-11-30T11:59:00Z",
        }
    }


def condition(kind: str, status: str, reason: str, since: str = "2026-11-30T11:00:00Z") -> Any:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": f"{kind} because {reason}",
        "lastTransitionTime": since,
    }


def kinds(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[tuple[str, str]]:
    return [(o.event, o.id) for o in occurrences(old, new, NOW)]


def test_a_failed_run_is_one_event_named_after_its_job() -> None:
    assert kinds({}, last("web-up-1", "failed", message="boom")) == [
        ("run-failed", "run-failed/web-up-1")
    ]
    (found,) = occurrences({}, last("web-up-1", "failed", message="boom"), NOW)
    assert found.summary == "up web-up-1 failed: boom"
    assert (found.run, found.operation, found.time) == ("web-up-1", "up", "2026-11-30T11:59:00Z")


def test_the_same_status_again_is_no_event() -> None:
    status = last("web-up-1", "failed")
    assert kinds(status, status) == []
    assert kinds(status, {**status, "observedGeneration": 3}) == []


def test_each_failed_retry_is_its_own_event() -> None:
    assert kinds(last("web-up-1", "failed"), last("web-up-2", "failed")) == [
        ("run-failed", "run-failed/web-up-2")
    ]


def test_success_after_failure_is_recovered_but_plain_success_is_nothing() -> None:
    assert kinds(last("web-up-1", "failed"), last("web-up-2", "succeeded")) == [
        ("run-recovered", "run-recovered/web-up-2")
    ]
    assert kinds(last("web-up-1", "succeeded"), last("web-up-2", "succeeded")) == []
    assert kinds({}, last("web-up-1", "succeeded")) == []


def test_a_successful_destroy_is_destroyed() -> None:
    assert kinds(last("web-up-1", "succeeded"), last("web-destroy-1", "succeeded", "destroy")) == [
        ("destroyed", "destroyed/web-destroy-1")
    ]
    assert kinds(last("web-up-1", "succeeded"), last("web-destroy-1", "failed", "destroy")) == [
        ("run-failed", "run-failed/web-destroy-1")
    ]


def test_drift_is_announced_when_the_condition_turns_true() -> None:
    drifted = {
        "conditions": [condition("Drifted", "True", "DriftDetected")],
        "lastDriftCheck": {"name": "web-refresh-1", "time": "2026-11-30T11:58:00Z"},
    }
    assert kinds({}, drifted) == [("drift-detected", "drift-detected/web-refresh-1")]
    again = {**drifted, "lastDriftCheck": {"name": "web-refresh-2"}}
    assert kinds(drifted, again) == []
    clean = {"conditions": [condition("Drifted", "False", "NoDrift")]}
    assert kinds(clean, drifted) == [("drift-detected", "drift-detected/web-refresh-1")]


def test_stalled_once_per_episode_and_reason_but_never_for_suspend() -> None:
    stalled = {"conditions": [condition("Stalled", "True", "UpdateFailed")]}
    assert kinds({}, stalled) == [("stalled", "stalled/UpdateFailed/2026-11-30T11:00:00Z")]
    assert kinds(stalled, stalled) == []
    other = {"conditions": [condition("Stalled", "True", "SpecInvalid")]}
    assert kinds(stalled, other) == [("stalled", "stalled/SpecInvalid/2026-11-30T11:00:00Z")]
    suspended = {"conditions": [condition("Stalled", "True", "Suspended")]}
    assert kinds({}, suspended) == []


def test_a_plan_awaiting_approval_is_announced_once_per_plan() -> None:
    def approval(state: str, plan: str) -> dict[str, Any]:
        return {
            "approval": {
                "state": state,
                "planID": plan,
                "summary": "2 to create",
                "previewJob": f"web-preview-{plan}",
                "createdTime": "2026-11-30T11:50:00Z",
            }
        }

    assert kinds({}, approval("Previewing", "")) == []
    assert kinds(approval("Previewing", ""), approval("Pending", "p1")) == [
        ("approval-pending", "approval-pending/p1")
    ]
    (found,) = occurrences({}, approval("Pending", "p1"), NOW)
    assert found.summary == "plan p1 awaits approval: 2 to create"
    assert (found.run, found.time) == ("web-preview-p1", "2026-11-30T11:50:00Z")
    assert kinds(approval("Pending", "p1"), approval("Pending", "p1")) == []
    # A newer change supersedes the plan: the new one is announced too.
    assert kinds(approval("Pending", "p1"), approval("Pending", "p2")) == [
        ("approval-pending", "approval-pending/p2")
    ]
    assert kinds(approval("Pending", "p1"), approval("Approved", "p1")) == []


def test_one_change_can_be_several_events() -> None:
    old = last("web-up-1", "failed")
    new = {
        **last("web-up-2", "failed"),
        "conditions": [condition("Stalled", "True", "UpdateFailed")],
    }
    assert [e for e, _ in kinds(old, new)] == ["run-failed", "stalled"]


def test_no_new_status_means_no_event() -> None:
    assert kinds(last("web-up-1", "failed"), None) == []


def config(**extra: Any) -> Notifications:
    return Notifications.model_validate(
        {
            "receivers": [
                {"name": "ops", "type": "webhook", "secretRef": {"name": "ops-hook"}},
                {
                    "name": "chat",
                    "type": "slack",
                    "secretRef": {"name": "chat-hook"},
                    "events": ["destroyed"],
                },
            ],
            **extra,
        }
    )


def test_receivers_follow_the_list_events_and_their_own() -> None:
    assert [r.name for r in receivers_for(config(), "run-failed")] == ["ops"]
    assert [r.name for r in receivers_for(config(), "destroyed")] == ["ops", "chat"]
    only_stalled = config(events=["stalled"])
    assert [r.name for r in receivers_for(only_stalled, "run-failed")] == []
    assert [r.name for r in receivers_for(only_stalled, "destroyed")] == ["chat"]
    assert receivers_for(None, "run-failed") == []


def test_receiver_names_are_unique_and_dns_like() -> None:
    hook = {"type": "webhook", "secretRef": {"name": "s"}}
    with pytest.raises(ValueError, match="unique: ops"):
        Notifications.model_validate(
            {"receivers": [{"name": "ops", **hook}, {"name": "ops", **hook}]}
        )
    with pytest.raises(ValueError, match="not a valid receiver name"):
        Notifications.model_validate({"receivers": [{"name": "Ops_1", **hook}]})


def test_the_stack_list_replaces_the_namespace_default() -> None:
    default = config()
    assert stack_notifications({}, default) is default
    own = stack_notifications({"notifications": {"receivers": []}}, default)
    assert own is not None and own.receivers == []


def test_namespace_default_configmap() -> None:
    cm = {
        "metadata": {"name": "n", "namespace": "team-a"},
        "data": {
            "notifications.yaml": "receivers:\n- name: ops\n  type: slack\n"
            "  secretRef: {name: hook}\n"
        },
    }
    parsed = namespace_default(cm)
    assert parsed.problem == "" and parsed.config is not None
    assert parsed.config.receivers[0].type == "slack"
    missing = namespace_default({"metadata": {"name": "n", "namespace": "team-a"}})
    assert missing.config is None and "has no key notifications.yaml" in missing.problem
    bad = namespace_default({**cm, "data": {"notifications.yaml": "receivers: [{name: x}]"}})
    assert bad.config is None and "receivers.0.type" in bad.problem


def occurrence(event: Any = "run-failed", ident: str = "run-failed/web-up-1") -> Occurrence:
    return Occurrence(ident, event, "2026-11-30T11:59:00Z", "up web-up-1 failed", "web-up-1", "up")


def test_the_outbox_holds_each_event_once_with_its_receivers() -> None:
    status, dropped = with_pending({"observedGeneration": 2}, [occurrence()], config())
    assert dropped == []
    assert status["observedGeneration"] == 2
    assert pending_of(status) == {
        "run-failed/web-up-1": {
            "event": "run-failed",
            "time": "2026-11-30T11:59:00Z",
            "summary": "up web-up-1 failed",
            "run": "web-up-1",
            "operation": "up",
            "receivers": {"ops": "webhook"},
        }
    }
    # Deciding the same transition again changes nothing.
    again, _ = with_pending(status, [occurrence()], config())
    assert again == status


def test_an_event_no_receiver_wants_is_not_stored() -> None:
    status, _ = with_pending({}, [occurrence("stalled", "stalled/x")], config(events=[]))
    assert status == {}


def test_the_outbox_is_bounded_oldest_out() -> None:
    found = [
        Occurrence(f"run-failed/r{i:02}", "run-failed", f"2026-11-30T11:{i:02}:00Z", "s")
        for i in range(MAX_PENDING + 2)
    ]
    status, dropped = with_pending({}, found, config())
    assert dropped == ["run-failed/r00", "run-failed/r01"]
    assert len(pending_of(status)) == MAX_PENDING


def test_delivered_patch_removes_the_receiver_then_the_entry() -> None:
    assert delivered_patch("e", "ops", 1) == {
        "status": {
            "notifications": {
                "pending": {"e": {"receivers": {"ops": None}, "attempts": {"ops": None}}}
            }
        }
    }
    assert delivered_patch("e", "ops", 0) == {"status": {"notifications": {"pending": {"e": None}}}}


def test_failed_attempts_are_counted_per_receiver_in_the_entry() -> None:
    assert attempts_patch("e", "ops", 3) == {
        "status": {"notifications": {"pending": {"e": {"attempts": {"ops": 3}}}}}
    }
    entry = {"receivers": {"ops": "webhook", "chat": "slack"}, "attempts": {"ops": 3}}
    assert (attempts_made(entry, "ops"), attempts_made(entry, "chat")) == (3, 0)
    assert attempts_made({"receivers": {"ops": "webhook"}}, "ops") == 0


PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "192.168.0.0/16", "fc00::/7")]


@pytest.mark.parametrize(
    ("address", "refusal"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("127.8.9.10", "127.8.9.10 is a loopback address"),
        ("::1", "::1 is a loopback address"),
        ("::ffff:127.0.0.1", "127.0.0.1 is a loopback address"),
        ("169.254.169.254", "169.254.169.254 is a link-local address"),
        ("fe80::1%eth0", "fe80::1 is a link-local address"),
        ("0.0.0.0", "0.0.0.0 is an unspecified address"),
        ("::", ":: is an unspecified address"),
        ("224.0.0.1", "224.0.0.1 is a multicast address"),
        ("255.255.255.255", "255.255.255.255 is a reserved address"),
        (
            "10.96.0.1",
            "10.96.0.1 is in 10.0.0.0/8, a range of PKOBATCH_NOTIFICATIONS__DENIED_CIDRS",
        ),
        ("::ffff:192.168.1.1", "192.168.1.1 is in 192.168.0.0/16, a range of"),
        ("fd12::1", "fd12::1 is in fc00::/7, a range of"),
        ("93.184.215.14", None),
        ("2606:2800:21f:cb07::1", None),
    ],
)
def test_destinations_refused_by_default(address: str, refusal: str | None) -> None:
    found = destination_refusal(address, PRIVATE, [])
    assert (found is None) == (refusal is None)
    assert refusal is None or (found is not None and found.startswith(refusal))


def test_an_allowed_range_wins_over_every_refusal() -> None:
    allowed = [ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.20.0.0/16")]
    assert destination_refusal("127.0.0.1", PRIVATE, allowed) is None
    assert destination_refusal("::ffff:127.0.0.1", PRIVATE, allowed) is None
    assert destination_refusal("10.20.3.4", PRIVATE, allowed) is None
    assert destination_refusal("127.0.0.2", PRIVATE, allowed) == "127.0.0.2 is a loopback address"
    assert destination_refusal("10.21.0.1", PRIVATE, allowed) is not None


def test_webhook_body_names_the_stack_run_and_describe_command() -> None:
    status, _ = with_pending({}, [occurrence()], config())
    entry = pending_of(status)["run-failed/web-up-1"]
    body = json.loads(webhook_body(STACK, "run-failed/web-up-1", entry, "u-1/run-failed/web-up-1"))
    assert body == {
        "kind": "pkobatch.io/notification",
        "version": 1,
        "id": "u-1/run-failed/web-up-1",
        "eventId": "run-failed/web-up-1",
        "event": "run-failed",
        "time": "2026-11-30T11:59:00Z",
        "stack": {"namespace": "team-a", "name": "web", "uid": "u-1", "stack": "dev"},
        "run": {"name": "web-up-1", "operation": "up"},
        "summary": "up web-up-1 failed",
        "describe": "pkobatch describe -n team-a web",
    }
    assert delivery_id(STACK, "run-failed/web-up-1") == "u-1/run-failed/web-up-1"


def test_slack_body_is_text_only() -> None:
    body = json.loads(slack_body(STACK, {"event": "destroyed", "summary": "gone"}))
    assert body == {
        "text": "[destroyed] Stack team-a/web: gone\nDetails: `pkobatch describe -n team-a web`"
    }


def test_signature_is_github_style_hmac_of_the_raw_body() -> None:
    body = b'{"a": 1}'
    expected = hmac.new(b"k3y", body, hashlib.sha256).hexdigest()
    assert signature(b"k3y", body) == f"sha256={expected}"
    assert signature(b"other", body) != signature(b"k3y", body)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        *[(200, "sent"), (204, "sent"), (None, "retry"), (500, "retry"), (503, "retry")],
        *[(429, "retry"), (408, "retry"), (400, "failed"), (404, "failed"), (301, "failed")],
    ],
)
def test_verdict(code: int | None, expected: str) -> None:
    assert verdict(code) == expected
    assert verdict(code, "slack") == expected


def test_notification_controller_answers_a_repeat_with_429_and_that_one_has_arrived() -> None:
    assert verdict(429, "flux") == "sent"
    assert (verdict(202, "flux"), verdict(503, "flux"), verdict(400, "flux")) == (
        "sent",
        "retry",
        "failed",
    )


COMMIT = "0123456789abcdef0123456789abcdef01234567"
FLUX_STACK = {"apiVersion": "pulumi.com/v1", "kind": "Stack", **STACK}


def flux_event(
    event: Any, status: dict[str, Any], before: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The Flux event of the ``event`` the change ``before`` -> ``status`` is."""
    flux = Notifications.model_validate(
        {"receivers": [{"name": "flux", "type": "flux", "secretRef": {"name": "nc"}}]}
    )
    found = [o for o in occurrences(before or {}, status, NOW) if o.event == event]
    outbox, _ = with_pending({}, found, flux)
    ((event_id, entry),) = pending_of(outbox).items()
    body = flux_body(
        FLUX_STACK,
        entry,
        delivery_id(STACK, event_id),
        controller="pkobatch.io/controller",
        instance="pkobatch-controller-7d9f",
    )
    assert flux_event_problems(body) == []
    return dict(json.loads(body))


def test_a_flux_receiver_gets_the_event_flux_controllers_post() -> None:
    status = last("web-up-1", "failed", message="boom")
    status["lastUpdate"]["lastAttemptedCommit"] = COMMIT

    event = flux_event("run-failed", status)

    assert event == {
        "involvedObject": {
            "apiVersion": "pulumi.com/v1",
            "kind": "Stack",
            "namespace": "team-a",
            "name": "web",
            "uid": "u-1",
        },
        "severity": "error",
        "timestamp": "2026-11-30T11:59:00Z",
        "message": "up web-up-1 failed: boom",
        "reason": "RunFailed",
        "metadata": {
            "pulumi.com/event": "run-failed",
            "pulumi.com/token": "u-1/run-failed/web-up-1",
            "pulumi.com/revision": f"sha1:{COMMIT}",
            "pulumi.com/run": "web-up-1",
            "pulumi.com/operation": "up",
        },
        "reportingController": "pkobatch.io/controller",
        "reportingInstance": "pkobatch-controller-7d9f",
    }
    # What notification-controller's providers get: the token is its own.
    assert flux_metadata(event) == {
        "event": "run-failed",
        "revision": f"sha1:{COMMIT}",
        "run": "web-up-1",
        "operation": "up",
    }


def test_each_event_has_its_flux_severity_reason_and_revision() -> None:
    flux_revision = "main@sha1:" + COMMIT
    update = {
        "name": "web-up-2",
        "type": "up",
        "state": "succeeded",
        "lastResyncTime": "2026-11-30T11:59:00Z",
        "lastAttemptedCommit": flux_revision,
        "lastSuccessfulCommit": flux_revision,
    }
    statuses = {
        "run-failed": {"lastUpdate": {**update, "state": "failed"}},
        "run-recovered": {"lastUpdate": update},
        "destroyed": {"lastUpdate": {**update, "type": "destroy", "name": "web-destroy-1"}},
        "drift-detected": {
            "lastUpdate": update,
            "conditions": [condition("Drifted", "True", "DriftDetected")],
            "lastDriftCheck": {"name": "web-refresh-1"},
        },
        "stalled": {
            "lastUpdate": {**update, "state": "failed"},
            "conditions": [condition("Stalled", "True", "UpdateFailed")],
        },
        "approval-pending": {
            "approval": {"state": "Pending", "planID": "p1", "commit": flux_revision}
        },
    }
    before = {"run-recovered": {"lastUpdate": {**update, "name": "web-up-1", "state": "failed"}}}
    seen = {}
    for event in NOTIFICATION_EVENTS:
        body = flux_event(event, statuses[event], before.get(event))
        seen[event] = (body["severity"], body["reason"], flux_metadata(body)["revision"])
    assert seen == {
        "run-failed": ("error", "RunFailed", flux_revision),
        "run-recovered": ("info", "RunRecovered", flux_revision),
        "destroyed": ("info", "Destroyed", flux_revision),
        "drift-detected": ("error", "DriftDetected", flux_revision),
        "stalled": ("error", "Stalled", flux_revision),
        "approval-pending": ("info", "ApprovalPending", flux_revision),
    }


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [retry_delay(a, 1.0, 10.0) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]
