"""The TCP listener of Pulsar's binary protocol, started and stopped with the app, in its
event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.pulsar.commands import HANDLERS
from api.pulsar.connection import BrokerContext, PulsarConnection
from service.authorization import Authorizer
from service.non_persistent import NonPersistentTopics
from service.partitions import PartitionedTopics
from service.policies import PolicyStore
from service.schemas import SchemaRegistry
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.tenants import TenantService
from service.tokens import TokenVerifier
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
    """Listens on ``settings.host`` and ``settings.broker_service_port`` (0: not at all)."""

    def __init__(
        self,
        *,
        settings: Settings,
        broker: Broker,
        subscriptions: SubscriptionService,
        tenants: TenantService,
        authorizer: Authorizer | None,
        verifier: TokenVerifier | None,
        policies: PolicyStore,
        schemas: SchemaRegistry,
        partitioned: PartitionedTopics,
        registry: CollectorRegistry | None = None,
        non_persistent: NonPersistentTopics | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.ctx = BrokerContext(
            settings=settings,
            broker=broker,
            subscriptions=subscriptions,
            tenants=tenants,
            authorizer=authorizer,
            verifier=verifier,
            policies=policies,
            schemas=schemas,
            partitioned=partitioned,
            service_url="",
            connections=set(),
            non_persistent=non_persistent
            or NonPersistentTopics(enabled=settings.enable_non_persistent_topics),
        )
        self._server: asyncio.Server | None = None
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

    async def start(self) -> None:
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: PulsarConnection(self.ctx, HANDLERS),
            host=self.settings.host,
            port=self.settings.broker_service_port,
            reuse_address=True,
        )
        # A lookup answers with the advertised host (as REST's redirects) and this port.
        self.ctx.service_url = self.settings.broker_service_url or ""
        log.info("Pulsar's binary protocol on %s", self.ctx.service_url)
        if self.registry is not None:
            self._collector = ProtocolCollector(self.ctx)
            self.registry.register(self._collector)

    async def stop(self) -> None:
        if self._server is None:
            return
        if self._collector is not None and self.registry is not None:
            self.registry.unregister(self._collector)
            self._collector = None
        self._server.close()
        for conn in list(self.ctx.connections):
            conn.close("the service is stopping")
        await self._server.wait_closed()
        self._server = None
