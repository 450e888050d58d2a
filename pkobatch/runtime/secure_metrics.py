"""Secure metrics (``PKOBATCH_METRICS_SECURE``), as controller-runtime's
``filters.WithAuthenticationAndAuthorization`` serves them: HTTPS, the caller's bearer token
checked with a TokenReview, and its user allowed a ``get`` of the non-resource URL
``/metrics`` by a SubjectAccessReview (the ClusterRole ``pkobatch-metrics-reader`` grants it).

No token or a token the API server does not accept: 401. An authenticated user without the
permission: 403. An answer is kept for ``CACHE_SECONDS`` so a scrape every few seconds costs
no API requests.

The certificate is ``tls.crt``/``tls.key`` of a mounted directory (cert-manager's Secret
layout), or, without one, a self-signed certificate made at start-up.
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pkobatch.kube.client import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, Kube
from pkobatch.runtime.health import Response, Route

CACHE_SECONDS: Final = 60.0
METRICS_PATH: Final = "/metrics"
CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
SELF_SIGNED_DAYS: Final = 365

Refusal = tuple[int, str]


def server_context(cert_dir: str, host_name: str) -> ssl.SSLContext:
    """A TLS server context with ``cert_dir``'s certificate, or a self-signed one for
    ``host_name`` when ``cert_dir`` is empty."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        directory = Path(cert_dir)
        context.load_cert_chain(directory / CERT_FILE, directory / KEY_FILE)
        return context
    cert, key = self_signed_certificate(host_name)
    # ssl loads certificates only from files: hand them over in a private directory.
    with tempfile.TemporaryDirectory() as temporary:
        cert_path, key_path = Path(temporary, CERT_FILE), Path(temporary, KEY_FILE)
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)
    return context


def self_signed_certificate(host_name: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for ``host_name``, valid for SELF_SIGNED_DAYS."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class MetricsAuthorizer:
    """Decides, with the API server, whether a request may read ``/metrics``."""

    def __init__(self, kube: Kube, cache_seconds: float = CACHE_SECONDS) -> None:
        self._kube = kube
        self._cache_seconds = cache_seconds
        self._answers: dict[str, tuple[float, Refusal | None]] = {}
        self._lock = threading.Lock()

    def refusal(self, headers: Mapping[str, str]) -> Refusal | None:
        """None if the request's bearer token may get /metrics, else (status, message)."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "Unauthorized: send a ServiceAccount token as Authorization: Bearer"
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            cached = self._answers.get(key)
            if cached is not None and cached[0] > now:
                return cached[1]
        answer = self._review(token.strip())
        with self._lock:
            # Expired answers go when the next one is stored: the map stays as small as the
            # set of scrapers.
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            self._answers[key] = (now + self._cache_seconds, answer)
        return answer

    def _review(self, token: str) -> Refusal | None:
        review = self._kube.create(
            TOKEN_REVIEWS,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, "Unauthorized: the API server does not accept this token"
        user = status.get("user") or {}
        access = self._kube.create(
            SUBJECT_ACCESS_REVIEWS,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username", ""),
                    "uid": user.get("uid", ""),
                    "groups": user.get("groups") or [],
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
                },
            },
        )
        if (access.get("status") or {}).get("allowed"):
            return None
        return 403, (
            f"Forbidden: {user.get('username', '')} may not get {METRICS_PATH} "
            "(bind the ClusterRole pkobatch-metrics-reader)"
        )


def authorized(authorizer: MetricsAuthorizer, route: Route) -> Route:
    """``route`` behind ``authorizer``."""

    def guarded(headers: Mapping[str, str]) -> Response:
        refused = authorizer.refusal(headers)
        if refused is None:
            return route(headers)
        status, message = refused
        return status, {"Content-Type": "text/plain; charset=utf-8"}, f"{message}\n".encode()

    return guarded
