"""Integrity administration: scrub a topic, see its scrubs, accept a damaged ledger's loss.

README, "Integrity and repair". A scrub runs in the request, at full speed, and answers its
report; ``skip-damaged`` is the explicit act an operator takes (never the service on its own)
so that compaction can go on without a damaged ledger's lost entries.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request

from api.deps import BrokerDep, CanLookup, TenantAdmin, TopicDep
from service.scrubber import Scrubber, ScrubReport

router = APIRouter(prefix="/admin/v2/persistent", tags=["integrity"])


async def get_scrubber(request: Request) -> Scrubber:
    return request.app.state.scrubber  # type: ignore[no-any-return]


ScrubberDep = Annotated[Scrubber, Depends(get_scrubber)]
LedgerId = Annotated[int, Path(ge=0, le=2**63 - 1, description="An original ledger of the topic")]


def report_json(r: ScrubReport) -> dict[str, Any]:
    return {
        "id": r.run_id,
        "topic": r.topic,
        "trigger": r.trigger,
        "status": r.status,
        "startedAt": r.started_at,
        "finishedAt": r.finished_at,
        "filesChecked": r.files_checked,
        "bytesChecked": r.bytes_checked,
        "damagedFiles": r.damaged_files,
        "checksumsRecorded": r.checksums_recorded,
        "findings": r.findings,
    }


@router.post(
    "/{tenant}/{namespace}/{topic}/scrub",
    dependencies=[TenantAdmin],
    responses={200: {"description": "The scrub's report: CLEAN, DAMAGED (with findings) or ERROR"}},
)
def scrub(name: TopicDep, scrubber: ScrubberDep) -> dict[str, Any]:
    """Verify every file of the topic against its recorded checksum now; damage found is
    recorded as a read would record it (see README, "Integrity and repair")."""
    return report_json(scrubber.scrub(name))


@router.get("/{tenant}/{namespace}/{topic}/scrubRuns", dependencies=[CanLookup])
def scrub_runs(
    name: TopicDep, scrubber: ScrubberDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    """The topic's scrubs, newest first."""
    return [report_json(r) for r in scrubber.history(name, limit)]


@router.post(
    "/{tenant}/{namespace}/{topic}/ledgers/{ledger_id}/skip-damaged",
    dependencies=[TenantAdmin],
    responses={
        200: {"description": "The loss is accepted: the entries lost and kept"},
        404: {"description": "No such topic, or no such original ledger of it"},
        409: {"description": "The ledger is not known to be damaged (scrub first), or not sealed"},
    },
)
def skip_damaged(name: TopicDep, ledger_id: LedgerId, broker: BrokerDep) -> dict[str, Any]:
    """Accept losing a damaged ledger's unreadable entries: reads skip them (as Pulsar's
    ``autoSkipNonRecoverableData``) and compactions read a verified copy of its intact rows."""
    topic = broker.topic(name)
    lost, kept = topic.ledger.accept_damage(ledger_id)
    return {
        "ledgerId": ledger_id,
        "lostEntries": [{"first": a, "last": b} for a, b in lost],
        "lostCount": lost.count(),
        "keptEntries": kept,
    }
