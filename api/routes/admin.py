"""Compaction administration at Pulsar's paths."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from api.deps import (
    AuthorizationDep,
    CanLookup,
    CompactionDep,
    PartitionedDep,
    PeersDep,
    TenantAdmin,
    TopicDep,
)
from api.peers import Peers
from compactor.progress import ProgressSnapshot, combined
from service.compaction import CompactionService
from service.compaction_runs import CompactionStatus
from service.errors import Conflict, NotOwner, Unavailable
from service.models import CompactionRun
from service.names import TopicName

router = APIRouter(prefix="/admin/v2/persistent", tags=["compaction"])


class CompactionProgressOut(BaseModel):
    """How far a running round is (see ``compactor.progress``)."""

    phase: Literal["phase-one", "phase-two", "commit"]
    entriesRead: int
    entriesTotal: int
    bytesRead: int
    bytesTotal: int
    percent: float
    startedAt: int
    elapsedMs: int


class TableStatusOut(BaseModel):
    """The topic's Iceberg table (docs/tables.md): whether its policy asks for one, the snapshot
    its last committed round made, the rounds compacted since then, the last failed commit's error."""

    enabled: bool
    snapshotId: int | None = None
    lagRounds: int = 0
    lastError: str | None = None


class CompactionStatusOut(BaseModel):
    status: str
    lastError: str | None = None
    # Only while RUNNING (left out of the body otherwise).
    progress: CompactionProgressOut | None = None
    # A partitioned topic's: each partition's status, by partition name.
    partitions: dict[str, str] | None = None
    # Only for a topic with an Iceberg table, or whose policy asks for one.
    table: TableStatusOut | None = None


def progress_out(p: ProgressSnapshot) -> CompactionProgressOut:
    return CompactionProgressOut(
        phase=p.phase,  # type: ignore[arg-type]
        entriesRead=p.entries_read,
        entriesTotal=p.entries_total,
        bytesRead=p.bytes_read,
        bytesTotal=p.bytes_total,
        percent=p.percent,
        startedAt=p.started_at,
        elapsedMs=p.elapsed_ms,
    )


@router.put(
    "/{tenant}/{namespace}/{topic}/compaction",
    status_code=204,
    response_class=Response,
    dependencies=[TenantAdmin],
    responses={
        409: {"description": "a compaction of the topic (or of a partition) is already running"},
        503: {"description": "a partition's owner could not be asked to compact it (the others started)"},
    },
)
def trigger_compaction(
    name: TopicDep,
    compaction: CompactionDep,
    partitioned: PartitionedDep,
    peers: PeersDep,
    auth: AuthorizationDep,
) -> Response:
    """Start a compaction in the background: 204, or 409 while one runs. On a partitioned topic,
    of every partition: those this instance owns in one Spark job, the others by their owners
    (asked on the client's behalf); 409 when one of them is compacting already, 503 when an
    owner could not be asked (the others are started either way)."""
    found = partitioned.get(name)
    if found is None:
        compaction.trigger(name, trigger="manual")
        return Response(status_code=204)
    skipped = compaction.trigger_many(found.partition_names(), trigger="manual")
    busy = [p.topic for p in skipped.busy]
    unreachable = []
    for p, owner in skipped.elsewhere.items():
        reply = peers.ask(owner, "PUT", p, "compaction", auth)
        if reply.status == 409:
            busy.append(p.topic)
        elif not reply.ok:
            unreachable.append(f"{p.topic} ({reply.error})")
    if unreachable:
        names = ", ".join(unreachable)
        raise Unavailable(f"partitions not started (the others were): {names}", retry_after=5)
    if busy:
        raise Conflict(f"partitions already compacting (the others were started): {', '.join(busy)}")
    return Response(status_code=204)


