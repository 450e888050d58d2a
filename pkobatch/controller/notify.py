"""Notifications: which events a status change is, who gets them, and what is sent (pure).

The I/O shell is ``pkobatch.controller.delivery``; docs/notifications.md is the user's view.

**Events are transitions.** ``occurrences(old, new)`` compares a Stack's status before and
after one reconcile and names what happened: a run failed, a run succeeded after a failure
(``run-recovered``), a destroy succeeded, the ``Drifted`` condition became True, the
``Stalled`` condition became True (or changed its reason; never for ``Suspended``, a hold
the user asked for), a saved plan awaits approval (``status.approval.state`` ``Pending``).
Each occurrence has an id derived from what it is about — the run's Job name, the
condition's reason and transition time, the plan id — so deciding the same transition again
(a reconcile retried after a conflict) gives the same id.

**Durability is an outbox in the status.** ``with_pending`` adds the occurrences, with the
receivers that must get them, to ``status.notifications.pending`` in the same status write
as the change itself: the event and the fact that it must be sent are stored together or
not at all. The delivery worker removes a receiver from an entry after delivering to it (or
after its last retry), and the entry once no receiver is left. A restarted controller finds
the entries still pending and sends them; an entry delivered before the restart is gone, so
it is not sent again. The one window left is a crash between a receiver's ``2xx`` and the
status write that records it: that message is sent again, with the same
``X-Pkobatch-Delivery`` id, so a receiver can drop the repeat. Each failed attempt that will
be retried is recorded in the entry too (``attempts``), so a restarted controller goes on
counting towards the last attempt instead of starting again.

**Destinations are checked, and failures are not explained to the Stack's author.** Every
address a receiver's host resolves to is judged by ``destination_refusal`` (loopback,
link-local and the like always, the denied ranges by setting, the allowed ranges first);
the shell connects only to an address it judged. A refused destination is handled like one
where nothing answers (retried, then given up), so the two cannot be told apart, and the
``NotificationFailed`` Event names only the receiver and a generic reason (the details go to
the controller's log): a Stack's author learns nothing about what the controller's network
position can reach.

A Stack being deleted is released in the reconcile that folds its destroy, so its status is
never written again: its ``destroyed`` event is delivered from memory only.

**Three formats.** A ``webhook`` gets pkobatch's own signed JSON, ``slack`` a Slack message,
``flux`` the event Flux controllers post to notification-controller's events address
(``eventv1.Event`` of ``github.com/fluxcd/pkg/apis/event/v1beta1``, what its event server
decodes), so Flux's Alerts and Providers route pkobatch's events, as with tofu-controller's
``eventsAddress``. Its metadata keys carry the Stack's API group (``pulumi.com/``): the only
prefix, besides the event API group's, that notification-controller keeps.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import yaml
from pydantic import ValidationError

from pkobatch.api.constants import CONDITION_DRIFTED, CONDITION_STALLED, SUSPENDED_REASON
from pkobatch.api.messages import bound_message
from pkobatch.api.objects import JSON, condition_of
from pkobatch.api.stack.spec import (
    NOTIFICATION_EVENTS,
    NotificationEvent,
    Notifications,
    ReceiverType,
)
from pkobatch.api.status import last_drift_check, last_update
from pkobatch.api.timestamps import format_time, parse_time

# The namespace default: a ConfigMap with this label, its receivers under this key.
NAMESPACE_DEFAULT_LABEL: Final = "pkobatch.io/notifications"
NAMESPACE_DEFAULT_LABEL_VALUE: Final = "default"
NAMESPACE_DEFAULT_KEY: Final = "notifications.yaml"
# Keys of a receiver's Secret.
URL_KEY: Final = "url"
SIGNING_KEY_KEY: Final = "signingKey"
SIGNATURE_HEADER: Final = "X-Pkobatch-Signature"
EVENT_HEADER: Final = "X-Pkobatch-Event"
DELIVERY_HEADER: Final = "X-Pkobatch-Delivery"
BODY_KIND: Final = "pkobatch.io/notification"
BODY_VERSION: Final = 1
# Undelivered events kept per Stack; the oldest go first (a receiver down for days must
# not grow the status without bound).
MAX_PENDING: Final = 20
MAX_SUMMARY_CHARS: Final = 1024
# Flux's event severities (eventv1): what a Flux Alert's eventSeverity filters on ("error"
# alerts get only these).
FLUX_ERROR_EVENTS: Final[frozenset[NotificationEvent]] = frozenset(
    {"run-failed", "stalled", "drift-detected"}
)
# A 40-digit hex commit is a git SHA-1: Flux writes it "sha1:<commit>" (Flux RFC 0005).
_GIT_SHA1_DIGITS: Final = 40

Verdict = Literal["sent", "retry", "failed"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Addresses no notification goes to whatever PKOBATCH_NOTIFICATIONS__DENIED_CIDRS says (the
# controller's own ports, the node's services, cloud metadata endpoints), unless
# PKOBATCH_NOTIFICATIONS__ALLOWED_CIDRS names them.
ALWAYS_REFUSED: Final[tuple[tuple[str, tuple[Network, ...]], ...]] = tuple(
    (what, tuple(ipaddress.ip_network(n) for n in networks))
    for what, networks in (
        ("a loopback address", ("127.0.0.0/8", "::1/128")),
        ("a link-local address", ("169.254.0.0/16", "fe80::/10")),
        ("an unspecified address", ("0.0.0.0/8", "::/128")),
        ("a multicast address", ("224.0.0.0/4", "ff00::/8")),
        ("a reserved address", ("240.0.0.0/4",)),
    )
)


@dataclass(frozen=True)
class Occurrence:
    """One event that happened to a Stack."""

    id: str
    event: NotificationEvent
    time: str
    summary: str
    run: str = ""
    operation: str = ""
    # The source revision the event is about (the run's commit; a Flux source's revision).
    revision: str = ""


@dataclass(frozen=True)
class Receiver:
    name: str
    type: ReceiverType
    secret: str


# -- which events -------------------------------------------------------------------------


def _run_events(old: Mapping[str, Any], new: Mapping[str, Any], now: str) -> list[Occurrence]:
    before, after = last_update(old), last_update(new)
    name = str(after.get("name") or "")
    if not name or (before.get("name"), before.get("state")) == (name, after.get("state")):
        return []
    operation = str(after.get("type") or "")
    time = str(after.get("lastResyncTime") or now)
    revision = str(after.get("lastAttemptedCommit") or "")
    if after.get("state") == "failed":
        message = str(after.get("message") or "")
        return [
            Occurrence(
                f"run-failed/{name}",
                "run-failed",
                time,
                f"{operation} {name} failed: {message}",
                name,
                operation,
                revision,
            )
        ]
    if after.get("state") != "succeeded":
        return []
    found = []
    if before.get("state") == "failed":
        found.append(
            Occurrence(
                f"run-recovered/{name}",
                "run-recovered",
                time,
                f"{operation} {name} succeeded after {before.get('type')} "
                f"{before.get('name')} failed",
                name,
                operation,
                revision,
            )
        )
    if operation == "destroy":
        found.append(
            Occurrence(
                f"destroyed/{name}",
                "destroyed",
                time,
                f"the stack's resources were destroyed by {name}",
                name,
                operation,
                revision,
            )
        )
    return found


def _drift_events(old: Mapping[str, Any], new: Mapping[str, Any], now: str) -> list[Occurrence]:
    before = condition_of({"status": old}, CONDITION_DRIFTED) or {}
    after = condition_of({"status": new}, CONDITION_DRIFTED) or {}
    if after.get("status") != "True" or before.get("status") == "True":
        return []
    check = last_drift_check(new)
    name = str(check.get("name") or "")
    time = str(check.get("time") or after.get("lastTransitionTime") or now)
    return [
        Occurrence(
            f"drift-detected/{name or after.get('lastTransitionTime')}",
            "drift-detected",
            time,
            str(after.get("message") or "drift detected"),
            name,
            "refresh" if name else "",
            # Drift is measured against what the last successful update deployed.
            str(last_update(new).get("lastSuccessfulCommit") or ""),
        )
    ]


def _stall_events(old: Mapping[str, Any], new: Mapping[str, Any], now: str) -> list[Occurrence]:
    before = condition_of({"status": old}, CONDITION_STALLED) or {}
    after = condition_of({"status": new}, CONDITION_STALLED) or {}
    reason = str(after.get("reason") or "")
    if after.get("status") != "True" or reason == SUSPENDED_REASON:
        return []
    if before.get("status") == "True" and before.get("reason") == reason:
        return []
    since = str(after.get("lastTransitionTime") or now)
    last = last_update(new)
    return [
        Occurrence(
            f"stalled/{reason}/{since}",
            "stalled",
            since,
            f"stalled ({reason}): {after.get('message') or ''}",
            str(last.get("name") or ""),
            str(last.get("type") or ""),
            str(last.get("lastAttemptedCommit") or ""),
        )
    ]


def _approval_events(old: Mapping[str, Any], new: Mapping[str, Any], now: str) -> list[Occurrence]:
    """``status.approval`` (spec.approval, the approval of saved plans) turned ``Pending``
    for a plan: once per plan id."""
    before = old.get("approval") or {}
    after = new.get("approval") or {}
    plan = str(after.get("planID") or "")
    if after.get("state") != "Pending" or not plan:
        return []
    if before.get("state") == "Pending" and before.get("planID") == plan:
        return []
    summary = str(after.get("summary") or "")
    return [
        Occurrence(
            f"approval-pending/{plan}",
            "approval-pending",
            str(after.get("createdTime") or now),
            f"plan {plan} awaits approval" + (f": {summary}" if summary else ""),
            str(after.get("previewJob") or ""),
            "preview" if after.get("previewJob") else "",
            str(after.get("commit") or ""),
        )
    ]


# Each detector names the events of one kind in a status change.
DETECTORS: Final = (_run_events, _drift_events, _stall_events, _approval_events)


def occurrences(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, now: datetime
) -> list[Occurrence]:
    """The events the status change ``old`` → ``new`` is (none when ``new`` is None)."""
    if new is None:
        return []
    before, stamp = old or {}, format_time(now)
    found = [event for detect in DETECTORS for event in detect(before, new, stamp)]
    return [
        Occurrence(
            e.id,
            e.event,
            e.time,
            bound_message(e.summary, MAX_SUMMARY_CHARS),
            e.run,
            e.operation,
            e.revision,
        )
        for e in found
    ]


# -- who gets them ------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceDefault:
    """A namespace's default receivers, read from its labelled ConfigMap."""

    config: Notifications | None
    # Why the ConfigMap cannot be used ("" when it can): logged, and the default is off.
    problem: str = ""


