"""Producing and reading messages."""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from api.deps import AuthorizationDep, BrokerDep, CanConsume, CanProduce, PartitionedDep, PeersDep, TopicDep
from api.openapi import DAMAGE_RESPONSES
from api.pulsar.encryption import ENCRYPTION_PROPERTY, rest_view
from api.schemas import PRODUCE_REQUEST, ProduceResponse, ReadResponse, to_records
from ledger.entry import Entry, Position
from service.errors import NotFound, Unavailable
from service.names import TopicName

router = APIRouter(prefix="/topics/persistent", tags=["messages"])
PRODUCE_SCHEMA = PRODUCE_REQUEST.json_schema()  # self-contained: its $defs travel with it


@router.post(
    "/{tenant}/{namespace}/{topic}",
    response_model=ProduceResponse,
    response_model_exclude_none=True,
    dependencies=[CanProduce],
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/json": {"schema": PRODUCE_SCHEMA}}}
    },
)
async def produce(
    name: TopicDep,
    request: Request,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    peers: PeersDep,
    auth: AuthorizationDep,
) -> Response:
    """Append a batch; the reply comes once every message is durable (fsync policy). To a
    partitioned topic, each message goes to the partition Pulsar's client would choose
    (``partitions`` names it; each id is its partition's), stored by the instance that owns
    the partition."""
    # Parsed and validated in one pass by pydantic's own JSON parser: a batch of a thousand
    # messages costs a fraction of json.loads followed by validation of Python objects.
    try:
        body = PRODUCE_REQUEST.validate_json(await request.body())
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None
    messages = body["messages"]
    records = to_records(messages)
    try:
        ids = await run_in_threadpool(broker.produce, name, records)
    except NotFound:
        # Not a topic: a partitioned topic's messages go to its partitions (looked up only
        # now, so that producing to a plain topic costs nothing more).
        found = await run_in_threadpool(partitioned.get, name)
        if found is None:
            raise

        def forward(where: TopicName, owner: str, indexes: list[int]) -> list[Position]:
            reply = peers.produce(owner, where, [dict(messages[i]) for i in indexes], auth)
            if not reply.ok or not isinstance(reply.body, dict):
                reason = f"{where.topic} could not be written at its owner: {reply.error}"
                raise Unavailable(reason, retry_after=1)
            return [Position.parse(i) for i in reply.body["messageIds"]]

        ids, targets = await run_in_threadpool(partitioned.produce, found, records, forward)
        return json_response({"messageIds": [str(p) for p in ids], "partitions": targets})
    # Written as ProduceResponse says, without validating a thousand ids that are ours.
    return json_response({"messageIds": [str(p) for p in ids]})


@router.get(
    "/{tenant}/{namespace}/{topic}/messages",
    response_model=ReadResponse,
    responses=DAMAGE_RESPONSES,
    dependencies=[CanConsume],
)
def read_messages(
    name: TopicDep,
    broker: BrokerDep,
    startMessageId: Annotated[str, Query(max_length=64)] = "earliest",
    maxMessages: Annotated[int, Query(ge=1)] = 100,
    readCompacted: bool = False,
    format: Literal["rows", "columns"] = "rows",
) -> Response:
    entries, nxt = broker.read(name, startMessageId, maxMessages, read_compacted=readCompacted)
    if format == "columns":
        page = columns_json(entries)
        del page["redeliveryCounts"]  # a read is not a delivery
    else:
        page = {"messages": [message_json(e) for e in entries]}
    page["nextMessageId"] = str(nxt) if nxt is not None else None
    return json_response(page)


def json_response(body: object) -> Response:
    """A JSON reply built from plain dicts with orjson: a page can hold thousands of messages,
    and per-message model validation and the standard encoder would dominate a read."""
    return Response(orjson.dumps(body), media_type="application/json")


def message_json(e: Entry, redelivery_count: int | None = None) -> dict[str, object]:
    """A message as the REST API writes it; with ``redelivery_count`` as a consumer gets it."""
    value = e.value
    out: dict[str, object] = {
        "messageId": e.message_id,
        "key": e.key,
        "value": binascii.b2a_base64(value, newline=False).decode() if value is not None else None,
        "properties": e.properties,
        "publishTime": e.publish_time,
        "eventTime": e.event_time,
    }
    if e.properties and ENCRYPTION_PROPERTY in e.properties:
        out["properties"], out["encryption"], value = rest_view(e)
        out["value"] = binascii.b2a_base64(value, newline=False).decode() if value is not None else None
    if redelivery_count is not None:
        out["redeliveryCount"] = redelivery_count
    return out


def columns_json(
    entries: Sequence[Entry], redelivery_counts: Sequence[int] | None = None
) -> dict[str, object]:
    """A page of messages as columns, the compact form a consumer may ask for.

    The same fields as ``message_json``, one array each, plus the values as one base64 string
    of the non-null values laid end to end (``valueLengths`` cuts it; -1 marks a tombstone).
    ``properties``, ``eventTimes`` and ``redeliveryCounts`` are ``null`` when every message
    has none, no event time, or is delivered for the first time. A page of thousands then
    costs no object per message to write, nor to read: the row form spends most of its time
    on per-message dicts and base64 calls.
    """
    columns: Sequence[tuple[Any, ...]] = list(zip(*entries, strict=True)) or [()] * len(Entry._fields)
    lids, eids, keys, values, propss, pts, ets, batch_indexes = columns[:8]
    return {
        "count": len(entries),
        "ledgerIds": lids,
        "entryIds": eids,
        "keys": keys,
        "valueLengths": [len(v) if v is not None else -1 for v in values],
        "values": binascii.b2a_base64(b"".join([v for v in values if v is not None]), newline=False).decode(),
        "properties": propss if any(propss) else None,
        "publishTimes": pts,
        "eventTimes": ets if any(e is not None for e in ets) else None,
        "redeliveryCounts": redelivery_counts,
        # A batch member's index in its batch (ledger.entry.message_id), null for the others;
        # null when no message of the page is a batch member.
        "batchIndexes": batch_indexes if any(b is not None for b in batch_indexes) else None,
    }
