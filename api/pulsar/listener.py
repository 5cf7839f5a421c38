"""The TCP listeners of Pulsar's binary protocol, plain (``pulsar://``) and over TLS
(``pulsar+ssl://``, ``COMPACTOR_BROKER_SERVICE_PORT_TLS``, with ``service.tls``'s context),
started and stopped with the app, in its event loop. Both serve the same connections' commands;
a TLS connection starts once its handshake is done, and a handshake that fails (no client
certificate where one is required, one from a CA not trusted, plain TCP on the TLS port) closes
that connection only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.pulsar.commands import HANDLERS
from api.pulsar.connection import BrokerContext, PulsarConnection
from api.pulsar.produce import disconnect_producers
from service.authentication import Authentication
from service.authorization import Authorizer
from service.backlog_quotas import BacklogQuotaStore
from service.names import TopicName
from service.non_persistent import NonPersistentTopics
from service.partitions import PartitionedTopics
from service.policies import PolicyStore
from service.schemas import SchemaRegistry
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.tenants import TenantService
from service.tls import server_context
from service.topics import Broker

log = logging.getLogger(__name__)


class ProtocolCollector(Collector):
    """The binary protocol's gauges at scrape time: connections (Pulsar's
    ``pulsar_active_connections``), and the producers and consumers attached through it."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        connections = list(self.ctx.connections)
        yield GaugeMetricFamily(
            "pulsar_active_connections",
            "Open connections of Pulsar's binary protocol.",
            value=len(connections),
        )
        yield GaugeMetricFamily(
            "compactor_pulsar_producers",
            "Producers attached over Pulsar's binary protocol.",
            value=sum(len(c.producers) for c in connections),
        )
        yield GaugeMetricFamily(
            "compactor_pulsar_consumers",
            "Consumers and readers attached over Pulsar's binary protocol.",
            value=sum(len(c.consumers) for c in connections),
        )


class BrokerListener:
    """Listens on ``settings.host`` and ``settings.broker_service_port`` (0: not at all), and over
    TLS on ``settings.broker_service_port_tls`` (None: not at all; 0: a free port, which is then
    recorded in the settings for lookups to answer)."""

    def __init__(
        self,
        *,
        settings: Settings,
        broker: Broker,
        subscriptions: SubscriptionService,
        tenants: TenantService,
        authorizer: Authorizer | None,
        authentication: Authentication | None,
        policies: PolicyStore,
        schemas: SchemaRegistry,
        partitioned: PartitionedTopics,
        registry: CollectorRegistry | None = None,
        non_persistent: NonPersistentTopics | None = None,
        quotas: BacklogQuotaStore | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.ctx = BrokerContext(
            settings=settings,
            broker=broker,
            subscriptions=subscriptions,
            tenants=tenants,
            authorizer=authorizer,
            authentication=authentication,
            policies=policies,
            schemas=schemas,
            partitioned=partitioned,
            service_url="",
            connections=set(),
            non_persistent=non_persistent
            or NonPersistentTopics(enabled=settings.enable_non_persistent_topics),
            quotas=quotas,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._collector: ProtocolCollector | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.broker_service_port != 0

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    @property
    def service_url(self) -> str:
        return self.ctx.service_url

    @property
    def service_url_tls(self) -> str | None:
        """``pulsar+ssl://host:port`` while the TLS port listens, else None."""
        if self._tls_server is None or not self._tls_server.is_serving():
            return None
        return self.settings.broker_service_url_tls

    def disconnect_producers(self, name: TopicName) -> None:
        """Close the topic's producers on their clients' side (from any thread): they connect
        again and are checked again (a backlog quota's producer policies)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(disconnect_producers, self.ctx, name)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        if self.enabled:
            self._server = await loop.create_server(
                lambda: PulsarConnection(self.ctx, HANDLERS),
                host=self.settings.host,
                port=self.settings.broker_service_port,
                reuse_address=True,
            )
            # A lookup answers with the advertised host (as REST's redirects) and this port.
            self.ctx.service_url = self.settings.broker_service_url or ""
            log.info("Pulsar's binary protocol on %s", self.ctx.service_url)
        if self.settings.broker_service_port_tls is not None:
            self._tls_server = await loop.create_server(
                lambda: PulsarConnection(self.ctx, HANDLERS),
                host=self.settings.host,
                port=self.settings.broker_service_port_tls,
                reuse_address=True,
                ssl=server_context(self.settings),
            )
            if self.settings.broker_service_port_tls == 0:
                self.settings.broker_service_port_tls = self._tls_server.sockets[0].getsockname()[1]
            log.info("Pulsar's binary protocol over TLS on %s", self.settings.broker_service_url_tls)
        if self.registry is not None and (self._server is not None or self._tls_server is not None):
            self._collector = ProtocolCollector(self.ctx)
            self.registry.register(self._collector)

    async def stop(self) -> None:
        servers = [s for s in (self._server, self._tls_server) if s is not None]
        if not servers:
            return
        if self._collector is not None and self.registry is not None:
            self.registry.unregister(self._collector)
            self._collector = None
        for server in servers:
            server.close()
        for conn in list(self.ctx.connections):
            conn.close("the service is stopping")
        for server in servers:
            await server.wait_closed()
        self._server = self._tls_server = None
