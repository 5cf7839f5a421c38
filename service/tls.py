"""The TLS of both ports, as Pulsar's broker configures it: one server context from the
settings (``tlsCertificateFilePath``, ``tlsKeyFilePath``, ``tlsTrustCertsFilePath``,
``tlsRequireTrustedClientCertOnConnect``, ``tlsProtocols``, ``tlsCiphers``), used by the binary
protocol's TLS port and the HTTPS port alike, and the start-up check of those settings.

Client certificates: with a trust file, every handshake asks for one (``CERT_OPTIONAL``) and
OpenSSL checks one that is sent against the trusted CAs (an untrusted one fails the handshake);
with ``tls_require_trusted_client_cert_on_connect`` a handshake without one fails too
(``CERT_REQUIRED``). Without a trust file none is asked for. The certificate a client proved
is then the connection's (``PulsarConnection.peer_certificate``, the ASGI scope's
``extensions.tls.peer_certificate``) for the TLS authentication provider.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Protocol


class TlsSettings(Protocol):
    """What of ``service.settings.Settings`` the TLS contexts read (a protocol: ``Settings``
    calls :func:`check_tls_settings` as it validates itself)."""

    port: int
    broker_service_port: int
    broker_service_port_tls: int | None
    web_service_port_tls: int | None
    tls_cert_file: Path | None
    tls_key_file: Path | None
    tls_trust_certs_file_path: Path | None
    tls_require_trusted_client_cert_on_connect: bool
    tls_protocols: frozenset[str]
    tls_ciphers: frozenset[str]


#: Pulsar's names of the TLS versions this service accepts (older ones are not offered).
PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server-side context for the configured certificate and key; ``ssl.SSLError`` or
    ``OSError`` when a file cannot be read or a protocol or cipher is not known."""
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
    if settings.tls_protocols:
        versions = sorted(PROTOCOLS[p] for p in settings.tls_protocols)
        context.minimum_version, context.maximum_version = versions[0], versions[-1]
    if settings.tls_ciphers:
        context.set_ciphers(":".join(sorted(settings.tls_ciphers)))
    if settings.tls_trust_certs_file_path is not None:
        context.load_verify_locations(cafile=str(settings.tls_trust_certs_file_path))
        context.verify_mode = (
            ssl.CERT_REQUIRED if settings.tls_require_trusted_client_cert_on_connect else ssl.CERT_OPTIONAL
        )
    return context


def check_tls_settings(settings: TlsSettings) -> None:
    """``ValueError`` with the setting at fault when the TLS settings cannot serve: a TLS port
    without certificate and key, a client certificate required without CAs to check it, two
    listeners on one port, or files, protocols or ciphers OpenSSL refuses."""
    ports = {
        "COMPACTOR_BROKER_SERVICE_PORT_TLS": settings.broker_service_port_tls,
        "COMPACTOR_WEB_SERVICE_PORT_TLS": settings.web_service_port_tls,
    }
    for name, port in ports.items():
        if port is not None and settings.tls_cert_file is None:
            raise ValueError(
                f"{name} serves TLS, which needs a certificate and its key: set COMPACTOR_TLS_CERT_FILE "
                "and COMPACTOR_TLS_KEY_FILE"
            )
    if settings.tls_require_trusted_client_cert_on_connect and settings.tls_trust_certs_file_path is None:
        raise ValueError(
            "COMPACTOR_TLS_REQUIRE_TRUSTED_CLIENT_CERT_ON_CONNECT needs the CAs client certificates are "
            "checked against: set COMPACTOR_TLS_TRUST_CERTS_FILE_PATH"
        )
    bound = {
        "COMPACTOR_PORT": settings.port,
        "COMPACTOR_BROKER_SERVICE_PORT": settings.broker_service_port,
        **ports,
    }
    seen: dict[int, str] = {}
    for name, port in bound.items():
        if port:  # 0: off, or any free port (never one of the others)
            if port in seen:
                raise ValueError(f"{seen[port]} and {name} are both {port}: each listener needs a port")
            seen[port] = name
    unknown = sorted(settings.tls_protocols - PROTOCOLS.keys())
    if unknown:
        raise ValueError(f"tls_protocols: {', '.join(unknown)} not accepted; use {' or '.join(PROTOCOLS)}")
    if settings.tls_cert_file is None:
        return
    try:
        server_context(settings)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"TLS: the certificate, key, trusted CAs or ciphers are not usable: {e}") from None
