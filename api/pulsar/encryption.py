"""End-to-end encrypted messages (Pulsar producers with ``encryption_key`` set), passed through.

A producer with encryption on compresses, then encrypts each message's payload (a batch's whole
payload: its members' metadata and payloads together) with a data key, which it encrypts with
each consumer key named in ``encryption_keys``. The broker never decrypts: it stores the
ciphertext as it came and gives every consumer the same ``encryption_keys``,
``encryption_algo``, ``encryption_param``, ``compression`` and ``uncompressed_size`` with it, so
that a consumer with the private key decrypts, and one without it does what its crypto-failure
action says (FAIL: not delivered, redelivered later; DISCARD: acknowledged; CONSUME: delivered
undecrypted, an encrypted batch as one message). Keys, properties, event times and sequence ids
stay in plaintext in ``MessageMetadata``, so an encrypted message compacts by its key.

Stored as chunks of chunked messages keep their fields (``api.pulsar.chunks``): no ledger
format change, the context is one property of the service's own, :data:`ENCRYPTION_PROPERTY`
(the fields above as a serialized ``MessageMetadata``, base64), which consumers never see as a
property and no producer may set.

- A message sent alone is one ``Record``: its value the ciphertext, the context in the property.
  A keyed one its producer declares empty (``uncompressed_size`` 0) is a delete for compaction,
  as Pulsar's compactor decides it: stored with an empty value, its ciphertext kept in the
  property after the context, and sent to consumers as it came.
- An encrypted batch cannot be split (its members' metadata are inside the ciphertext). It keeps
  its ``n`` positions ``E .. E+n-1``, as every batch (``ledger.entry.message_id``), so that the
  ids its consumers see and acknowledge, ``L:E:i``, are the ones of any batch: it is stored as a
  batch (``StoredBatch``) of ``n`` members whose first holds the whole ciphertext with the
  context (and ``num_messages_in_batch``) and the batch's own key and properties, and the
  others are empty (a null value, no key, the
  property empty). A consumer of the log is sent the ciphertext as the producer sent it, one
  MESSAGE for the batch, the members it should not get left out by ``ack_set``. Compaction sees
  one message under the batch's key (its first member), as Pulsar's compactor treats a batch it
  cannot read; the empty members are always dropped. Read from a compacted ledger (its first
  member alone), the batch goes whole.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from ledger.batch_encoder import encode_batch_payload
from ledger.entry import ENCRYPTION_PROPERTY, Entry, Record

__all__ = [
    "ENCRYPTION_PROPERTY",
    "apply_context",
    "batch_message",
    "context",
    "context_property",
    "encrypted_batch_payload",
    "encrypted_record",
    "first_member_value",
    "is_encrypted",
    "parse",
    "rest_view",
]

_SIZE = struct.Struct(">I")


def is_encrypted(metadata: pb.MessageMetadata) -> bool:
    return len(metadata.encryption_keys) > 0


def context_property(
    metadata: pb.MessageMetadata, batch_size: int | None, ciphertext: bytes | None = None
) -> str:
    """The :data:`ENCRYPTION_PROPERTY` value of a message (``batch_size`` None) or of an
    encrypted batch's first member: the context, base64; then ``.`` and the ciphertext, base64,
    for a message stored with an empty value (see :func:`encrypted_record`)."""
    ctx = pb.MessageMetadata(encryption_keys=metadata.encryption_keys, compression=metadata.compression)
    if metadata.HasField("encryption_algo"):
        ctx.encryption_algo = metadata.encryption_algo
    if metadata.HasField("encryption_param"):
        ctx.encryption_param = metadata.encryption_param
    if metadata.HasField("uncompressed_size"):
        ctx.uncompressed_size = metadata.uncompressed_size
    if batch_size is not None:
        ctx.num_messages_in_batch = batch_size
    value = base64.b64encode(ctx.SerializePartialToString()).decode()
    return value if ciphertext is None else f"{value}.{base64.b64encode(ciphertext).decode()}"


def parse(value: str) -> tuple[pb.MessageMetadata, bytes | None] | None:
    """The context an :data:`ENCRYPTION_PROPERTY` value holds, and the ciphertext when the value
    holds it; None when it holds none (an encrypted batch's later member, or a value the service
    did not write, which is then an ordinary property)."""
    if not value:
        return None
    head, _, tail = value.partition(".")
    try:
        ctx = pb.MessageMetadata.FromString(base64.b64decode(head, validate=True))
        ciphertext = base64.b64decode(tail, validate=True) if tail else None
    except (binascii.Error, ValueError, DecodeError):
        return None
    return (ctx, ciphertext) if ctx.encryption_keys else None


def context(value: str) -> pb.MessageMetadata | None:
    """The context an :data:`ENCRYPTION_PROPERTY` value holds (:func:`parse`)."""
    parsed = parse(value)
    return parsed[0] if parsed is not None else None


def encrypted_record(metadata: pb.MessageMetadata, payload: bytes, max_size: int) -> Record:
    """An encrypted message sent alone as the ledger stores it: the ciphertext as it came (it
    cannot be decompressed), the context in its property. A null value (nothing encrypted) is
    stored null. A keyed message whose producer declares it empty (``uncompressed_size`` 0)
    deletes its key, as Pulsar's compactor takes it: stored with an empty value, the ciphertext
    in the property, so that its consumers still get the ciphertext."""
    if metadata.uncompressed_size > max_size:
        raise ProtocolError(
            pb.NotAllowedError, f"the payload expands to {metadata.uncompressed_size} bytes, above {max_size}"
        )
    props = {kv.key: kv.value for kv in metadata.properties} if metadata.properties else {}
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    value: bytes | None = None if metadata.null_value else payload
    if (
        value
        and key is not None
        and metadata.HasField("uncompressed_size")
        and metadata.uncompressed_size == 0
    ):
        props[ENCRYPTION_PROPERTY] = context_property(metadata, None, value)
        value = b""
    else:
        props[ENCRYPTION_PROPERTY] = context_property(metadata, None)
    return Record(
        key,
        value,
        props,
        0,
        metadata.event_time or None,
        None,
        None,
        metadata.producer_name,
        metadata.sequence_id,
        metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None,
        metadata.ordering_key if metadata.HasField("ordering_key") else None,
        metadata.schema_version if metadata.HasField("schema_version") else None,
    )


def encrypted_batch_payload(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """The members an encrypted batch of ``num_messages_in_batch`` is stored as, laid out as an
    uncompressed batch payload (see the module docstring): the first holds the ciphertext."""
    n = metadata.num_messages_in_batch
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    first = metadata.sequence_id
    members = [
        Entry(
            0,
            0,
            key,
            payload,
            {
                **{kv.key: kv.value for kv in metadata.properties},
                ENCRYPTION_PROPERTY: context_property(metadata, n),
            },
            0,
            metadata.event_time or None,
            0,
            n,
            None,
            first,
        )
    ]
    members += [
        Entry(0, i, None, None, {ENCRYPTION_PROPERTY: ""}, 0, None, i, n, None, first + i)
        for i in range(1, n)
    ]
    return encode_batch_payload(members, n)


def first_member_value(payload: bytes) -> bytes:
    """The ciphertext of a stored encrypted batch: its first member's value."""
    (size,) = _SIZE.unpack_from(payload, 0)
    single = pb.SingleMessageMetadata.FromString(payload[4 : 4 + size])
    return payload[4 + size : 4 + size + single.payload_size]


