"""A message of the topic as the wire carries it, both ways: a producer's payload frame into a
``Record``, an ``Entry`` of the log into the metadata and payload of a MESSAGE frame."""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence

from google.protobuf.message import DecodeError

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.chunks import CHUNK_PROPERTY, chunk_frame, refuse_reserved
from api.pulsar.encryption import (
    ENCRYPTION_PROPERTY,
    apply_context,
    encrypted_batch_payload,
    encrypted_record,
    first_member_value,
    is_encrypted,
)
from api.pulsar.errors import ProtocolError
from ledger.batch_encoder import encode_batch_payload
from ledger.batches import BatchError, batch_size, uncompressed
from ledger.entry import Entry, Position, Record, StoredBatch
from service.names import TopicName, partition_of

# Ids on the wire are unsigned 64-bit; Pulsar's earliest (-1:-1) arrives as 2**64 - 1.
_U64 = 2**64
EARLIEST_ID = Position(-1, -1)
LATEST_ID = Position(2**63 - 1, 2**63 - 1)


# A batch may not claim more members than this (the clients' default is 1,000 messages).
MAX_BATCH_MESSAGES = 100_000
_SIZE = struct.Struct(">I")
_BATCH_INDEX = operator.itemgetter(Entry._fields.index("batch_index"))


def to_records(metadata: pb.MessageMetadata, payload: bytes, max_size: int) -> list[Record]:
    """The messages of one SEND: the message itself, or every member of a batch (its index and
    size kept, see ``ledger.entry.message_id``). A ``null_value`` message is stored with a null
    value (a delete when keyed, as an empty value is: Pulsar's rule). ``max_size`` bounds what
    a compressed payload may expand to. (The broker stores a batch whole, see
    :func:`to_batch`; this decodes one member by member, for tests and tools. A chunk of a
    chunked message is ``api.pulsar.chunks.chunk_record``'s.) An encrypted message is stored as
    it came (``api.pulsar.encryption``)."""
    _check_sendable(metadata)
    if is_encrypted(metadata) and not metadata.HasField("num_messages_in_batch"):
        return [encrypted_record(metadata, payload, max_size)]
    payload = _uncompressed(metadata, payload, max_size)
    deliver_at = metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None
    version = metadata.schema_version if metadata.HasField("schema_version") else None
    if not metadata.HasField("num_messages_in_batch"):
        record = _record(
            metadata,
            payload,
            metadata.producer_name,
            metadata.sequence_id,
            deliver_at=deliver_at,
            schema_version=version,
        )
        if record.properties and ENCRYPTION_PROPERTY in record.properties:
            raise ProtocolError(
                pb.NotAllowedError, f"the property {ENCRYPTION_PROPERTY!r} is the service's own"
            )
        return [record]
    return _members(metadata, payload, deliver_at, version)


def _check_sendable(metadata: pb.MessageMetadata) -> None:
    # A chunk of a chunked message is not for here: ``api.pulsar.chunks.chunk_record`` (the
    # caller routes it there, and :func:`to_batch` refuses a batch that claims to be one).
    if metadata.sequence_id >= _U64 // 2:
        raise ProtocolError(pb.NotAllowedError, f"sequence id {metadata.sequence_id} above 2**63 - 1")


def _uncompressed(metadata: pb.MessageMetadata, payload: bytes, max_size: int) -> bytes:
    try:
        return uncompressed(metadata.compression, payload, metadata.uncompressed_size, max_size)
    except BatchError as e:
        raise ProtocolError(pb.NotAllowedError, str(e)) from e


def is_batch(metadata: pb.MessageMetadata) -> bool:
    return metadata.HasField("num_messages_in_batch")


