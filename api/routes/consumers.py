"""Consumers of a subscription: attach, receive (long poll), ack, negative ack, redeliver, seek,
close."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonDict

from api.deps import CanConsume, SubscriptionsDep, TopicDep
from api.openapi import DAMAGE_RESPONSES
from api.routes.messages import columns_json, json_response, message_json
from ledger.entry import Position
from service.authorization import Rule
from service.dead_letters import dead_letter_topic
from service.errors import InvalidInput
from service.negative_acks import DEFAULT_DELAY_MS
from service.publishers import ClientInfo, address_of

# Everything a consumer does needs the consume permission.
router = APIRouter(prefix="/topics/persistent", tags=["consumers"], dependencies=[CanConsume])

BASE = "/{tenant}/{namespace}/{topic}/subscription/{sub}/consumers"


_MAX_MS = 2**53  # far beyond any delay, and exact in every JSON reader


class DeadLetterPolicyBody(BaseModel):
    """Pulsar's ``DeadLetterPolicy``: after ``maxRedeliverCount`` redeliveries a message goes to
    ``deadLetterTopic`` (default ``{topic}-{subscription}-DLQ``, in the same namespace)."""

    model_config = ConfigDict(extra="forbid")

    maxRedeliverCount: Annotated[int, Field(ge=1, le=2**31 - 1)]
    deadLetterTopic: Annotated[str | None, Field(min_length=1, max_length=400)] = None


_MULTI: JsonDict = {
    "properties": {"subscriptionType": {"enum": ["Shared", "Key_Shared"]}},
    "required": ["subscriptionType"],
}
# Pulsar's two rules across fields, in the published schema too (a request that breaks them is
# invalid, not a valid one refused): readCompacted is for Exclusive and Failover only, a dead
# letter policy for Shared and Key_Shared only. The route answers 400 with Pulsar's reason.
_ATTACH_RULES: JsonDict = {
    "allOf": [
        {"if": _MULTI, "then": {"properties": {"readCompacted": {"const": False}}}},
        {"if": {"not": _MULTI}, "then": {"properties": {"deadLetterPolicy": {"type": "null"}}}},
    ]
}


class AttachRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_ATTACH_RULES)

    consumerName: Annotated[str | None, Field(max_length=256)] = None
    ackTimeoutMs: Annotated[int, Field(ge=0, le=_MAX_MS)] = 0
    # The consumer's, as Pulsar's ConsumerBuilder.readCompacted: the compacted view up to the
    # horizon then the log, or the whole log; the subscription's position is shared.
    # Exclusive and Failover only (400 otherwise, as Pulsar).
    readCompacted: bool = False
    # Pulsar's SubscriptionType; the subscription's first consumer fixes it.
    subscriptionType: Literal["Exclusive", "Failover", "Shared", "Key_Shared"] = "Exclusive"
    # Lower first. Shared: the highest level that can take messages gets them; Failover: the
    # active consumer is one of the highest level, chosen as Pulsar chooses (service.failover).
    priorityLevel: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    negativeAckRedeliveryDelayMs: Annotated[int, Field(ge=0, le=_MAX_MS)] = DEFAULT_DELAY_MS
    deadLetterPolicy: DeadLetterPolicyBody | None = None


class AttachResponse(BaseModel):
    consumerId: str
    readCompacted: bool
    subscriptionType: str


class ReceiveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    maxMessages: Annotated[int, Field(ge=1)] = 100
    timeoutMs: Annotated[int, Field(ge=0)] = 0
    # "rows": {"messages": [...]} as the read endpoint; "columns": the compact page of
    # ``columns_json``, which the Python client uses.
    format: Literal["rows", "columns"] = "rows"


class AckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messageIds: Annotated[list[str], Field(min_length=1, max_length=100_000)]
    cumulative: bool = False


class NegativeAckRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messageIds: Annotated[list[str], Field(min_length=1, max_length=100_000)]


class SeekRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messageId: str | None = None
    publishTime: Annotated[int | None, Field(ge=0)] = None


def rest_client(request: Request) -> ClientInfo:
    """What stats show of a REST consumer's client: its address, and its ``User-Agent`` as the
    client's version (it has no CONNECT to name one), attached now, with no metadata."""
    peer = request.client
    return ClientInfo(
        address=address_of(peer.host, peer.port) if peer is not None else "",
        client_version=request.headers.get("user-agent", "")[:256],
    )


