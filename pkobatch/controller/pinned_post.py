"""One POST to a notification receiver, connected to an address checked first.

The receiver's host is resolved once; every address is judged (``notify.destination_refusal``)
and the request connects to the first one allowed — that address, not a second resolution of
the name, so a name that resolves differently the next time (DNS rebinding) cannot lead the
request elsewhere. The Host header, SNI and certificate name stay the receiver's host. There is
no proxy from the environment (it would connect wherever the name leads) and no redirect.

Errors are ``DeliveryFailed``: its message (for the controller's log) never holds the secret
values the caller names; ``public`` is all a Stack's Event says.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Sequence
from typing import Final

from pkobatch.controller.notify import Network, destination_refusal

# What a NotificationFailed Event says about a delivery that failed for a reason outside the
# Stack's own configuration: nothing about what answered, or whether anything did.
GENERIC_FAILURE: Final = "delivery failed"


class DeliveryFailed(Exception):
    """An attempt that got no usable answer: the message (free of secret values) is for the
    controller's log; ``public`` is all a Stack's Event says; ``status`` is the HTTP status
    when there was one."""

    def __init__(
        self, message: str, status: int | None = None, public: str = GENERIC_FAILURE
    ) -> None:
        super().__init__(message)
        self.status = status
        self.public = public


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to ``host`` (its Host header), connected to the checked ``address``."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to ``host`` (its Host header, SNI and certificate name), connected to the
    checked ``address``."""

    def __init__(
        self, host: str, port: int, address: str, timeout: float, tls: ssl.SSLContext
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self.address = address
        self.tls = tls

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def scrubbed(text: str, *secrets: str) -> str:
    """``text`` with each non-empty secret value replaced."""
    for value in secrets:
        if value:
            text = text.replace(value, "[redacted]")
    return text


def pinned_address(
    host: str, port: int, denied: Sequence[Network], allowed: Sequence[Network]
) -> str:
    """The first address ``host`` resolves to that notifications may go to; a refused or
    unresolvable host fails like one that does not answer (a retry). The refusal names
    addresses, not the host (part of the receiver's secret URL)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DeliveryFailed(f"the receiver's host does not resolve: {exc}") from None
    refusals = []
    for *_, sockaddr in found:
        address = str(sockaddr[0])
        refusal = destination_refusal(address, denied, allowed)
        if refusal is None:
            return address
        refusals.append(refusal)
    raise DeliveryFailed(
        f"destination refused: {'; '.join(dict.fromkeys(refusals))} (an operator may allow "
        "a range with PKOBATCH_NOTIFICATIONS__ALLOWED_CIDRS)"
    )


def post_to(
    host: str,
    port: int,
    address: str,
    target: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    tls: ssl.SSLContext | None,
    secrets: Sequence[str],
) -> int:
    """POST ``body`` to ``target`` on ``host`` through ``address`` (HTTPS when ``tls`` is
    given); the HTTP status. A failure's message has ``secrets`` scrubbed from it."""
    connection: http.client.HTTPConnection = (
        _PinnedHTTPSConnection(host, port, address, timeout, tls)
        if tls is not None
        else _PinnedHTTPConnection(host, port, address, timeout)
    )
    try:
        connection.request("POST", target, body=body, headers=headers)
        return connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(scrubbed(f"no answer from {address}: {exc}", *secrets)) from None
    finally:
        connection.close()
