"""The FastAPI application: routers, error mapping, and the service's life cycle."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from api import errors
from api.audit import AuditLog
from api.client.routing import key_partition
from api.guard import RequestGuard
from api.http_metrics import HttpMetrics
from api.openapi import install_openapi
from api.peers import Peers
from api.pulsar.listener import BrokerListener
from api.routes import (
    admin,
    backlog_quotas,
    broker_stats,
    consumers,
    dashboard,
    fallback,
    health,
    iceberg,
    integrity,
    lookup,
    message_by_id,
    messages,
    metrics,
    namespaces,
    non_persistent,
    partitions,
    permissions,
    policies,
    schemas,
    subscriptions,
    tenants,
    termination,
    topics,
)
from migrations import upgrade
from service.authentication import Authentication
from service.authorization import Authorizer
from service.backlog_quota_checks import BacklogQuotaMonitor
from service.backlog_quotas import BacklogQuotaStore
from service.basic_auth import BasicAuthenticator
from service.compaction import CompactionService
from service.db import Database
from service.engine import SparkEngine
from service.instances import InstanceRegistry
from service.metrics import ServiceMetrics
from service.non_persistent import NonPersistentTopics
from service.ownership import LeaseOwnership
from service.partitions import PartitionedTopics
from service.policies import PolicyStore
from service.resources import raise_descriptor_limit
from service.scheduler import CompactionScheduler
from service.schemas import SchemaRegistry
from service.scrubber import Scrubber
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.table_catalog import TableCatalog
from service.tenants import TenantService
from service.tokens import TokenVerifier, read_key
from service.topics import Broker

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    service_metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before anything is opened: the bounds below are sized from the limit.
        raise_descriptor_limit()
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.database_url)
        db = Database(settings.database_url)
        ownership = None
        if settings.several_instances:
            registry = InstanceRegistry(
                db=db,
                url=settings.advertised_url,
                lease_ms=settings.ownership_lease_ms,
                broker_url=settings.broker_service_url,
            )
            ownership = LeaseOwnership(db=db, registry=registry, lease_ms=settings.ownership_lease_ms)
        broker = Broker(settings=settings, db=db, ownership=ownership)
        policy_store = PolicyStore(db=db, settings=settings)
        quota_store = BacklogQuotaStore(db=db, settings=settings)
        app.state.quotas = quota_store
        schema_registry = SchemaRegistry(db, policies=policy_store)
        app.state.schemas = schema_registry
        engine = SparkEngine(settings)
        app.state.engine = engine
        tenant_service = TenantService(
            db=db, topics_of=broker.list_topics, cache_seconds=settings.authorization_cache_seconds
        )
        app.state.tenants = tenant_service
        partitioned = PartitionedTopics(
            db=db,
            broker=broker,
            tenants=tenant_service,
            max_partitions=settings.max_partitions_per_topic,
            route_key=key_partition,  # the official client's default, as api.client routes
        )
        app.state.partitioned = partitioned
        app.state.authorizer = (
            Authorizer(superusers=settings.superuser_roles, tenants=tenant_service)
            if settings.authorization_enabled
            else None
        )
        compaction = CompactionService(
            broker=broker,
            compactor=engine.compactor,
            workers=settings.compaction_workers,
            policies=policy_store,
            metrics=service_metrics,
        )
        compaction.start()
        subs = SubscriptionService(broker=broker, consumer_timeout_ms=settings.consumer_timeout_ms)
        subs.start()
        # After the services above ask to hear of each topic loaded: start() loads them.
        broker.start()
        app.state.subscriptions = subs
        app.state.policies = policy_store
        scheduler = CompactionScheduler(
            broker=broker,
            compaction=compaction,
            policies=policy_store,
            interval_s=settings.compaction_monitor_interval_seconds,
            metrics=service_metrics,
        )
        scheduler.start()
        scrubber = Scrubber(
            broker=broker,
            interval_s=settings.scrub_interval_seconds,
            bytes_per_second=settings.scrub_bytes_per_second,
            metrics=service_metrics,
        )
        scrubber.start()
        app.state.scrubber = scrubber
        service_metrics.watch(broker)
        # Long-polling receives each hold a worker thread; allow plenty of them.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        app.state.settings = settings
        app.state.db = db
        app.state.broker = broker
        app.state.compaction = compaction
        app.state.peers = peers = Peers(settings)
        app.state.table_catalog = TableCatalog(
            db=db,
            storage=settings.ledger_storage(),
            keys=(settings.table_s3_access_key_id, settings.table_s3_secret_access_key.get_secret_value()),
        )
        # Spark takes seconds to start: check Java (and with warm-up, start Spark and run a
        # throw-away round) now, in the background, so the first compaction does not wait.
        engine.start_in_background()
        # Non-persistent topics: in memory, shared by the binary protocol and REST's stats.
        non_persistent = NonPersistentTopics(enabled=settings.enable_non_persistent_topics)
        app.state.non_persistent = non_persistent
        listener = BrokerListener(
            settings=settings,
            broker=broker,
            subscriptions=subs,
            tenants=tenant_service,
            authorizer=app.state.authorizer,
            authentication=app.state.authentication,
            policies=policy_store,
            schemas=schema_registry,
            partitioned=partitioned,
            registry=service_metrics.registry,
            non_persistent=non_persistent,
            quotas=quota_store,
        )
        await listener.start()
        app.state.pulsar = listener
        quota_monitor = BacklogQuotaMonitor(
            broker=broker, quotas=quota_store, interval_s=settings.backlog_quota_check_interval_in_seconds
        )
        quota_monitor.on_blocked.append(listener.disconnect_producers)
        if settings.backlog_quota_check_enabled:
            quota_monitor.start()
        try:
            yield
        finally:
            quota_monitor.stop()
            await listener.stop()
            peers.close()
            engine.stop()
            service_metrics.unwatch()
            scrubber.stop()
            scheduler.stop()
            compaction.stop()
            broker.stop()
            db.dispose()

    app = FastAPI(title="Topic compactor", version="0.1.0", lifespan=lifespan)
    errors.install(app)
    app.state.settings = settings
    app.state.authorizer = None
    app.state.authentication = authentication_chain(settings)
    app.state.metrics = service_metrics
    app.state.pulsar = None
    app.state.non_persistent = NonPersistentTopics(enabled=settings.enable_non_persistent_topics)

    app.add_middleware(AuditLog)
    app.add_middleware(RequestGuard, max_request_bytes=settings.max_request_bytes)
    # Outermost: a request the guard refuses is counted too.
    app.add_middleware(HttpMetrics, metrics=service_metrics)

    app.include_router(health.router)
    app.include_router(tenants.router)
    app.include_router(namespaces.router)
    app.include_router(permissions.router)
    app.include_router(partitions.router)
    app.include_router(topics.router)
    app.include_router(topics.namespace_topics)
    app.include_router(messages.router)
    app.include_router(admin.router)
    app.include_router(integrity.router)
    app.include_router(subscriptions.router)
    app.include_router(schemas.router)
    app.include_router(consumers.router)
    app.include_router(policies.router)
    app.include_router(termination.router)
    app.include_router(backlog_quotas.router)
    app.include_router(metrics.router)
    app.include_router(dashboard.router)
    app.include_router(broker_stats.router)
    app.include_router(lookup.router)
    app.include_router(non_persistent.router)
    app.include_router(message_by_id.router)
    app.include_router(iceberg.router)
    app.include_router(fallback.router)
    install_openapi(
        app,
        secured=settings.authentication_enabled,
        metrics_open=not settings.authenticate_metrics_endpoint,
        max_partitions=settings.max_partitions_per_topic,
        methods=settings.authentication_providers,
        anonymous=settings.anonymous_user_role is not None,
    )
    return app


def authentication_chain(settings: Settings) -> Authentication | None:
    """The providers ``settings`` configure, and the anonymous role; None with authentication off."""
    if not settings.authentication_enabled:
        return None
    providers = settings.authentication_providers
    token = basic = None
    if "token" in providers:
        token = TokenVerifier(
            secret_key=read_key(settings.token_secret_key) if settings.token_secret_key else None,
            public_key=read_key(settings.token_public_key) if settings.token_public_key else None,
            claim=settings.token_auth_claim,
            cache_size=settings.token_cache_size,
        )
    if "basic" in providers:
        assert settings.basic_auth_conf is not None  # the settings' own check
        basic = BasicAuthenticator.from_conf(settings.basic_auth_conf)
    return Authentication(
        token=token, basic=basic, tls="tls" in providers, anonymous_role=settings.anonymous_user_role
    )
