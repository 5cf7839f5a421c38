"""Compaction administration at Pulsar's paths."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel

from api.deps import TopicDep
from service.compaction import CompactionService

router = APIRouter(prefix="/admin/v2/persistent", tags=["compaction"])


def get_compaction(request: Request) -> CompactionService:
    return request.app.state.compaction  # type: ignore[no-any-return]


CompactionDep = Annotated[CompactionService, Depends(get_compaction)]


class CompactionStatusOut(BaseModel):
    status: str
    lastError: str | None = None


@router.put("/{tenant}/{namespace}/{topic}/compaction", status_code=204, response_class=Response)
def trigger_compaction(name: TopicDep, compaction: CompactionDep) -> Response:
    """Start a compaction in the background: 204, or 409 while one runs."""
    compaction.trigger(name, trigger="manual")
    return Response(status_code=204)


@router.get("/{tenant}/{namespace}/{topic}/compaction", response_model=CompactionStatusOut)
def compaction_status(name: TopicDep, compaction: CompactionDep) -> CompactionStatusOut:
    st = compaction.status(name)
    return CompactionStatusOut(status=st.status, lastError=st.last_error)
