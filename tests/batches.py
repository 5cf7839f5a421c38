"""A Pulsar batch as a client lays it out, for tests of the stores that keep batches whole."""

from __future__ import annotations

import struct

import pyarrow as pa

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.messages import to_records
from ledger.entry import Record, StoredBatch, record_size

PUBLISH = 1_700_000_000_000


def batch(
    n: int, *, first_seq: int = 0, tag: str = "m", compression: int = pb.NONE, publish_time: int = PUBLISH
) -> tuple[StoredBatch, list[Record]]:
    """A batch of ``n`` members as a Pulsar client lays it out, and the records it holds."""
    parts = []
    for i in range(n):
        single = pb.SingleMessageMetadata(payload_size=0)
        if i % 3:
            single.partition_key = f"key-{i % 4}"
        if i % 2:
            single.properties.add(key="i", value=str(i))
        if i % 5 == 4:
            single.null_value = True
            value = b""
        else:
            value = f"{tag}-{i}".encode() * (1 + i % 3)
        single.payload_size = len(value)
        meta = single.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, value]
    payload = b"".join(parts)
    md = pb.MessageMetadata(producer_name="p", sequence_id=first_seq, publish_time=1, num_messages_in_batch=n)
    if compression != pb.NONE:
        md.compression = compression
        md.uncompressed_size = len(payload)
        payload = pa.compress(payload, codec="zstd", asbytes=True)
    records = to_records(md, payload, 1 << 30)
    for r in records:
        r.publish_time = publish_time
    stored = StoredBatch(
        metadata=md.SerializeToString(),
        payload=payload,
        count=n,
        size=sum(record_size(r.key, r.value, r.properties) for r in records),
        compression=md.compression,
        uncompressed_size=md.uncompressed_size if compression != pb.NONE else len(payload),
        producer_name="p",
        sequence_id=first_seq,
        publish_time=publish_time,
    )
    return stored, records