@router.post(BASE, response_model=AttachResponse)
def attach(
    request: Request, name: TopicDep, sub: str, subs: SubscriptionsDep, body: AttachRequest | None = None
) -> AttachResponse:
    body = body or AttachRequest()
    dead_letter = None
    if body.deadLetterPolicy is not None:
        policy = body.deadLetterPolicy
        dead_letter = (policy.maxRedeliverCount, policy.deadLetterTopic)
        # The service writes the dead letter topic for this consumer: its role must be one that
        # may produce there (Pulsar's client produces to it with the consumer's own role).
        authorizer = request.app.state.authorizer
        if authorizer is not None:
            dlq = dead_letter_topic(name, sub, policy.deadLetterTopic)
            authorizer.check(
                role=request.state.role,
                rule=Rule.PRODUCE,
                tenant=dlq.tenant,
                namespace=dlq.namespace,
                topic=dlq.topic,
            )
    info = subs.attach(
        name,
        sub,
        consumer_name=body.consumerName,
        ack_timeout_ms=body.ackTimeoutMs,
        read_compacted=body.readCompacted,
        subscription_type=body.subscriptionType,
        priority_level=body.priorityLevel,
        negative_ack_redelivery_delay_ms=body.negativeAckRedeliveryDelayMs,
        dead_letter=dead_letter,
        client=rest_client(request),
    )
    return AttachResponse(
        consumerId=info.consumer_id,
        readCompacted=info.read_compacted,
        subscriptionType=info.subscription_type,
    )


@router.delete(BASE + "/{consumer_id}", status_code=204, response_class=Response)
def detach(name: TopicDep, sub: str, consumer_id: str, subs: SubscriptionsDep) -> Response:
    subs.detach(name, sub, consumer_id)
    return Response(status_code=204)


@router.post(BASE + "/{consumer_id}/receive", responses=DAMAGE_RESPONSES)
async def receive(
    name: TopicDep, sub: str, consumer_id: str, subs: SubscriptionsDep, body: ReceiveRequest | None = None
) -> Response:
    body = body or ReceiveRequest()
    # A long poll blocks a worker thread for up to 30 s; the app raises the thread limit.
    delivered = await run_in_threadpool(
        subs.receive, name, sub, consumer_id, max_messages=body.maxMessages, timeout_ms=body.timeoutMs
    )
    if body.format == "columns":
        return json_response(columns_json(delivered.entries, delivered.redelivery_counts))
    return json_response({"messages": [message_json(e, n) for e, n in delivered]})


@router.post(BASE + "/{consumer_id}/ack", status_code=204, response_class=Response)
def ack(name: TopicDep, sub: str, consumer_id: str, body: AckRequest, subs: SubscriptionsDep) -> Response:
    ids = [_parse_id(m) for m in body.messageIds]
    subs.ack(name, sub, consumer_id, ids, cumulative=body.cumulative)
    return Response(status_code=204)


@router.post(BASE + "/{consumer_id}/negativeAcks", status_code=204, response_class=Response)
def negative_ack(
    name: TopicDep, sub: str, consumer_id: str, body: NegativeAckRequest, subs: SubscriptionsDep
) -> Response:
    """Deliver the messages again once the consumer's ``negativeAckRedeliveryDelayMs`` passes."""
    ids = [_parse_id(m) for m in body.messageIds]
    subs.negative_ack(name, sub, consumer_id, ids)
    return Response(status_code=204)


@router.post(BASE + "/{consumer_id}/redeliver", status_code=204, response_class=Response)
def redeliver(name: TopicDep, sub: str, consumer_id: str, subs: SubscriptionsDep) -> Response:
    subs.redeliver(name, sub, consumer_id)
    return Response(status_code=204)


@router.post(BASE + "/{consumer_id}/seek", status_code=204, response_class=Response)
def seek(name: TopicDep, sub: str, consumer_id: str, body: SeekRequest, subs: SubscriptionsDep) -> Response:
    subs.seek(name, sub, message_id=body.messageId, publish_time=body.publishTime, consumer_id=consumer_id)
    return Response(status_code=204)


def _parse_id(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as e:
        raise InvalidInput(str(e)) from None
