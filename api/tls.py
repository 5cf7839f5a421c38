"""The client certificate of a TLS connection, for the authentication that reads it: on the
binary protocol ``PulsarConnection.peer_certificate``; over HTTPS the ASGI scope's
``scope["extensions"]["tls"]["peer_certificate"]``, which :func:`peer_certificate_of` reads.

Both are the dict of ``ssl.SSLObject.getpeercert()`` (``subject``, ``issuer``,
``subjectAltName``, ``notAfter``, ...), of a certificate OpenSSL has verified against
``COMPACTOR_TLS_TRUST_CERTS_FILE_PATH`` during the handshake (``service.tls``); None on plain TCP,
or when the client sent none.

uvicorn does not put the certificate in the scope: ``api.web_servers.TlsHttpProtocol`` does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import HTTPConnection


def peer_certificate(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The verified client certificate of ``transport``'s TLS session, or None (plain TCP, no
    certificate sent, or none asked for)."""
    if transport.get_extra_info("sslcontext") is None:
        return None
    # An empty dict: a certificate not verified (none was asked for); never one to trust.
    cert = transport.get_extra_info("peercert")
    return dict(cert) if cert else None


def peer_certificate_of(connection: HTTPConnection) -> dict[str, Any] | None:
    """The client certificate of the HTTPS connection a request (or websocket) came on, or
    None (plain HTTP, or none sent)."""
    tls = connection.scope.get("extensions", {}).get("tls")
    return tls.get("peer_certificate") if tls else None
