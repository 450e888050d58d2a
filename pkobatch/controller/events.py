"""Kubernetes Events about Stacks (``events.k8s.io/v1``), with PKO's reasons.

Events are best effort: a failure to post one is logged and never fails a reconcile. Their
text comes from the plan (run outcomes, spec problems), which never holds secret values:
results redact secrets in the runner, and specs only name Secrets.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pkobatch.api.messages import bound_message
from pkobatch.api.timestamps import format_micro_time
from pkobatch.kube.client import EVENTS, Kube, KubeError

log = logging.getLogger(__name__)

REPORTING_CONTROLLER: Final = "pkobatch.io/controller"
ACTION: Final = "Reconcile"
MAX_NOTE_CHARS: Final = 1024


def event_body(
    stack: Mapping[str, Any],
    event_type: str,
    reason: str,
    message: str,
    now: datetime,
    instance: str,
) -> dict[str, Any]:
    meta = stack.get("metadata") or {}
    note = bound_message(message, MAX_NOTE_CHARS)
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
            "namespace": meta.get("namespace"),
        },
        "eventTime": format_micro_time(now),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": instance,
        "action": ACTION,
        "reason": reason,
        "note": note,
        "type": event_type,
        "regarding": {
            "apiVersion": stack.get("apiVersion", "pulumi.com/v1"),
            "kind": stack.get("kind", "Stack"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
    }


class EventRecorder:
    def __init__(self, kube: Kube, instance: str | None = None) -> None:
        self._kube = kube
        self._instance = (instance or socket.gethostname())[:128]

    def post(self, stack: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        body = event_body(stack, event_type, reason, message, datetime.now(UTC), self._instance)
        try:
            self._kube.create(EVENTS, body, body["metadata"]["namespace"])
        except KubeError as exc:
            log.warning(
                "cannot post event %s for stack %s/%s: %s",
                reason,
                body["metadata"]["namespace"],
                body["regarding"]["name"],
                exc,
            )
