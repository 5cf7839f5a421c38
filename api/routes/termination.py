"""Topic termination at Pulsar's admin paths: ``POST .../terminate`` (a topic or a partition)
and ``POST .../terminate/partitions`` (every partition of a partitioned topic). Each answers
the last message id as Pulsar's ``MessageIdImpl`` JSON, which Go's ``pulsaradmin`` and Java's
admin client parse."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from api.deps import AuthorizationDep, BrokerDep, PartitionedDep, PeersDep, TenantAdmin, TopicDep
from ledger.entry import Position
from service.errors import NotAllowed, NotOwner, Unavailable
from service.names import TopicName
from service.topics import Broker

# Terminating a topic is a tenant admin's (Pulsar's TopicOperation.TERMINATE).
router = APIRouter(prefix="/admin/v2/persistent", tags=["topics"], dependencies=[TenantAdmin])

TERMINATED: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such topic (or partitioned topic)"},
    405: {"description": "a partitioned topic: terminate its partitions (``/terminate/partitions``)"},
}


def message_id_json(at: Position) -> dict[str, int]:
    """A message id as Pulsar's admin API writes one (``partitionIndex`` -1 even for a
    partition's, as Pulsar answers)."""
    return {
        "ledgerId": at.ledger_id,
        "entryId": at.entry_id,
        "partitionIndex": -1,
        "batchIndex": -1,
        "batchSize": 0,
    }


@router.post("/{tenant}/{namespace}/{topic}/terminate", responses=TERMINATED)
def terminate(
    name: TopicDep, broker: BrokerDep, partitioned: PartitionedDep, request: Request
) -> dict[str, int]:
    """Terminate the topic: it takes no more messages (producers get TopicTerminated), keeps
    serving reads, and consumers that have read everything are told they reached its end.
    Answers the id of its last message (entry -1: it had none); again, the same id."""
    if partitioned.get(name) is not None:
        raise NotAllowed("Termination of a partitioned topic is not allowed")
    return message_id_json(_terminate(broker, name, request))


def _terminate(broker: Broker, name: TopicName, request: Request) -> Position:
    """Terminate ``name`` here, then close its producers on the binary protocol, as Pulsar
    does: they connect again and are refused with TopicTerminated, their sends failed."""
    last = broker.terminate(name)
    listener = request.app.state.pulsar
    if listener is not None:
        listener.disconnect_producers(name)
    return last


@router.post("/{tenant}/{namespace}/{topic}/terminate/partitions", responses={404: TERMINATED[404]})
def terminate_partitions(
    name: TopicDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    peers: PeersDep,
    auth: AuthorizationDep,
    request: Request,
) -> dict[str, dict[str, int]]:
    """Terminate every partition of a partitioned topic; answers each one's last message id,
    by partition index (each partition's owner asked with several instances)."""
    found = partitioned.require(name)
    out: dict[str, dict[str, int]] = {}
    for i, p in enumerate(found.partition_names()):
        try:
            out[str(i)] = message_id_json(_terminate(broker, p, request))
        except NotOwner as e:
            reply = peers.ask(e.url, "POST", p, "terminate", auth)
            if not reply.ok or not isinstance(reply.body, dict):
                raise Unavailable(f"partition {p} could not be terminated: {reply.error}") from None
            out[str(i)] = reply.body
    return out
