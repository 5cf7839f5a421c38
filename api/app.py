"""The FastAPI application: routers, error mapping, and the service's life cycle."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from api import errors
from api.guard import RequestGuard
from api.routes import admin, consumers, fallback, health, messages, policies, subscriptions, topics
from compactor import TwoPhaseCompactor
from compactor.spark import get_spark
from compactor.warmup import warm_up
from service.compaction import CompactionService
from service.cursors import SubscriptionService
from service.db import Database, upgrade
from service.policies import PolicyStore
from service.scheduler import CompactionScheduler
from service.settings import Settings
from service.topics import Broker

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade(settings.database_url)
        db = Database(settings.database_url)
        broker = Broker(settings=settings, db=db)
        broker.start()
        policy_store = PolicyStore(db=db, settings=settings)
        compaction = CompactionService(
            broker=broker,
            compactor=lambda: TwoPhaseCompactor(spark_session(settings)),
            workers=settings.compaction_workers,
            policies=policy_store,
        )
        compaction.start()
        subs = SubscriptionService(broker=broker, consumer_timeout_ms=settings.consumer_timeout_ms)
        subs.start()
        app.state.subscriptions = subs
        app.state.policies = policy_store
        scheduler = CompactionScheduler(
            broker=broker,
            compaction=compaction,
            policies=policy_store,
            interval_s=settings.compaction_monitor_interval_seconds,
        )
        scheduler.start()
        # Long-polling receives each hold a worker thread; allow plenty of them.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.worker_threads
        app.state.settings = settings
        app.state.db = db
        app.state.broker = broker
        app.state.compaction = compaction
        if settings.spark_warmup:
            # Spark takes seconds to start; do it now so the first compaction does not wait.
            threading.Thread(
                target=_warm_up_spark, args=(settings,), name="spark-warmup", daemon=True
            ).start()
        try:
            yield
        finally:
            scheduler.stop()
            compaction.stop()
            broker.stop()
            db.dispose()

    app = FastAPI(title="Topic compactor", version="0.1.0", lifespan=lifespan)
    errors.install(app)

    app.add_middleware(RequestGuard, max_request_bytes=settings.max_request_bytes)

    app.include_router(health.router)
    app.include_router(topics.router)
    app.include_router(messages.router)
    app.include_router(admin.router)
    app.include_router(subscriptions.router)
    app.include_router(consumers.router)
    app.include_router(policies.router)
    app.include_router(fallback.router)
    return app


def _warm_up_spark(settings: Settings) -> None:
    """Start Spark and run a throw-away round, so the first compaction is a warm one."""
    try:
        warm_up(spark_session(settings), settings.data_dir)
    except Exception:  # noqa: BLE001 - a real round reports the same failure where it matters
        log.exception("warming Spark up failed")


def spark_session(settings: Settings):  # type: ignore[no-untyped-def]
    return get_spark(
        master=settings.spark_master,
        driver_memory=settings.spark_driver_memory,
        ui=settings.spark_ui,
        shuffle_partitions=settings.spark_shuffle_partitions,
    )