def to_batch(metadata: pb.MessageMetadata, raw_metadata: bytes, payload: bytes) -> StoredBatch:
    """A batched SEND as the ledger stores it: whole, as sent, its members not decoded (they
    are checked off the event loop, :func:`check_batch`, before it is written). Its size is
    unknown (-1) until then. An encrypted batch is stored as ``api.pulsar.encryption`` says."""
    _check_sendable(metadata)
    if metadata.num_chunks_from_msg > 1:
        raise ProtocolError(pb.NotAllowedError, "a batch cannot be a chunk")
    n = metadata.num_messages_in_batch
    if not 0 < n <= MAX_BATCH_MESSAGES:
        raise ProtocolError(pb.NotAllowedError, f"a batch of {n} messages")
    if is_encrypted(metadata):
        members = encrypted_batch_payload(metadata, payload)
        return StoredBatch(
            metadata=raw_metadata,
            payload=members,
            count=n,
            size=-1,
            uncompressed_size=len(members),
            producer_name=metadata.producer_name,
            sequence_id=metadata.sequence_id,
            deliver_at_time=metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None,
            ordering_key=metadata.ordering_key if metadata.HasField("ordering_key") else None,
            schema_version=metadata.schema_version if metadata.HasField("schema_version") else None,
        )
    return StoredBatch(
        metadata=raw_metadata,
        payload=payload,
        count=n,
        size=-1,
        compression=metadata.compression,
        uncompressed_size=metadata.uncompressed_size if metadata.compression != pb.NONE else len(payload),
        producer_name=metadata.producer_name,
        sequence_id=metadata.sequence_id,
        deliver_at_time=metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None,
        ordering_key=metadata.ordering_key if metadata.HasField("ordering_key") else None,
        schema_version=metadata.schema_version if metadata.HasField("schema_version") else None,
    )


def check_batch(batch: StoredBatch, max_size: int) -> None:
    """Check a batch's members as Pulsar's clients lay them out, in bulk, and set its size;
    ``ProtocolError`` if it does not decode (or expands past ``max_size``)."""
    try:
        batch.size = batch_size(batch, max_size, MAX_BATCH_MESSAGES)
    except BatchError as e:
        raise ProtocolError(pb.NotAllowedError, str(e)) from e


def _record(
    md: pb.MessageMetadata | pb.SingleMessageMetadata,
    payload: bytes,
    producer: str,
    sequence_id: int,
    index: int | None = None,
    size: int | None = None,
    *,
    deliver_at: int | None = None,
    schema_version: bytes | None = None,
    ordering_key: bytes | None = None,
) -> Record:
    if md.HasField("ordering_key"):
        ordering_key = md.ordering_key
    props = {kv.key: kv.value for kv in md.properties} if md.properties else {}
    if props and CHUNK_PROPERTY in props:
        refuse_reserved(props)
    return Record(
        md.partition_key if md.HasField("partition_key") else None,
        None if md.null_value else payload,
        props,
        0,
        md.event_time or None,
        index,
        size,
        producer,
        sequence_id,
        deliver_at,
        ordering_key,
        schema_version,
    )


def _members(
    metadata: pb.MessageMetadata, payload: bytes, deliver_at: int | None, version: bytes | None
) -> list[Record]:
    """A batch's members: each ``[u32 metadata size][SingleMessageMetadata][payload]``. The
    batch's schema version is every member's; a member's own ordering key before the batch's."""
    n = metadata.num_messages_in_batch
    if not 0 < n <= MAX_BATCH_MESSAGES:
        raise ProtocolError(pb.NotAllowedError, f"a batch of {n} messages")
    view = memoryview(payload)
    total = len(payload)
    producer, first = metadata.producer_name, metadata.sequence_id
    ordering = metadata.ordering_key if metadata.HasField("ordering_key") else None
    records: list[Record] = []
    append = records.append
    # Locals: this loop runs once per message of every batch produced.
    parse, unpack, new = pb.SingleMessageMetadata.FromString, _SIZE.unpack_from, Record
    at = 0
    try:
        for i in range(n):
            (size,) = unpack(view, at)
            at += 4
            end = at + size
            if end > total:
                raise ValueError("a member's metadata overruns the batch")
            single = parse(view[at:end])
            at = end
            end = at + single.payload_size
            if end > total:
                raise ValueError("a member's payload overruns the batch")
            if single.compacted_out:
                # Member i is stored at the batch's entry + i: a producer's batch has every member.
                raise ValueError(f"member {i} is marked compacted out")
            props = single.properties
            append(
                new(
                    single.partition_key if single.HasField("partition_key") else None,
                    None if single.null_value else payload[at:end],
                    {kv.key: kv.value for kv in props} if props else {},
                    0,
                    single.event_time or None,
                    i,
                    n,
                    producer,
                    # A member's own sequence id, else the batch's first plus its index (as
                    # clients number them).
                    single.sequence_id if single.HasField("sequence_id") else first + i,
                    deliver_at,
                    single.ordering_key if single.HasField("ordering_key") else ordering,
                    version,
                )
            )
            at = end
    except (struct.error, ValueError, DecodeError) as e:
        raise ProtocolError(pb.NotAllowedError, f"malformed batch: {e}") from e
    if at != len(view):
        raise ProtocolError(pb.NotAllowedError, f"malformed batch: {len(view) - at} bytes after its members")
    return records


