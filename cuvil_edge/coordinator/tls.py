"""TLS material for the coordinator's SuperLink: a private CA and a server certificate.

``make_certs(directory, hosts)`` writes::

    ca.crt      the CA certificate (pin it on every agent: `cuvil-edge agent init --ca`)
    ca.key      the CA's private key (0600; keep offline once the server certificate exists)
    server.crt  the SuperLink's certificate, signed by the CA, valid for ``hosts``
    server.key  its private key (0600)

EC P-256 keys, SHA-256 signatures, made with ``cryptography`` alone.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import ConfigError, KeyFileError

CA_VALIDITY_DAYS = 3650
SERVER_VALIDITY_DAYS = 825


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def tls_files(directory: Path) -> TlsFiles:
    d = Path(directory)
    return TlsFiles(d / "ca.crt", d / "ca.key", d / "server.crt", d / "server.key")


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cuvil-edge federation"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not host or any(c.isspace() or c in "/\\" for c in host):
                raise ConfigError(f"{host!r} is neither an IP address nor a host name") from None
            names.append(x509.DNSName(host))
    return names


#: The SuperLink itself listens on loopback behind the Fleet gateway (coordinator/fleet_gateway.py);
#: the gateway, the executor and the operator's CLI reach it there with the same certificate.
LOOPBACK = "127.0.0.1"


def _with_loopback(hosts: Sequence[str]) -> list[str]:
    return list(hosts) + ([LOOPBACK] if LOOPBACK not in hosts else [])


def covers_loopback(cert_path: Path) -> bool:
    """Whether the server certificate is valid for 127.0.0.1 (certificates made before the SuperLink
    moved behind the gateway may not be)."""
    import ipaddress

    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return ipaddress.ip_address(LOOPBACK) in names.get_values_for_type(x509.IPAddress)


def _save_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    atomic_write(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        mode=0o600,
    )


def make_certs(
    directory: Path, hosts: Sequence[str], *, force: bool = False, now: datetime.datetime | None = None
) -> TlsFiles:
    """A CA (kept if it exists) and a server certificate for ``hosts`` (IP addresses or DNS names).

    Raises:
        ConfigError: no hosts, or a host that is neither an address nor a name.
        KeyFileError: a server certificate exists and ``force`` is not set, or the CA is unreadable.
    """
    if not hosts:
        raise ConfigError("give at least one --host the SuperLink is reached at (e.g. 127.0.0.1)")
    files = tls_files(directory)
    Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
    if files.server_cert.exists() and not force:
        raise KeyFileError(f"{files.server_cert} exists; use --force to issue a new server certificate")
    now = now or datetime.datetime.now(datetime.UTC)
    if files.ca_cert.exists() and files.ca_key.exists():
        try:
            ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
            ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        except (OSError, ValueError) as e:
            raise KeyFileError(f"cannot read the CA in {directory}: {e}") from e
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("cuvil-edge CA"))
            .issuer_name(_name("cuvil-edge CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
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
        _save_key(ca_key, files.ca_key)
        atomic_write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName(_alt_names(_with_loopback(hosts))), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]  # the EC key this module writes
    )
    _save_key(server_key, files.server_key)
    atomic_write(files.server_cert, server.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return files
