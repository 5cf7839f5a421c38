"""A message by its id at Pulsar's admin path, as Pulsar's admin clients read it (Java's
``Topics.getMessagesById`` / ``getMessageById``, Go's pulsaradmin ``GetMessageByID`` /
``GetMessagesByID``): ``GET /admin/v2/persistent/{t}/{n}/{topic}/ledger/{ledgerId}/entry/{entryId}``.

The reply is Pulsar's: the body the message's payload as a consumer receives it (for a batch,
the uncompressed batch payload, each member after its SingleMessageMetadata, which the clients
split), its metadata in ``X-Pulsar-*`` headers with Pulsar's names and case (Java's admin
client finds ``X-Pulsar-PROPERTY``, a JSON object of the properties, by exact name):
``X-Pulsar-Message-ID`` (``L:E``), publish and event times as ISO-8601 instants, producer name,
sequence id, key, ``X-Pulsar-num-batch-message`` and ``X-Pulsar-batch-size`` for a batch,
``X-Pulsar-Is-Encrypted`` with an encrypted message's algorithm, parameter and keys (its payload
is the ciphertext, never decrypted here), a chunk's fields. The metadata is the one the binary
protocol sends with the message (``api.pulsar.messages``), so both say the same.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import BrokerDep, CanConsume, PartitionedDep, TopicDep
from api.header_case import MARKER
from api.pulsar import encryption
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.messages import batch_message, entry_frame
from api.schemas import ErrorOut
from ledger.entry import ENCRYPTION_PROPERTY, MAX_ID, Entry
from service.message_by_id import message_by_id

router = APIRouter(prefix="/admin/v2/persistent", tags=["messages"])

Id = Annotated[int, Path(ge=0, le=MAX_ID)]
MEDIA_TYPE = "application/octet-stream"


@router.get(
    "/{tenant}/{namespace}/{topic}/ledger/{ledger_id}/entry/{entry_id}",
    response_class=Response,
    dependencies=[CanConsume],
    responses={
        200: {
            "description": "The message's payload (a batch's: its members); its metadata in "
            "X-Pulsar-* headers",
            "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        404: {"description": "No such topic, or no message has this id", "model": ErrorOut},
        405: {
            "description": "A partitioned topic's name: an id names a partition's message",
            "model": ErrorOut,
        },
    },
)
async def get_message_by_id(
    name: TopicDep,
    broker: BrokerDep,
    partitioned: PartitionedDep,
    ledger_id: Id,
    entry_id: Id,
) -> Response:
    """The message stored at ``ledger_id:entry_id``: one sent alone, or a whole batch."""
    entries = await run_in_threadpool(
        message_by_id,
        broker=broker,
        partitioned=partitioned,
        name=name,
        ledger_id=ledger_id,
        entry_id=entry_id,
    )
    metadata, payload = _frame(entries)
    response = Response(payload, media_type=MEDIA_TYPE)
    response.raw_headers.append((b"X-Pulsar-Message-ID", f"{ledger_id}:{entry_id}".encode()))
    response.raw_headers += [(k.encode(), _header_value(v)) for k, v in _headers(metadata, payload)]
    # Pulsar's case of those names on the wire (Java's admin client matches X-Pulsar-PROPERTY by
    # its exact name; uvicorn writes names in lower case): see api.header_case.
    response.raw_headers.append(MARKER)
    return response


def _frame(entries: list[Entry]) -> tuple[pb.MessageMetadata, bytes]:
    """The metadata and payload a consumer receives for the message (``entries``: one sent
    alone, or a batch's members)."""
    first = entries[0]
    if first.batch_index is None:
        raw, payload = entry_frame(first)
    elif first.properties and ENCRYPTION_PROPERTY in first.properties:
        _, raw, payload, _ = encryption.batch_message(entries, first, -1)
    else:
        _, raw, payload, _ = batch_message(entries)
    return pb.MessageMetadata.FromString(raw), payload


def _instant(ms: int) -> str:
    """An ISO-8601 instant in UTC, as Pulsar's DateFormatter writes one (the clients parse it)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms % 1000:03d}".rstrip("0") if ms % 1000 else "") + "Z"


def _header_value(text: str) -> bytes:
    """``text`` as a header value: Latin-1 (what HTTP/1.1 carries), a character it lacks or a
    control character (which would end the header) as ``?``."""
    return _CONTROL.sub(b"?", text.encode("latin-1", "replace"))


_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _headers(md: pb.MessageMetadata, payload: bytes) -> list[tuple[str, str]]:
    """Pulsar's ``X-Pulsar-*`` headers of a message's metadata (PersistentTopicsBase's)."""
    props = {kv.key: kv.value for kv in md.properties}
    out = [
        # JSON in ASCII: a header's value is Latin-1 bytes, a property may be any text.
        ("X-Pulsar-PROPERTY", json.dumps(props, separators=(",", ":"))),
        ("X-Pulsar-publish-time", _instant(md.publish_time)),
    ]
    if md.event_time:
        out.append(("X-Pulsar-event-time", _instant(md.event_time)))
    if md.HasField("deliver_at_time"):
        out.append(("X-Pulsar-deliver-at-time", _instant(md.deliver_at_time)))
    if md.HasField("num_messages_in_batch"):
        out.append(("X-Pulsar-num-batch-message", str(md.num_messages_in_batch)))
        out.append(("X-Pulsar-batch-size", str(len(payload))))
    if md.null_value:
        out.append(("X-Pulsar-null-value", "true"))
    out.append(("X-Pulsar-Is-Encrypted", "true" if md.encryption_keys else "false"))
    if md.producer_name:
        out.append(("X-Pulsar-producer-name", md.producer_name))
    out.append(("X-Pulsar-sequence-id", str(md.sequence_id)))
    if md.HasField("partition_key"):
        # A key a header cannot carry as it is goes as base64, flagged as Pulsar's clients flag
        # a key they encode so.
        if md.partition_key.isascii() and md.partition_key.isprintable():
            out.append(("X-Pulsar-partition-key", md.partition_key))
        else:
            out.append(("X-Pulsar-partition-key", _b64(md.partition_key.encode())))
            out.append(("X-Pulsar-partition-key-b64-encoded", "true"))
    if md.compression:  # an encrypted message's: its ciphertext is of the compressed payload
        out.append(("X-Pulsar-compression", pb.CompressionType.Name(md.compression)))
        out.append(("X-Pulsar-uncompressed-size", str(md.uncompressed_size)))
    if md.encryption_keys:
        out.append(("X-Pulsar-encryption-algo", md.encryption_algo))
        out.append(("X-Pulsar-Base64-encryption-param", _b64(md.encryption_param)))
        out += [("X-Pulsar-Base64-encryption-keys", _b64(k.SerializeToString())) for k in md.encryption_keys]
    if md.HasField("uuid"):
        out += [
            ("X-Pulsar-uuid", md.uuid),
            ("X-Pulsar-num-chunks-from-msg", str(md.num_chunks_from_msg)),
            ("X-Pulsar-total-chunk-msg-size", str(md.total_chunk_msg_size)),
            ("X-Pulsar-chunk-id", str(md.chunk_id)),
        ]
    if md.HasField("ordering_key"):
        out.append(("X-Pulsar-Base64-ordering-key", _b64(md.ordering_key)))
    if md.HasField("schema_version"):
        out.append(("X-Pulsar-Base64-schema-version-b64encoded", _b64(md.schema_version)))
    return out