def batch_message(
    entries: Sequence[Entry], partition: int = -1
) -> tuple[pb.MessageIdData, bytes, bytes, list[int]]:
    """One MESSAGE for consecutive members of one stored batch: its id ``(L, E)`` (in
    ``partition``, see :func:`partition_index`), the metadata, the payload and the ``ack_set``.
    The payload has every member slot of the batch, so that the client numbers the members as
    the producer did; a slot whose member is not sent (acked, compacted out, or in another page)
    is an empty placeholder, and ``ack_set`` -- the members to deliver, the bit Pulsar's clients
    honour -- leaves it out (empty when all are sent)."""
    first = entries[0]
    assert first.batch_index is not None and first.batch_size is not None
    n = first.batch_size
    payload = encode_batch_payload(entries, n)
    present = set(map(_BATCH_INDEX, entries))
    present.discard(None)
    md = pb.MessageMetadata(
        producer_name=first.producer_name or "",
        # The batch's first sequence id (never below 0: a member may carry one of its own).
        sequence_id=max(0, (first.sequence_id or 0) - (first.batch_index or 0)),
        publish_time=first.publish_time,
        num_messages_in_batch=n,
    )
    if first.schema_version is not None:
        md.schema_version = first.schema_version
    ack_set: list[int] = []
    if len(present) != n:
        words = [0] * ((n + 63) // 64)
        for i in present:
            words[i // 64] |= 1 << (i % 64)
        ack_set = [w - (1 << 64) if w >= 1 << 63 else w for w in words]  # int64 on the wire
    mid = pb.MessageIdData(
        ledgerId=first.ledger_id, entryId=first.entry_id - first.batch_index, partition=partition
    )
    return mid, md.SerializeToString(), payload, ack_set


def stored_message(batch: StoredBatch) -> tuple[bytes, bytes]:
    """A stored batch's metadata and payload as its consumers receive them: as its producer
    sent them, with the broker's publish time (every id and time a client sees is the same over
    every path); an encrypted batch's payload is its ciphertext (``api.pulsar.encryption``)."""
    if not batch.metadata:  # rebuilt from a sealed ledger's rows (``ledger.entry.BatchEntry``)
        md = pb.MessageMetadata(
            producer_name=batch.producer_name,
            sequence_id=batch.sequence_id,
            publish_time=batch.publish_time,
            num_messages_in_batch=batch.count,
        )
        if batch.deliver_at_time is not None:
            md.deliver_at_time = batch.deliver_at_time
        if batch.schema_version is not None:
            md.schema_version = batch.schema_version
        return md.SerializeToString(), batch.payload
    md = pb.MessageMetadata.FromString(batch.metadata)
    md.publish_time = batch.publish_time
    if md.encryption_keys:
        return md.SerializeToString(), first_member_value(batch.payload)
    return md.SerializeToString(), batch.payload


def entry_metadata(e: Entry) -> bytes:
    """The serialized ``MessageMetadata`` a consumer receives with ``e`` (a message that is no
    chunk and holds no encryption context: see :func:`entry_frame`)."""
    return message_metadata(e).SerializeToString()


def entry_frame(e: Entry) -> tuple[bytes, bytes]:
    """The metadata and payload of the MESSAGE a consumer receives for ``e``: a stored chunk of a
    chunked message (``api.pulsar.chunks``), or an encrypted message, whose context goes to the
    metadata, not to the properties, and whose payload is the ciphertext (``api.pulsar.encryption``)."""
    if e.properties and CHUNK_PROPERTY in e.properties:
        framed = chunk_frame(e, message_metadata)
        if framed is not None:
            return framed
    md = _message_metadata(e)
    payload = e.value or b""
    if e.properties and ENCRYPTION_PROPERTY in e.properties:
        e, payload = apply_context(md, e)
    _describe(md, e)
    return md.SerializeToString(), payload


def message_metadata(e: Entry) -> pb.MessageMetadata:
    """The ``MessageMetadata`` of a message sent alone, as a consumer receives it with ``e``."""
    md = _message_metadata(e)
    _describe(md, e)
    return md


def _message_metadata(e: Entry) -> pb.MessageMetadata:
    md = pb.MessageMetadata(
        producer_name=e.producer_name or "", sequence_id=e.sequence_id or 0, publish_time=e.publish_time
    )
    if e.deliver_at_time is not None:
        md.deliver_at_time = e.deliver_at_time
    if e.schema_version is not None:
        md.schema_version = e.schema_version
    return md


def _describe(md: pb.MessageMetadata | pb.SingleMessageMetadata, e: Entry) -> None:
    """The fields a message and a batch member share: key, ordering key, properties, event
    time, null value."""
    if e.key is not None:
        md.partition_key = e.key
    if e.ordering_key is not None:
        md.ordering_key = e.ordering_key
    if e.properties:
        md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in e.properties.items())
    if e.event_time:
        md.event_time = e.event_time
    if e.value is None:
        md.null_value = True


def partition_index(name: TopicName) -> int:
    """The partition a topic's message ids name, as Pulsar's broker names it: ``i`` for the
    topic ``x-partition-i`` (a partition of a partitioned topic), -1 for any other topic. The
    official C++ client (the Python client's core) takes a received message's partition from its
    id; the Java and Go clients use the partition they subscribed to. Computed once, when a
    consumer attaches: every id it is sent carries it."""
    of = partition_of(name)
    return -1 if of is None else of[1]


def id_data(pos: Position, partition: int = -1) -> pb.MessageIdData:
    """A position as a wire id (a negative id, as -1:-1, as the uint64 Pulsar sends for it), in
    ``partition`` (:func:`partition_index`; -1, as Pulsar sends it, for a topic that is not a
    partition)."""
    return pb.MessageIdData(ledgerId=pos.ledger_id % _U64, entryId=pos.entry_id % _U64, partition=partition)


def position(data: pb.MessageIdData) -> Position:
    """A wire id as the log's position; Pulsar's earliest (-1:-1) and latest (2**63-1) pass
    through as the signed values the service uses. A batch member's id ``(L, E, i)`` is the
    position ``(L, E + i)`` (``ledger.entry.message_id``). The partition the clients write into
    acks, seeks and redelivery requests names the topic the consumer is on: it plays no part in
    a position, here as in Pulsar's broker."""
    lid, eid = data.ledgerId, data.entryId
    if lid >= _U64 // 2:
        lid -= _U64
    if eid >= _U64 // 2:
        eid -= _U64
    if data.batch_index > 0 and 0 <= eid < LATEST_ID.entry_id - data.batch_index:
        eid += data.batch_index
    return Position(lid, eid)


def entry_id_data(e: Entry, partition: int = -1) -> pb.MessageIdData:
    """The wire id of a stored message, in ``partition``: a batch member's names its batch and
    index."""
    if e.batch_index is None:
        return id_data(e.position, partition)
    return pb.MessageIdData(
        ledgerId=e.ledger_id,
        entryId=e.entry_id - e.batch_index,
        partition=partition,
        batch_index=e.batch_index,
        batch_size=e.batch_size or 0,
    )
