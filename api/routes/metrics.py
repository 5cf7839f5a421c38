"""``GET /metrics``: the service's metrics in Prometheus' text format (prometheus-client's
exposition, never written by hand). See ``service.metrics`` for what is in it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth import authenticate

router = APIRouter(tags=["monitoring"])


async def metrics_access(request: Request) -> None:
    """Open, as Pulsar's ``/metrics``, unless ``authenticateMetricsEndpoint``
    (``COMPACTOR_AUTHENTICATE_METRICS_ENDPOINT=true``) with authentication on: then any valid
    token (401 without one), as Pulsar checks authentication only."""
    settings = request.app.state.settings
    if settings.authentication_enabled and settings.authenticate_metrics_endpoint:
        authenticate(request)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text exposition", "content": {CONTENT_TYPE_LATEST: {}}}},
    dependencies=[Depends(metrics_access)],
)
def metrics(request: Request) -> Response:
    """Every metric, per topic labelled by ``namespace`` and ``topic`` (Pulsar's names)."""
    # A plain ``def``: the scrape walks every topic, and runs in a worker thread, not the loop.
    body = request.app.state.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