def namespace_default(configmap: Mapping[str, Any]) -> NamespaceDefault:
    """The receivers a namespace-default ConfigMap names (see docs/notifications.md)."""
    meta = configmap.get("metadata") or {}
    where = f"ConfigMap {meta.get('namespace')}/{meta.get('name')}"
    text = (configmap.get("data") or {}).get(NAMESPACE_DEFAULT_KEY)
    if not isinstance(text, str):
        return NamespaceDefault(None, f"{where} has no key {NAMESPACE_DEFAULT_KEY}")
    try:
        loaded = yaml.safe_load(text)
        return NamespaceDefault(Notifications.model_validate(loaded))
    except yaml.YAMLError as exc:
        return NamespaceDefault(None, f"{where}: {NAMESPACE_DEFAULT_KEY} is not YAML: {exc}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(top)'}: {error['msg']}"
            for error in exc.errors()
        )
        return NamespaceDefault(None, f"{where}: {NAMESPACE_DEFAULT_KEY} is invalid: {problems}")


def stack_notifications(
    spec: Mapping[str, Any], default: Notifications | None
) -> Notifications | None:
    """The Stack's own ``spec.notifications`` when set (even an invalid one: it is the
    Stack's choice, reported by the spec check), else the namespace default."""
    raw = spec.get("notifications")
    if raw is None:
        return default
    try:
        return Notifications.model_validate(raw)
    except ValidationError:
        return None


