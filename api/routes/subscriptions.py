"""Subscriptions at Pulsar's admin paths, and the topic's stats with each one's backlog."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict

from api.deps import BrokerDep, CanConsume, CanLookup, CompactionDep, QuotasDep, SubscriptionsDep, TopicDep
from service.backlog_quotas import DESTINATION_STORAGE, MESSAGE_AGE, BacklogQuotaStore
from service.compaction import CompactionService
from service.compaction_runs import CompactionRecord
from service.cursor_store import COMPACTION_CURSOR
from service.names import TopicName
from service.publishers import ClientInfo, Publisher
from service.subscription_service import SubscriptionService
from service.subscription_stats import ConsumerStats, backlog_of
from service.topics import Broker

router = APIRouter(prefix="/admin/v2/persistent", tags=["subscriptions"])


class ResetCursor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messageId: str


@router.get("/{tenant}/{namespace}/{topic}/subscriptions", response_model=list[str], dependencies=[CanLookup])
def list_subscriptions(name: TopicDep, subs: SubscriptionsDep) -> list[str]:
    return subs.names(name)


@router.put(
    "/{tenant}/{namespace}/{topic}/subscription/{sub}",
    status_code=204,
    response_class=Response,
    dependencies=[CanConsume],
)
def create_subscription(
    name: TopicDep,
    sub: str,
    subs: SubscriptionsDep,
    initialPosition: Literal["earliest", "latest"] = "latest",
) -> Response:
    # No readCompacted here, as in Pulsar's createSubscription: each consumer chooses it.
    subs.create(name, sub, initial_position=initialPosition)
    return Response(status_code=204)


@router.delete(
    "/{tenant}/{namespace}/{topic}/subscription/{sub}",
    status_code=204,
    response_class=Response,
    dependencies=[CanConsume],
)
def delete_subscription(name: TopicDep, sub: str, subs: SubscriptionsDep) -> Response:
    subs.delete(name, sub)
    return Response(status_code=204)


@router.post(
    "/{tenant}/{namespace}/{topic}/subscription/{sub}/resetcursor/{timestamp}",
    status_code=204,
    response_class=Response,
    dependencies=[CanConsume],
)
def reset_cursor_by_time(name: TopicDep, sub: str, timestamp: int, subs: SubscriptionsDep) -> Response:
    subs.seek(name, sub, publish_time=timestamp)
    return Response(status_code=204)


@router.post(
    "/{tenant}/{namespace}/{topic}/subscription/{sub}/resetcursor",
    status_code=204,
    response_class=Response,
    dependencies=[CanConsume],
)
def reset_cursor(name: TopicDep, sub: str, body: ResetCursor, subs: SubscriptionsDep) -> Response:
    subs.seek(name, sub, message_id=body.messageId)
    return Response(status_code=204)


@router.get("/{tenant}/{namespace}/{topic}/stats", dependencies=[CanLookup])
def topic_stats(
    name: TopicDep, broker: BrokerDep, subs: SubscriptionsDep, compaction: CompactionDep, quotas: QuotasDep
) -> dict[str, Any]:
    return topic_stats_json(name, broker, subs, compaction, quotas)


def topic_stats_json(
    name: TopicName,
    broker: Broker,
    subs: SubscriptionService,
    compaction: CompactionService,
    quotas: BacklogQuotaStore | None = None,
) -> dict[str, Any]:
    """A topic's stats, as Pulsar's ``TopicStats`` names them (a partition's too; with
    ``quotas``, its backlog quota limits in force)."""
    topic = broker.topic(name)
    ledgers = topic.ledger.ledgers()
    out: dict[str, Any] = {}
    for st in subs.stats(name):
        out[st.name] = {
            "type": st.type,
            "msgBacklog": st.backlog,
            "backlogSize": st.backlog_bytes,
            "unackedMessages": st.unacked,
            "markDeletePosition": str(st.mark_delete) if st.mark_delete else None,
            "consumers": [consumer_json(c) for c in st.consumers],
        }
        if st.active_consumer is not None:
            out[st.name]["activeConsumerName"] = st.active_consumer
    if topic.view is not None:
        entries, size = backlog_of(topic, topic.view.horizon, read_compacted=False)
        out[COMPACTION_CURSOR] = {
            "msgBacklog": entries,
            "backlogSize": size,
            "unackedMessages": 0,
            "markDeletePosition": str(topic.view.horizon),
            "consumers": [],
        }
    compacted = topic.view.ledger.size_bytes if topic.view is not None else 0
    limits = {}
    if quotas is not None:  # Pulsar's names: -1 is no limit
        applied = quotas.effective(name)
        limits = {
            "backlogQuotaLimitSize": applied[DESTINATION_STORAGE].limit_size,
            "backlogQuotaLimitTime": applied[MESSAGE_AGE].limit_time,
        }
    return {
        **limits,
        "msgInCounter": sum(i.entries for i in ledgers),
        "bytesInCounter": sum(i.size_bytes for i in ledgers),
        "storageSize": sum(i.file_bytes for i in ledgers) + compacted,
        # Closed ledgers waiting to be sealed (with room reserved by producers): see README, Limits.
        "sealBacklog": broker.resources.backlog.pending(topic.topic_id),
        "publishers": [publisher_json(p) for p in broker.publishers.of(name)],
        "subscriptions": out,
        "compaction": compaction_record_json(compaction.record(name)),
        # Ledgers found damaged (README, "Integrity and repair"); empty when all are intact.
        "damagedLedgers": [
            {"ledgerId": i.ledger_id, "damage": i.damage, "damageAccepted": i.damage_accepted}
            for i in ledgers
            if i.damage is not None
        ],
    }


def consumer_json(c: ConsumerStats) -> dict[str, Any]:
    """One consumer as Pulsar's ``ConsumerStats`` names it (``keyHashRanges`` on Key_Shared)."""
    out: dict[str, Any] = {
        "consumerId": c.consumer_id,
        "consumerName": c.name,
        "readCompacted": c.read_compacted,
        "priorityLevel": c.priority_level,
        "unackedMessages": c.unacked,
        **client_json(c.client),
    }
    if c.key_hash_ranges is not None:
        out["keyHashRanges"] = [f"[{start}, {end}]" for start, end in c.key_hash_ranges]
    return out


def client_json(client: ClientInfo) -> dict[str, Any]:
    """What Pulsar's ``PublisherStats`` and ``ConsumerStats`` say of a client."""
    return {
        "address": client.address,
        "connectedSince": client.connected_since,
        "clientVersion": client.client_version,
        "metadata": dict(client.metadata),
    }


def publisher_json(p: Publisher) -> dict[str, Any]:
    """One producer as Pulsar's ``PublisherStats`` names it."""
    return {
        "accessMode": p.access_mode,
        "producerId": p.producer_id,
        "producerName": p.name,
        "supportsPartialProducer": False,
        **client_json(p.client),
    }


def compaction_record_json(record: CompactionRecord) -> dict[str, int]:
    """Pulsar's ``compaction`` block of topic stats (its field names, ``Mills`` included)."""
    return {
        "lastCompactionRemovedEventCount": record.last_removed_event_count,
        "lastCompactionSucceedTimestamp": record.last_succeed_timestamp,
        "lastCompactionFailedTimestamp": record.last_failed_timestamp,
        "lastCompactionDurationTimeInMills": record.last_duration_ms,
    }
