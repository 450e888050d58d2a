"""The push receiver: push webhooks make the branch poller fetch a branch now.

Off unless ``PKOBATCH_RECEIVER__ADDR`` is set. It listens only while this replica leads
(it starts and stops with the branch poller, in the reconciler's ``start``/``stop``) and
serves one URL per receiver of ``Settings.receiver.receivers``: ``POST /hooks/<name>``.
Each request, in this order:

1. a receiver of that name exists (else 404);
2. the receiver's token bucket holds a token (else 429 with ``Retry-After``): every request
   to a receiver takes one, verified or not, so nobody makes the controller run more than
   ``rate`` ``ls-remote`` a second per receiver, nor read more than that many bodies;
3. the body has a Content-Length (411) of at most ``MAX_BODY_BYTES`` (413);
4. the receiver's secret, read from ``<secrets_dir>/<name>`` on every request (so a rotated
   Secret applies without a restart; 503 while it is missing), verifies the request
   (``controller.push.verify``; else 401);
5. the push names a repository and branch (400 if not; a ping, tag or other event: 200,
   nothing done); no polled Stack follows that repository: 404; none follows that branch of
   it: 200, nothing done; otherwise 202 and ``GitPoller.refresh``: the branch's
   ``ls-remote`` runs now and its Stacks are enqueued if the head moved.

The secret never reaches a log, a reply or a metric. Replies are one line of text saying
why; ``pkobatch_receiver_requests_total{receiver, code}`` counts them (the receiver label
is empty for an unknown path, so no caller can make new series).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from pkobatch.config import ReceiverSettings
from pkobatch.controller.polling import GitPoller
from pkobatch.controller.push import Ignored, Refused, read_push, verify
from pkobatch.kube.ratelimit import TokenBucket
from pkobatch.runtime.health import HttpEndpoints, PostRequest, Reply

log = logging.getLogger(__name__)

HOOKS_PATH: Final = "/hooks/"
# GitHub caps a push's commit list at 20; GitLab's is similar. Larger bodies are refused
# (the next poll still finds the commit).
MAX_BODY_BYTES: Final = 4 * 1024 * 1024


class PushReceiver:
    """``POST /hooks/<name>`` on ``settings.addr`` (see the module docstring)."""

    def __init__(
        self,
        settings: ReceiverSettings,
        poller: GitPoller,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._settings = settings
        self._poller = poller
        self._kinds = settings.kinds
        self._buckets = {name: TokenBucket(settings.rate, settings.burst) for name in self._kinds}
        self._endpoints: HttpEndpoints | None = None
        self._requests = Counter(
            "pkobatch_receiver_requests",
            "push webhook requests answered by the push receiver, by receiver and HTTP status",
            ["receiver", "code"],
            registry=registry,
        )

    @property
    def port(self) -> int:
        """The port it listens on (after ``start``)."""
        assert self._endpoints is not None, "the receiver is not started"
        return self._endpoints.port

    def start(self) -> None:
        self._endpoints = HttpEndpoints(self._settings.addr, {}, post=self.answer)
        self._endpoints.start()
        log.info(
            "push receiver listening",
            extra={"addr": self._settings.addr, "receivers": sorted(self._kinds)},
        )

    def stop(self) -> None:
        if self._endpoints is not None:
            self._endpoints.stop()
            self._endpoints = None

    def answer(self, request: PostRequest) -> Reply:
        name = request.path.removeprefix(HOOKS_PATH) if request.path.startswith(HOOKS_PATH) else ""
        kind = self._kinds.get(name)
        if kind is None:
            reply = Reply(404, f"no receiver at {request.path[:100]}: receivers are at /hooks/NAME")
            name = ""
        else:
            reply = self._receive(name, kind, request)
        self._requests.labels(name, str(reply.status)).inc()
        # Requests over the rate limit or to no receiver are counted, not logged at info: a
        # flood must not flood the log.
        level = logging.DEBUG if reply.status == 429 or not name else logging.INFO
        log.log(level, "push webhook: %s", reply.message, extra={"receiver": name or None})
        return reply

    def _receive(self, name: str, kind: str, request: PostRequest) -> Reply:
        wait = self._buckets[name].take()
        if wait > 0:
            return Reply(
                429,
                f"receiver {name} accepts {self._settings.rate:g} requests a second (burst "
                f"{self._settings.burst}): retry later",
                {"Retry-After": str(math.ceil(wait))},
            )
        if request.length is None:
            return Reply(411, "a Content-Length header is required")
        if request.length > MAX_BODY_BYTES:
            return Reply(413, f"the body is over {MAX_BODY_BYTES} bytes")
        body = request.read()
        secret = self._secret(name)
        if secret is None:
            return Reply(
                503,
                f"receiver {name} has no secret yet: the controller reads it from "
                f"{self._settings.secrets_dir}/{name}",
            )
        try:
            verify(kind, secret, request.headers, body)
            push = read_push(kind, request.headers, body)
        except Refused as refused:
            return Reply(refused.status, str(refused))
        if isinstance(push, Ignored):
            return Reply(200, f"nothing to do: {push.reason}")
        on_repository, pushed = self._poller.refresh(push.repositories, push.ref)
        if not on_repository:
            return Reply(
                404,
                f"no Stack follows the pushed repository ({', '.join(sorted(push.repositories))})"
                " through this controller",
            )
        if not pushed:
            return Reply(200, f"nothing to do: no Stack follows {push.ref} of that repository")
        return Reply(202, f"fetching the head of {push.ref} now ({pushed} polled branches)")

    def _secret(self, name: str) -> bytes | None:
        path = Path(self._settings.secrets_dir) / name
        try:
            secret = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            log.error("push receiver %s: cannot read its secret %s: %s", name, path, exc.strerror)
            return None
        if not secret:
            log.error("push receiver %s: its secret %s is empty", name, path)
            return None
        return secret