def receivers_for(config: Notifications | None, event: NotificationEvent) -> list[Receiver]:
    if config is None:
        return []
    wanted = config.events if config.events is not None else NOTIFICATION_EVENTS
    return [
        Receiver(r.name, r.type, r.secret_ref.name)
        for r in config.receivers
        if event in (r.events if r.events is not None else wanted)
    ]


def receiver_named(config: Notifications | None, name: str) -> Receiver | None:
    """The receiver ``name`` as configured now (None: it was removed)."""
    for r in config.receivers if config is not None else ():
        if r.name == name:
            return Receiver(r.name, r.type, r.secret_ref.name)
    return None


# -- the outbox in the status ---------------------------------------------------------------


def pending_entry(occurrence: Occurrence, receivers: Sequence[Receiver]) -> JSON:
    entry: JSON = {
        "event": occurrence.event,
        "time": occurrence.time,
        "summary": occurrence.summary,
        "receivers": {r.name: r.type for r in receivers},
    }
    if occurrence.run:
        entry["run"] = occurrence.run
    if occurrence.operation:
        entry["operation"] = occurrence.operation
    if occurrence.revision:
        entry["revision"] = occurrence.revision
    return entry


def with_pending(
    status: Mapping[str, Any], found: Iterable[Occurrence], config: Notifications | None
) -> tuple[JSON, list[str]]:
    """``status`` with the events in ``found`` that some receiver wants added to
    ``status.notifications.pending``; and the ids of the entries it dropped to stay within
    ``MAX_PENDING`` (oldest first)."""
    updated = dict(status)
    pending: JSON = dict((status.get("notifications") or {}).get("pending") or {})
    for occurrence in found:
        receivers = receivers_for(config, occurrence.event)
        if receivers and occurrence.id not in pending:
            pending[occurrence.id] = pending_entry(occurrence, receivers)
    dropped: list[str] = []
    while len(pending) > MAX_PENDING:
        oldest = min(pending, key=lambda key: (str(pending[key].get("time") or ""), key))
        dropped.append(oldest)
        del pending[oldest]
    if pending:
        updated["notifications"] = {**(status.get("notifications") or {}), "pending": pending}
    return updated, dropped


