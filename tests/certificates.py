"""Throw-away certificates for the TLS tests, made at test time (no key file is committed): a
CA, a server certificate it signs for ``localhost`` and ``127.0.0.1``, a client certificate it
signs, and a second CA with a client certificate of its own (one the service must not trust)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: ``ca`` signs ``server`` and ``client``; ``other_ca`` signs ``stranger``."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    stranger_cert: Path
    stranger_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _certificate(
    cn: str, key: ec.EllipticCurvePrivateKey, issuer: Issuer | None, *, server: bool = False, ca: bool = False
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(signer_cert.subject if signer_cert is not None else _name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if signer_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), critical=False
        )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer_key, hashes.SHA256())


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.cert.pem", directory / f"{stem}.key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def _issue(
    directory: Path, stem: str, cn: str, issuer: Issuer | None, **kind: bool
) -> tuple[Path, Path, Issuer]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(cn, key, issuer, **kind)
    cert_path, key_path = _write(directory, stem, cert, key)
    return cert_path, key_path, (cert, key)


def make_tls_files(directory: Path, *, client_cn: str = "app1") -> TlsFiles:
    """Every file of :class:`TlsFiles`, written under ``directory``; the client certificates'
    common name (the role the tls authentication provider gives) is ``client_cn``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, _, ca_issuer = _issue(directory, "ca", "compactor test CA", None, ca=True)
    server_cert, server_key, _ = _issue(directory, "server", "localhost", ca_issuer, server=True)
    client_cert, client_key, _ = _issue(directory, "client", client_cn, ca_issuer)
    other_ca, _, other_issuer = _issue(directory, "other-ca", "another CA", None, ca=True)
    stranger_cert, stranger_key, _ = _issue(directory, "stranger", client_cn, other_issuer)
    return TlsFiles(
        ca, server_cert, server_key, client_cert, client_key, other_ca, stranger_cert, stranger_key
    )
