"""Key material for the local control plane: a CA, the API server's serving certificate, an
admin client certificate (group ``system:masters``), the service-account signing key, and the
pair a kubelet has with the API server: the node agent's serving certificate (its
container-log endpoint) and the API server's client certificate for calling it. The real
node's components get certificates of the same CA (``client_certificate``,
``write_serving_certificate``), issued at each start.

Generated once per state directory and reused, so tokens and kubeconfigs stay valid when a
control plane is restarted on the same data.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "pkobatch.dev needs the 'cryptography' package: pip install 'pkobatch[dev]'"
    ) from exc

_VALIDITY = datetime.timedelta(days=365)
ADMIN_USER = "pkobatch-admin"


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def kubelet_cert(self) -> Path:
        return self.directory / "kubelet.crt"

    @property
    def kubelet_key(self) -> Path:
        return self.directory / "kubelet.key"

    @property
    def kubelet_client_cert(self) -> Path:
        return self.directory / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.directory / "apiserver-kubelet-client.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_public_key(self) -> Path:
        return self.directory / "sa.pub"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _load_ca(pki: Pki) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key} is not the EC key this module writes")
    return key, x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject


def _leaf(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Name],
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
) -> tuple[bytes, bytes]:
    """A certificate for ``subject`` signed by ``ca`` and its key, both PEM."""
    ca_key, ca_name = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca_name)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _ip_sans(ips: list[str]) -> list[x509.GeneralName]:
    return [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(set(ips))]


def _serving_certificate(
    ca: tuple[ec.EllipticCurvePrivateKey, x509.Name], serving_ips: list[str]
) -> tuple[bytes, bytes]:
    sans: list[x509.GeneralName] = [
        x509.DNSName(name)
        for name in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    return _leaf(
        ca, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans + _ip_sans(serving_ips)
    )


def _covers(cert_path: Path, ips: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    present = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    return {str(ipaddress.ip_address(ip)) for ip in ips} <= present


def ensure_pki(directory: Path, serving_ips: list[str]) -> Pki:
    """Create the key material in ``directory`` unless it is already complete. A complete
    set whose serving certificate lacks one of ``serving_ips`` (the API server moved to
    another address) gets a new serving certificate from the same CA."""
    pki = Pki(directory)
    wanted = (
        pki.ca_cert,
        pki.ca_key,
        pki.serving_cert,
        pki.serving_key,
        pki.admin_cert,
        pki.admin_key,
        pki.kubelet_cert,
        pki.kubelet_key,
        pki.kubelet_client_cert,
        pki.kubelet_client_key,
        pki.service_account_key,
        pki.service_account_public_key,
    )
    if all(p.is_file() for p in wanted):
        if not _covers(pki.serving_cert, serving_ips):
            serving_cert, serving_key = _serving_certificate(_load_ca(pki), serving_ips)
            pki.serving_cert.write_bytes(serving_cert)
            _write_private(pki.serving_key, serving_key)
        return pki
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("pkobatch-dev-ca")
    ca_cert = (
        _builder(ca_name, ca_name)
        .public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca = (ca_key, ca_name)
    serving_cert, serving_key = _serving_certificate(ca, serving_ips)
    admin_cert, admin_key = _leaf(
        ca, _name(ADMIN_USER, "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, []
    )
    kubelet_cert, kubelet_key = _leaf(
        ca,
        _name("pkobatch-dev-node"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    kubelet_client_cert, kubelet_client_key = _leaf(
        ca,
        _name("kube-apiserver-kubelet-client", "system:masters"),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        [],
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki.ca_key, _key_pem(ca_key))
    pki.serving_cert.write_bytes(serving_cert)
    _write_private(pki.serving_key, serving_key)
    pki.admin_cert.write_bytes(admin_cert)
    _write_private(pki.admin_key, admin_key)
    pki.kubelet_cert.write_bytes(kubelet_cert)
    _write_private(pki.kubelet_key, kubelet_key)
    pki.kubelet_client_cert.write_bytes(kubelet_client_cert)
    _write_private(pki.kubelet_client_key, kubelet_client_key)
    _write_private(pki.service_account_key, _key_pem(sa_key))
    pki.service_account_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def client_certificate(pki: Pki, user: str, group: str | None = None) -> tuple[bytes, bytes]:
    """A client certificate of ``pki``'s CA for ``user`` (in ``group``) and its key, PEM:
    how the real node's kubelet, kube-proxy and kube-scheduler authenticate."""
    return _leaf(_load_ca(pki), _name(user, group), ExtendedKeyUsageOID.CLIENT_AUTH, [])


def write_serving_certificate(
    pki: Pki, name: str, ips: list[str], cert_path: Path, key_path: Path
) -> None:
    """A serving certificate of ``pki``'s CA for ``name`` at ``ips`` (a kubelet the API
    server verifies with its ``--kubelet-certificate-authority``), written to the paths."""
    cert, key = _leaf(
        _load_ca(pki),
        _name(name),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName(name), *_ip_sans(ips)],
    )
    cert_path.write_bytes(cert)
    _write_private(key_path, key)