def pending_of(status: Mapping[str, Any]) -> dict[str, JSON]:
    """Event id -> pending entry, from ``status.notifications.pending``."""
    raw = (status.get("notifications") or {}).get("pending") or {}
    return {str(k): dict(v) for k, v in raw.items() if isinstance(v, Mapping)}


def delivered_patch(event_id: str, receiver: str, remaining: int) -> JSON:
    """The status merge patch after ``receiver`` is done with ``event_id``: the whole entry
    goes when ``remaining`` (receivers still to do) is 0."""
    entry: Any = (
        None if remaining == 0 else {"receivers": {receiver: None}, "attempts": {receiver: None}}
    )
    return {"status": {"notifications": {"pending": {event_id: entry}}}}


def attempts_patch(event_id: str, receiver: str, attempts: int) -> JSON:
    """The status merge patch recording ``attempts`` failed attempts to ``receiver``, so a
    restarted controller goes on counting. Should the entry be gone meanwhile, the API server
    refuses the patch (it would create an entry without its required fields)."""
    entry = {"attempts": {receiver: attempts}}
    return {"status": {"notifications": {"pending": {event_id: entry}}}}


def attempts_made(entry: Mapping[str, Any], receiver: str) -> int:
    """The failed attempts to ``receiver`` an entry records (0: none yet)."""
    value = (entry.get("attempts") or {}).get(receiver)
    return value if isinstance(value, int) and value > 0 else 0


# -- what is sent --------------------------------------------------------------------------


def describe_command(namespace: str, name: str) -> str:
    return f"pkobatch describe -n {namespace} {name}"


def webhook_body(
    stack: Mapping[str, Any], event_id: str, entry: Mapping[str, Any], delivery: str
) -> bytes:
    meta = stack.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    run: JSON | None = None
    if entry.get("run"):
        run = {"name": entry.get("run"), "operation": entry.get("operation") or ""}
    body = {
        "kind": BODY_KIND,
        "version": BODY_VERSION,
        "id": delivery,
        "event": entry.get("event"),
        "time": entry.get("time"),
        "stack": {
            "namespace": namespace,
            "name": name,
            "uid": meta.get("uid") or "",
            "stack": (stack.get("spec") or {}).get("stack") or "",
        },
        "run": run,
        "summary": entry.get("summary") or "",
        "describe": describe_command(namespace, name),
        "eventId": event_id,
    }
    return json.dumps(body, sort_keys=True).encode()


def slack_body(stack: Mapping[str, Any], entry: Mapping[str, Any]) -> bytes:
    meta = stack.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    text = (
        f"[{entry.get('event')}] Stack {namespace}/{name}: {entry.get('summary') or ''}\n"
        f"Details: `{describe_command(namespace, name)}`"
    )
    return json.dumps({"text": text}).encode()