@router.get(
    "/{tenant}/{namespace}/{topic}/compaction",
    response_model=CompactionStatusOut,
    response_model_exclude_unset=True,
    responses={404: {"description": "no such topic"}},
    dependencies=[CanLookup],
)
def compaction_status(
    name: TopicDep,
    compaction: CompactionDep,
    partitioned: PartitionedDep,
    peers: PeersDep,
    auth: AuthorizationDep,
) -> CompactionStatusOut:
    """NOT_RUN, RUNNING, SUCCESS or ERROR; while RUNNING, with ``progress``. A partitioned
    topic's: RUNNING while a partition's round runs, then ERROR if one failed (``lastError``
    names them), else SUCCESS once each has compacted; ``partitions`` has each one's status
    (a partition another instance owns, as its owner tells; 503 when it cannot be asked)."""
    found = partitioned.get(name)
    if found is not None:
        out = _partitioned_status(
            {p.topic: _status_anywhere(p, compaction, peers, auth) for p in found.partition_names()}
        )
    else:
        st = compaction.status(name)
        out = CompactionStatusOut(status=st.status, lastError=st.last_error)
        if st.progress is not None:
            out.progress = progress_out(st.progress)
    table = compaction.tables.status(name, found.partition_names() if found is not None else None)
    if table is not None:
        out.table = TableStatusOut(
            enabled=table.enabled,
            snapshotId=table.snapshot_id,
            lagRounds=table.lag_rounds,
            lastError=table.last_error,
        )
    return out


def _status_anywhere(
    name: TopicName, compaction: CompactionService, peers: Peers, auth: str | None
) -> CompactionStatus:
    try:
        return compaction.status(name)
    except NotOwner as e:
        reply = peers.ask(e.url, "GET", name, "compaction", auth)
    if not reply.ok or not isinstance(reply.body, dict):
        reason = f"the compaction status of {name.topic} could not be had: {reply.error}"
        raise Unavailable(reason, retry_after=5)
    body = reply.body
    progress = body.get("progress")
    return CompactionStatus(
        status=str(body.get("status")),
        last_error=body.get("lastError"),
        progress=_snapshot(progress) if isinstance(progress, dict) else None,
    )


def _snapshot(p: dict[str, Any]) -> ProgressSnapshot:
    return ProgressSnapshot(
        phase=p["phase"],
        entries_read=p["entriesRead"],
        entries_total=p["entriesTotal"],
        bytes_read=p["bytesRead"],
        bytes_total=p["bytesTotal"],
        percent=p["percent"],
        started_at=p["startedAt"],
        elapsed_ms=p["elapsedMs"],
    )


def _partitioned_status(each: dict[str, CompactionStatus]) -> CompactionStatusOut:
    statuses = {st.status for st in each.values()}
    failed = [f"{p}: {st.last_error}" for p, st in each.items() if st.status == "ERROR"]
    if "RUNNING" in statuses:
        status = "RUNNING"
    elif failed:
        status = "ERROR"
    elif statuses == {"NOT_RUN"}:
        status = "NOT_RUN"
    else:
        status = "SUCCESS" if statuses == {"SUCCESS"} else "NOT_RUN"
    out = CompactionStatusOut(
        status=status,
        lastError="; ".join(failed) if failed and status == "ERROR" else None,
        partitions={p: st.status for p, st in each.items()},
    )
    running = [st.progress for st in each.values() if st.status == "RUNNING" and st.progress is not None]
    if running:
        out.progress = progress_out(combined(running))  # of the partitions' rounds that run
    return out


@router.get("/{tenant}/{namespace}/{topic}/compactionRuns", dependencies=[CanLookup])
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
            # The round's final throughput, bytes per second of its whole duration.
            "readThroughput": _per_second(r.bytes_in, r),
            "writeThroughput": _per_second(r.bytes_out, r),
            "error": r.error,
        }
        for r in compaction.history(name, limit)
    ]


def _per_second(n: int | None, r: CompactionRun) -> float | None:
    if n is None or r.finished_at is None:
        return None
    return round(n * 1000 / max(1, r.finished_at - r.started_at), 1)
