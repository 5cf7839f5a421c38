"""One line per topic for the dashboard's topic list: sizes, backlog, what compaction saved,
and how the last compaction went. Read from what the broker and the run history hold."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from service import models
from service.subscription_stats import backlog_of
from service.topics import Broker


@dataclass(frozen=True)
class TopicOverview:
    name: str
    storage_size: int  # bytes on disk: original ledgers and the compacted ledger
    backlog: int  # messages the subscriptions have yet to acknowledge
    subscriptions: int
    compacted_size: int  # bytes of the compacted ledger (0: none)
    compacted_entries: int
    # 1 - bytes out / bytes in of the last round that compacted something; None before one.
    saved_share: float | None
    last_status: str | None  # the last run's outcome, trigger and times (None: never run)
    last_trigger: str | None
    last_started_at: int | None
    last_finished_at: int | None


def topics_overview(broker: Broker) -> list[TopicOverview]:
    topics = sorted(broker.topics(), key=lambda t: str(t.name))
    runs = models.CompactionRun
    ids = [t.topic_id for t in topics]
    with broker.db.session() as s:
        last_ids = select(func.max(runs.id)).where(runs.topic_id.in_(ids)).group_by(runs.topic_id)
        last = {r.topic_id: r for r in s.scalars(select(runs).where(runs.id.in_(last_ids)))}
        compacted_ids = (
            select(func.max(runs.id))
            .where(runs.topic_id.in_(ids), runs.status == "SUCCESS", runs.bytes_in.is_not(None))
            .group_by(runs.topic_id)
        )
        saving = {r.topic_id: r for r in s.scalars(select(runs).where(runs.id.in_(compacted_ids)))}
    out = []
    for topic in topics:
        ledgers = topic.ledger.ledgers()
        view = topic.view
        compacted = view.ledger if view is not None else None
        backlog = 0
        for sub in list(topic.subscriptions.values()):
            backlog += backlog_of(topic, sub.mark_delete, sub.read_compacted, len(sub.acked))[0]
        run, saved = last.get(topic.topic_id), saving.get(topic.topic_id)
        share = None
        if saved is not None and saved.bytes_in:
            share = 1 - (saved.bytes_out or 0) / saved.bytes_in
        out.append(
            TopicOverview(
                name=str(topic.name),
                storage_size=sum(i.file_bytes for i in ledgers) + (compacted.size_bytes if compacted else 0),
                backlog=backlog,
                subscriptions=len(topic.subscriptions),
                compacted_size=compacted.size_bytes if compacted else 0,
                compacted_entries=compacted.entries if compacted else 0,
                saved_share=share,
                last_status=run.status if run else None,
                last_trigger=run.trigger if run else None,
                last_started_at=run.started_at if run else None,
                last_finished_at=run.finished_at if run else None,
            )
        )
    return out