def flux_revision(revision: str) -> str:
    """A revision as Flux writes one: a git commit as ``sha1:<commit>``; a Flux source's
    artifact revision (already ``<ref>@sha1:<commit>``) and others as they are."""
    is_sha1 = len(revision) == _GIT_SHA1_DIGITS and all(c in "0123456789abcdef" for c in revision)
    return f"sha1:{revision}" if is_sha1 else revision


def flux_reason(event: str) -> str:
    """The event's Flux reason (CamelCase, as Flux controllers write theirs): RunFailed ..."""
    return "".join(part.capitalize() for part in event.split("-"))


def flux_body(
    stack: Mapping[str, Any],
    entry: Mapping[str, Any],
    delivery: str,
    *,
    controller: str,
    instance: str,
) -> bytes:
    """The event as a Flux controller posts it to notification-controller (``eventv1.Event``
    of ``fluxcd/pkg/apis/event/v1beta1``). ``delivery`` is its metadata token, so each event
    is its own to notification-controller's duplicate filter and a repeat of it is not."""
    meta = stack.get("metadata") or {}
    api_version = str(stack.get("apiVersion") or "pulumi.com/v1")
    prefix = api_version.partition("/")[0] + "/"
    event = str(entry.get("event") or "")
    moment = parse_time(entry.get("time"))
    metadata = {
        f"{prefix}event": event,
        f"{prefix}token": delivery,
        f"{prefix}revision": flux_revision(str(entry.get("revision") or "")),
        f"{prefix}run": str(entry.get("run") or ""),
        f"{prefix}operation": str(entry.get("operation") or ""),
    }
    body = {
        "involvedObject": {
            "apiVersion": api_version,
            "kind": str(stack.get("kind") or "Stack"),
            "namespace": str(meta.get("namespace") or ""),
            "name": str(meta.get("name") or ""),
            "uid": str(meta.get("uid") or ""),
        },
        "severity": "error" if event in FLUX_ERROR_EVENTS else "info",
        "timestamp": format_time(moment) if moment else str(entry.get("time") or ""),
        "message": str(entry.get("summary") or ""),
        "reason": flux_reason(event),
        "metadata": {key: value for key, value in metadata.items() if value},
        "reportingController": controller,
        "reportingInstance": instance,
    }
    return json.dumps(body, sort_keys=True).encode()


def delivery_id(stack: Mapping[str, Any], event_id: str) -> str:
    """The same for every attempt and every restart: receivers may drop repeats by it."""
    return f"{(stack.get('metadata') or {}).get('uid') or ''}/{event_id}"


def signature(key: bytes, body: bytes) -> str:
    """``X-Pkobatch-Signature``: HMAC-SHA256 of the raw body, as GitHub signs webhooks."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verdict(status_code: int | None, receiver_type: ReceiverType = "webhook") -> Verdict:
    """What an answer means: None is no answer (refused, reset, timed out). A 4xx other than
    408 and 429 will not change by retrying (a wrong URL, a payload the receiver refuses).
    notification-controller answers 429 to an event it got already (its duplicate filter,
    which Flux's own event recorder does not retry either): that one has arrived."""
    if status_code is None:
        return "retry"
    if 200 <= status_code < 300 or (receiver_type == "flux" and status_code == 429):
        return "sent"
    if status_code in (408, 429) or status_code >= 500:
        return "retry"
    return "failed"


def destination_refusal(
    address: str, denied: Sequence[Network], allowed: Sequence[Network]
) -> str | None:
    """Why no notification may be sent to ``address`` (an IP address a receiver's host
    resolved to; None: it may). ``allowed`` wins over everything else."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in network for network in allowed):
        return None
    for what, networks in ALWAYS_REFUSED:
        if any(ip in network for network in networks):
            return f"{ip} is {what}"
    for network in denied:
        if ip in network:
            return f"{ip} is in {network}, a range of PKOBATCH_NOTIFICATIONS__DENIED_CIDRS"
    return None


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds before attempt ``attempt + 1`` after ``attempt`` failed: base x 2^(attempt-1),
    at most ``cap``."""
    return float(min(cap, base * 2 ** max(attempt - 1, 0)))
