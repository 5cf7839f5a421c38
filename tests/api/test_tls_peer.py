"""The client certificate a TLS connection proved, where the authentication reads it: the
binary protocol's ``PulsarConnection.peer_certificate`` and, over HTTPS, the ASGI scope's
``extensions.tls.peer_certificate`` (``api.tls.peer_certificate_of``); None without one."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from api.app import create_app
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from api.tls import peer_certificate_of
from api.web_servers import TlsHttpProtocol
from service.settings import Settings
from service.tls import server_context
from tests.certificates import TlsFiles
from tests.e2e.raw_wire import read_frame
from tests.server import free_port


def _tls_settings(settings: Settings, files: TlsFiles) -> Settings:
    return settings.model_copy(
        update={
            "tls_cert_file": files.server_cert,
            "tls_key_file": files.server_key,
            "tls_trust_certs_file_path": files.ca,
        }
    )


def _client_context(files: TlsFiles, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _common_name(cert: dict[str, Any]) -> str:
    return dict(pair[0] for pair in cert["subject"])["commonName"]


@pytest.mark.parametrize("with_cert", [True, False])
def test_the_binary_protocols_connection_has_the_client_certificate(
    settings: Settings, tls_files: TlsFiles, with_cert: bool
) -> None:
    tls = _tls_settings(settings, tls_files).model_copy(update={"broker_service_port_tls": 0})
    app = create_app(tls)
    with TestClient(app):
        listener = app.state.pulsar
        port = tls.broker_service_port_tls  # the port 0 became, recorded by the listener
        assert port and listener.service_url_tls == f"pulsar+ssl://127.0.0.1:{port}"
        cert = (tls_files.client_cert, tls_files.client_key) if with_cert else None
        context = _client_context(tls_files, cert)
        with context.wrap_socket(
            socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost"
        ) as s:
            s.sendall(encode(command(pb.BaseCommand.CONNECT, client_version="t", protocol_version=21)))
            assert read_frame(s).type == pb.BaseCommand.CONNECTED
            (conn,) = listener.ctx.connections
            assert conn.tls
            if with_cert:
                assert _common_name(conn.peer_certificate) == "app1"
            else:
                assert conn.peer_certificate is None


async def _echo(request: Request) -> JSONResponse:
    cert = peer_certificate_of(request)
    return JSONResponse({"cn": _common_name(cert) if cert else None, "scheme": request.url.scheme})


@pytest.fixture
def https_and_http(settings: Settings, tls_files: TlsFiles) -> Iterator[tuple[str, str]]:
    """A real uvicorn on HTTPS and one on HTTP, with the service's protocol, whose app answers
    the certificate it was given."""
    tls = _tls_settings(settings, tls_files)
    app = Starlette(routes=[Route("/cert", _echo)])
    servers = []
    urls = []
    for secure in (True, False):
        port = free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=TlsHttpProtocol,
            lifespan="off",
            log_level="warning",
            ssl_context_factory=(lambda c, d: server_context(tls)) if secure else None,
        )
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        servers.append(server)
        urls.append(f"{'https' if secure else 'http'}://127.0.0.1:{port}")
    deadline = time.monotonic() + 30
    while not all(s.started for s in servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield urls[0], urls[1]
    for server in servers:
        server.should_exit = True


def test_an_https_request_has_the_client_certificate(
    https_and_http: tuple[str, str], tls_files: TlsFiles
) -> None:
    https, http = https_and_http
    cert = (tls_files.client_cert, tls_files.client_key)
    with httpx.Client(verify=_client_context(tls_files, cert)) as c:
        # Two requests on one connection: each has it.
        assert [c.get(f"{https}/cert").json() for _ in range(2)] == [{"cn": "app1", "scheme": "https"}] * 2
    with httpx.Client(verify=_client_context(tls_files, None)) as c:
        assert c.get(f"{https}/cert").json() == {"cn": None, "scheme": "https"}
    assert httpx.get(f"{http}/cert").json() == {"cn": None, "scheme": "http"}
