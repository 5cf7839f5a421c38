"""Liveness: 200 once the service has recovered its topics and listens; ``degraded`` with the
reasons while a bounded resource is exhausted (descriptors, the seal backlog, failing seals);
and whether compactions can run (``compaction``: see ``service.engine``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.deps import BrokerDep
from api.schemas import Health
from service.engine import STARTING
from service.stats import health_problems

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, response_model_exclude_none=True)
def health(request: Request, broker: BrokerDep) -> Health:
    engine = getattr(request.app.state, "engine", None)
    compaction = engine.status if engine is not None else STARTING
    warming = True if engine is not None and engine.warming_up else None
    # Still 200 when degraded: the service serves what it can, and a restart would not help.
    pulsar = getattr(request.app.state, "pulsar", None)
    url = pulsar.service_url if pulsar is not None and pulsar.listening else None
    # Where the TLS ports listen (a port of 0 is the one bound): clients and tests find them here.
    urls = {
        "brokerServiceUrl": url,
        "brokerServiceUrlTls": pulsar.service_url_tls if pulsar is not None else None,
        "webServiceUrlTls": broker.settings.web_service_url_tls,
    }
    problems = health_problems(broker)
    if problems:
        return Health(
            status="degraded", reason="; ".join(problems), compaction=compaction, warmingUp=warming, **urls
        )
    return Health(status="ok", compaction=compaction, warmingUp=warming, **urls)
