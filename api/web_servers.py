"""The REST API's listeners: its HTTP port, and with ``COMPACTOR_WEB_SERVICE_PORT_TLS`` HTTPS on a
port of its own beside it (Pulsar's ``webServicePort`` and ``webServicePortTls``).

Both ports serve the one app, with one lifespan and one app state: two uvicorn servers in one
event loop, neither running the lifespan itself (``lifespan="off"``); :class:`ServerGroup` runs
it once around them, catches SIGINT and SIGTERM for both, and stops both together. Without the
TLS port it is uvicorn's own ``run``, as before: HTTP, or HTTPS on the one port when a certificate
is given (the way this service has always turned TLS on).

Every server uses :class:`TlsHttpProtocol`, which gives the app a TLS connection's client
certificate in the scope (``api.tls``), and writes Pulsar's ``X-Pulsar-*`` response header names
in Pulsar's case (``api.header_case``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Generator
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE
from uvicorn.lifespan.on import LifespanOn

from api.header_case import PulsarHeaderCase
from api.tls import peer_certificate
from service.settings import Settings
from service.tls import server_context

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _with_tls(app: ASGIApp, cert: dict[str, Any] | None) -> ASGIApp:
    async def tls_app(scope: Scope, receive: Receive, send: Send) -> None:
        # A dict per request: the app may add to its scope, never to the connection's.
        scope.setdefault("extensions", {})["tls"] = {"peer_certificate": cert}
        await app(scope, receive, send)

    return tls_app


# What http="auto" picks (httptools, else h11); typed as the former, whose attributes both have.
if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _AutoHttp
else:
    from uvicorn.protocols.http.auto import AutoHTTPProtocol as _AutoHttp


class TlsHttpProtocol(_AutoHttp):
    """uvicorn's HTTP protocol (the one its ``http="auto"`` picks) whose connections, when made
    over TLS, wrap the app in a function that adds ``extensions.tls.peer_certificate`` to every
    request's scope. asyncio calls ``connection_made`` once the handshake is done, so the
    certificate is read once per connection."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if transport.get_extra_info("sslcontext") is not None:
            self.app = _with_tls(self.app, peer_certificate(transport))
        # Pulsar's case of X-Pulsar-* header names, which a Pulsar client matches by case.
        self.transport = PulsarHeaderCase(transport)  # type: ignore[assignment]


ContextFactory = Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext]
Member = tuple[uvicorn.Config, list[socket.socket] | None]  # a server's config, its bound sockets


def _context_factory(settings: Settings) -> ContextFactory:
    # The context of service.tls (client certificates, protocols, ciphers), not uvicorn's own.
    return lambda config, default: server_context(settings)


class _Member(uvicorn.Server):
    """A server of a group: the group handles signals and the lifespan, and stops it."""

    def __init__(self, config: uvicorn.Config, group: ServerGroup) -> None:
        super().__init__(config)
        self.group = group

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def on_tick(self, counter: int) -> bool:
        self.should_exit = self.should_exit or self.group.should_exit
        self.force_exit = self.force_exit or self.group.force_exit
        return await super().on_tick(counter)


class ServerGroup:
    """uvicorn servers of one app in one event loop, with its lifespan run once around them."""

    def __init__(self, app: ASGIApp, members: list[Member]) -> None:
        self.app = app
        self.members = [(_Member(config, self), sockets) for config, sockets in members]
        self.should_exit = False
        self.force_exit = False
        self._signals: list[int] = []

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    async def serve(self) -> None:
        """Start the lifespan, serve until SIGINT or SIGTERM, stop every server, then the
        lifespan. A signal during start-up is acted on once it is done, as uvicorn does."""
        first = self.members[0][0].config
        lifespan = LifespanOn(
            uvicorn.Config(self.app, lifespan="on", log_level=first.log_level, log_config=None)
        )
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            await lifespan.startup()
            if lifespan.should_exit:
                sys.exit(STARTUP_FAILURE)
            try:
                await asyncio.gather(*(server.serve(sockets) for server, sockets in self.members))
            finally:
                await lifespan.shutdown()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # As uvicorn: the signal's own behaviour now that everything is shut down.
        for captured in reversed(self._signals):
            signal.raise_signal(captured)


def serve(app: ASGIApp, settings: Settings, **options: Any) -> None:
    """Serve ``app`` on ``settings.port``, and on ``settings.web_service_port_tls`` over HTTPS
    when it is set (a port of 0 is bound now, and the port bound recorded in the settings, for
    lookups and ``/health`` to answer); ``options`` are uvicorn's."""
    options = {"http": TlsHttpProtocol, **options}
    tls = _context_factory(settings) if settings.tls_cert_file is not None else None
    if settings.web_service_port_tls is None:
        uvicorn.run(app, host=settings.host, port=settings.port, ssl_context_factory=tls, **options)
        return
    plain = uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="off", **options)
    secure = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.web_service_port_tls,
        lifespan="off",
        ssl_context_factory=tls,
        **options,
    )
    # Both bound now, before the lifespan starts anything: a port taken stops the start here.
    plain_socket, secure_socket = plain.bind_socket(), secure.bind_socket()
    settings.web_service_port_tls = secure_socket.getsockname()[1]
    group = ServerGroup(app, [(plain, [plain_socket]), (secure, [secure_socket])])
    with asyncio.Runner(loop_factory=plain.get_loop_factory()) as runner:
        runner.run(group.serve())