def apply_context(md: pb.MessageMetadata, e: Entry) -> tuple[Entry, bytes]:
    """Set the context ``e``'s :data:`ENCRYPTION_PROPERTY` holds in ``md`` (the metadata a
    consumer receives with ``e``); return ``e`` without that property and the payload to send
    (the ciphertext). ``e`` and its value unchanged when the property holds no context."""
    parsed = parse(e.properties[ENCRYPTION_PROPERTY])
    if parsed is None:
        return e, e.value or b""
    ctx, ciphertext = parsed
    ctx.ClearField("num_messages_in_batch")
    md.MergeFrom(ctx)
    e = e._replace(properties={k: v for k, v in e.properties.items() if k != ENCRYPTION_PROPERTY})
    return e, ciphertext if ciphertext is not None else e.value or b""


def batch_message(
    members: Sequence[Entry], first: Entry, partition: int
) -> tuple[pb.MessageIdData, bytes, bytes, list[int]]:
    """One MESSAGE for members of a stored encrypted batch whose first member is ``first``
    (``ledger.entry.Entry``, read with them or on its own): its id, metadata, the ciphertext and
    the ``ack_set`` of the members to deliver. The first member alone (a compacted ledger keeps
    nothing else of the batch) sends the batch whole."""
    n = first.batch_size or 1
    ctx = context(first.properties.get(ENCRYPTION_PROPERTY, ""))
    md = pb.MessageMetadata(
        producer_name=first.producer_name or "",
        sequence_id=max(0, first.sequence_id or 0),
        publish_time=first.publish_time,
        num_messages_in_batch=n,
    )
    if first.key is not None:
        md.partition_key = first.key
    if first.ordering_key is not None:
        md.ordering_key = first.ordering_key
    if first.event_time:
        md.event_time = first.event_time
    if first.deliver_at_time is not None:
        md.deliver_at_time = first.deliver_at_time
    md.properties.extend(
        pb.KeyValue(key=k, value=v) for k, v in first.properties.items() if k != ENCRYPTION_PROPERTY
    )
    if first.schema_version is not None:
        md.schema_version = first.schema_version
    if ctx is not None:
        ctx.ClearField("num_messages_in_batch")
        md.MergeFrom(ctx)
    present = {m.batch_index for m in members}
    ack_set: list[int] = []
    if len(present) != n and present != {0}:
        words = [0] * ((n + 63) // 64)
        for i in present:
            if i is not None and 0 <= i < n:
                words[i // 64] |= 1 << (i % 64)
        ack_set = [w - (1 << 64) if w >= 1 << 63 else w for w in words]  # int64 on the wire
    mid = pb.MessageIdData(ledgerId=first.ledger_id, entryId=first.entry_id, partition=partition)
    return mid, md.SerializeToString(), first.value or b"", ack_set


def rest_view(e: Entry) -> tuple[dict[str, str], dict[str, object] | None, bytes | None]:
    """``e``'s properties, encryption context and value as the REST API shows them (``e`` holds
    :data:`ENCRYPTION_PROPERTY`): the context as ``encryption`` (base64 for bytes; an encrypted
    batch's later member names the member that holds the batch), not as a property; the value
    is the ciphertext."""
    value = e.properties[ENCRYPTION_PROPERTY]
    props = {k: v for k, v in e.properties.items() if k != ENCRYPTION_PROPERTY}
    parsed = parse(value)
    if parsed is None:
        if value == "" and e.batch_index:
            return props, {"batchFirstMessageId": f"{e.ledger_id}:{e.entry_id - e.batch_index}:0"}, e.value
        return e.properties, None, e.value
    ctx, ciphertext = parsed
    b64 = base64.b64encode
    return (
        props,
        {
            "keys": [
                {
                    "key": k.key,
                    "value": b64(k.value).decode(),
                    "metadata": {kv.key: kv.value for kv in k.metadata},
                }
                for k in ctx.encryption_keys
            ],
            "algorithm": ctx.encryption_algo,
            "param": b64(ctx.encryption_param).decode(),
            "compression": pb.CompressionType.Name(ctx.compression),
            "uncompressedSize": ctx.uncompressed_size,
            "batchSize": ctx.num_messages_in_batch if ctx.HasField("num_messages_in_batch") else None,
        },
        ciphertext if ciphertext is not None else e.value,
    )
