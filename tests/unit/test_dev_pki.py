"""The local control plane's key material: certificates the real node's components
authenticate with, and a serving certificate that follows the API server's address."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pkobatch.dev.pki import client_certificate, ensure_pki, write_serving_certificate


def load(path_or_pem: Path | bytes) -> x509.Certificate:
    pem = path_or_pem.read_bytes() if isinstance(path_or_pem, Path) else path_or_pem
    return x509.load_pem_x509_certificate(pem)


def ip_sans(cert: x509.Certificate) -> set[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


def test_a_new_address_gets_a_new_serving_certificate_from_the_same_ca(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, ["127.0.0.1", "192.0.2.2"])
    ca, admin = pki.ca_cert.read_bytes(), pki.admin_cert.read_bytes()
    first = pki.serving_cert.read_bytes()
    assert ip_sans(load(first)) == {"127.0.0.1", "192.0.2.2"}

    ensure_pki(tmp_path, ["127.0.0.1", "192.0.2.2"])
    assert pki.serving_cert.read_bytes() == first  # complete and covering: kept

    ensure_pki(tmp_path, ["127.0.0.1", "10.243.0.1"])
    moved = load(pki.serving_cert)
    assert ip_sans(moved) == {"127.0.0.1", "10.243.0.1"}
    assert pki.ca_cert.read_bytes() == ca and pki.admin_cert.read_bytes() == admin
    moved.verify_directly_issued_by(load(pki.ca_cert))


def test_client_and_kubelet_serving_certificates_come_from_the_ca(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, ["127.0.0.1"])
    ca = load(pki.ca_cert)
    cert_pem, key_pem = client_certificate(pki, "system:node:n1", "system:nodes")
    client = load(cert_pem)
    client.verify_directly_issued_by(ca)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert (
        client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    )
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert b"PRIVATE KEY" in key_pem

    write_serving_certificate(pki, "n1", ["10.243.0.2"], tmp_path / "k.crt", tmp_path / "k.key")
    serving = load(tmp_path / "k.crt")
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["n1"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.243.0.2")]
    assert (tmp_path / "k.key").stat().st_mode & 0o777 == 0o600
