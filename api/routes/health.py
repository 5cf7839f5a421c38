"""Liveness: 200 once the service has recovered its topics and listens."""

from __future__ import annotations

from fastapi import APIRouter

from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
def health() -> Health:
    return Health(status="ok")
