"""Compaction administration at Pulsar's paths."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from api.deps import TopicDep
from service.compaction import CompactionService

router = APIRouter(prefix="/admin/v2/persistent", tags=["compaction"])


async def get_compaction(request: Request) -> CompactionService:
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


@router.get("/{tenant}/{namespace}/{topic}/compactionRuns")
def compaction_runs(
    name: TopicDep, compaction: CompactionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    """The topic's compaction history, newest first: trigger, horizon, counts, bytes, phases, outcome."""
    return [
        {
            "id": r.id,
            "trigger": r.trigger,
            "status": r.status,
            "startedAt": r.started_at,
            "finishedAt": r.finished_at,
            "horizon": f"{r.horizon_ledger}:{r.horizon_entry}" if r.horizon_ledger is not None else None,
            "compactedLedgerId": r.compacted_ledger_id,
            "entriesRead": r.entries_read,
            "recordsKept": r.records_kept,
            "recordsRemoved": r.records_removed,
            "bytesIn": r.bytes_in,
            "bytesOut": r.bytes_out,
            "phaseOneMs": r.phase_one_ms,
            "phaseTwoMs": r.phase_two_ms,
            "durationMs": (r.finished_at - r.started_at) if r.finished_at is not None else None,
            "error": r.error,
        }
        for r in compaction.history(name, limit)
    ]
