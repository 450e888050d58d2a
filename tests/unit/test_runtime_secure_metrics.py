"""Secure metrics without an API server: the self-signed certificate serves TLS for its
name, and a request without a bearer token is refused before any review."""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any, cast

from cryptography import x509

from pkobatch.kube.client import Kube
from pkobatch.runtime.secure_metrics import (
    MetricsAuthorizer,
    self_signed_certificate,
    server_context,
)


class NoApiServer:
    def create(self, *args: Any) -> Any:
        raise AssertionError("no review without a token")


def test_self_signed_certificate_names_the_host() -> None:
    cert_pem, _ = self_signed_certificate("pkobatch-controller-0")
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["pkobatch-controller-0"]
    # The context made without a certificate directory completes a verified handshake.
    server = server_context("", "localhost")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            connection, _ = listener.accept()
            with server.wrap_socket(connection, server_side=True) as tls:
                tls.sendall(b"ok")

        thread = threading.Thread(target=accept)
        thread.start()
        client = ssl.create_default_context()
        client.check_hostname = False
        client.verify_mode = ssl.CERT_NONE
        with (
            socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
            client.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            peer = x509.load_der_x509_certificate(tls.getpeercert(binary_form=True) or b"")
            assert tls.recv(2) == b"ok"
        thread.join(30)
    assert peer.subject.rfc4514_string() == "CN=localhost"


def test_no_bearer_token_is_401_without_a_review() -> None:
    authorizer = MetricsAuthorizer(cast(Kube, NoApiServer()))
    for headers in ({}, {"authorization": "Basic dTpw"}, {"authorization": "Bearer "}):
        refused = authorizer.refusal(headers)
        assert refused is not None and refused[0] == 401, headers
