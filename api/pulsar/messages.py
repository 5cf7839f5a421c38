"""A message of the topic as the wire carries it, both ways: a producer's payload frame into a
``Record``, an ``Entry`` of the log into the metadata and payload of a MESSAGE frame."""

from __future__ import annotations

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from ledger.entry import Entry, Position, Record

# Ids on the wire are unsigned 64-bit; Pulsar's earliest (-1:-1) arrives as 2**64 - 1.
_U64 = 2**64
EARLIEST_ID = Position(-1, -1)
LATEST_ID = Position(2**63 - 1, 2**63 - 1)


def to_record(metadata: pb.MessageMetadata, payload: bytes) -> Record:
    """One unbatched message. A ``null_value`` message is stored with a null value (a delete
    when keyed, as an empty value is: Pulsar's rule)."""
    if metadata.HasField("num_messages_in_batch"):  # a batch entry, even of one message
        raise ProtocolError(pb.NotAllowedError, "batched messages are not supported yet; disable batching")
    if metadata.compression != pb.NONE:
        raise ProtocolError(pb.NotAllowedError, "compressed messages are not supported yet")
    if metadata.HasField("num_chunks_from_msg") or metadata.encryption_keys:
        raise ProtocolError(pb.NotAllowedError, "chunked or encrypted messages are not supported")
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    return Record(
        key=key,
        value=None if metadata.null_value else payload,
        properties={kv.key: kv.value for kv in metadata.properties},
        event_time=metadata.event_time or None,
    )


def entry_metadata(e: Entry) -> bytes:
    """The serialized ``MessageMetadata`` a consumer receives with ``e``."""
    md = pb.MessageMetadata(producer_name="", sequence_id=0, publish_time=e.publish_time)
    if e.key is not None:
        md.partition_key = e.key
    if e.properties:
        md.properties.extend(pb.KeyValue(key=k, value=v) for k, v in e.properties.items())
    if e.event_time:
        md.event_time = e.event_time
    if e.value is None:
        md.null_value = True
    return md.SerializeToString()


def id_data(pos: Position, partition: int = -1) -> pb.MessageIdData:
    """A position as a wire id (a negative id, as -1:-1, as the uint64 Pulsar sends for it)."""
    return pb.MessageIdData(ledgerId=pos.ledger_id % _U64, entryId=pos.entry_id % _U64, partition=partition)


def position(data: pb.MessageIdData) -> Position:
    """A wire id as the log's position; Pulsar's earliest (-1:-1) and latest (2**63-1) pass
    through as the signed values the service uses."""
    lid, eid = data.ledgerId, data.entryId
    if lid >= _U64 // 2:
        lid -= _U64
    if eid >= _U64 // 2:
        eid -= _U64
    return Position(lid, eid)
