"""Where git credentials may travel: never over plain ``http://`` unless the host is allowed.

The controller's branch poller and the runner both send a Stack's git credentials (an
``Authorization`` header, or a user name and password) to the Stack's ``projectRepo``.
Over ``http://`` anyone on the path reads them, loopback included (a local proxy, a
sidecar, a port-forward). So both refuse, unless the controller setting
``PKOBATCH_INSECURE_HTTP_GIT_HOSTS`` names the host (``host`` or ``host:port``). The same
rule, in one place, decides for both.

Both also tell a git server's refusal of the credentials from other git failures
(``refused_credentials``), to name the credentials to fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

SETTING_ENV: Final = "PKOBATCH_INSECURE_HTTP_GIT_HOSTS"


def plain_http_host(url: str) -> str | None:
    """``host`` or ``host:port`` of a plain ``http://`` URL; None for any other URL."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.scheme.lower() != "http":
        return None
    netloc = parts.netloc.rpartition("@")[2].lower()
    return netloc or None


def has_url_credentials(url: str) -> bool:
    """The URL carries a user name or password itself (``http://user:pass@host``)."""
    try:
        return "@" in urlsplit(url.strip()).netloc
    except ValueError:
        return False


def credentials_allowed(url: str, allowed_hosts: Iterable[str]) -> bool:
    """May credentials be sent to ``url``? Always for https/ssh; for http only to allowed hosts."""
    host_port = plain_http_host(url)
    if host_port is None:
        return True
    host = host_port.rsplit(":", 1)[0] if not host_port.endswith("]") else host_port
    allowed = {entry.strip().lower() for entry in allowed_hosts if entry.strip()}
    return host_port in allowed or host in allowed


def refusal_message(url: str, what: str) -> str:
    """Why ``what`` (e.g. "spec.gitAuth") is not sent to ``url``, and what to change."""
    host = plain_http_host(url) or url
    return (
        f"{what} would be sent over plain http:// to {host}, where anyone on the path can "
        "read them: use an https:// or ssh URL, or ask the operator to allow this host with "
        f"the controller setting {SETTING_ENV}={host}"
    )


# What git prints when the server refused the credentials sent, or wanted some and got none
# (pkobatch disables git's prompts): HTTP 401/403, or SSH's refusal of the key.
_AUTHENTICATION_REFUSED: Final = re.compile(
    r"Authentication failed for|could not read (Username|Password) for"
    r"|The requested URL returned error: 40[13]|Permission denied \(publickey"
)


def refused_credentials(git_output: str) -> bool:
    """Whether a failed git command's output says the server refused its credentials."""
    return _AUTHENTICATION_REFUSED.search(git_output) is not None
