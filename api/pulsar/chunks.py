"""Chunked messages (Pulsar's ``chunking_enabled`` producers) over the wire, both ways.

A producer with chunking on splits a message whose (compressed) payload does not fit the
``max_message_size`` the service announced into chunks, each sent as its own SEND whose
``MessageMetadata`` carries ``uuid``, ``chunk_id`` (0..n-1), ``num_chunks_from_msg`` (n) and
``total_chunk_msg_size`` (the whole compressed payload's bytes); every chunk has the message's
key, properties, sequence id, compression and uncompressed size, and gets its own receipt. As
Pulsar's broker, the service stores each chunk as the entry it is and leaves reassembly to the
consumer: a consumer of the log receives every chunk with those fields, and the client puts the
message back together (by ``uuid``, chunks in ``chunk_id`` order; the message's id is its
chunks' ids). How the log stores them, and why a last chunk holds the whole message: see
``service.chunked``. This module turns a SEND into a stored chunk (:func:`chunk_record`), joins
a producer's chunks into their last one's record (:class:`ChunkAssembly`), and a stored chunk
back into a MESSAGE (:func:`chunk_frame`).
"""

from __future__ import annotations

from collections.abc import Callable

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from ledger.entry import Entry, Position, Record, record_size
from service.chunked import CHUNK_PROPERTY, ChunkFields, fields_of, own_payload, user_properties

__all__ = ["CHUNK_PROPERTY", "ChunkAssembly", "chunk_frame", "chunk_record", "refuse_reserved"]


def refuse_reserved(properties: dict[str, str]) -> None:
    """A producer may not set the property the service keeps chunk fields in."""
    if CHUNK_PROPERTY in properties:
        raise ProtocolError(pb.NotAllowedError, f"the property {CHUNK_PROPERTY!r} is the service's own")


def chunk_record(metadata: pb.MessageMetadata, payload: bytes, max_size: int, max_total: int) -> Record:
    """A chunk as the log stores it (keyless, its key in its fields: ``service.chunked``);
    ``ProtocolError`` (Pulsar's ``NotAllowedError``) for chunk fields that do not add up, a chunk
    over ``max_size`` or a message over ``max_total``."""
    n, chunk_id, total = metadata.num_chunks_from_msg, metadata.chunk_id, metadata.total_chunk_msg_size
    if not metadata.uuid:
        raise ProtocolError(pb.NotAllowedError, "a chunk without a uuid")
    if metadata.HasField("num_messages_in_batch"):
        raise ProtocolError(pb.NotAllowedError, "a batch cannot be a chunk")
    if metadata.encryption_keys:
        raise ProtocolError(pb.NotAllowedError, "chunked messages that are also encrypted are not supported")
    if not 0 <= chunk_id < n:
        raise ProtocolError(pb.NotAllowedError, f"chunk {chunk_id} of a message of {n} chunks")
    if total < len(payload) or total < n or not payload:
        raise ProtocolError(
            pb.NotAllowedError, f"chunk {chunk_id} of {n}: {len(payload)} bytes of a message of {total} bytes"
        )
    if total > max_total:
        raise ProtocolError(
            pb.NotAllowedError, f"a chunked message of {total} bytes; the limit is {max_total}"
        )
    if metadata.null_value:
        raise ProtocolError(pb.NotAllowedError, "a chunk of a null value")
    props = {kv.key: kv.value for kv in metadata.properties} if metadata.properties else {}
    refuse_reserved(props)
    key = metadata.partition_key if metadata.HasField("partition_key") else None
    size = record_size(key, payload, props)
    if size > max_size:
        raise ProtocolError(pb.NotAllowedError, f"chunk is {size} bytes; the limit is {max_size}")
    compression = metadata.compression
    ordering_key = metadata.ordering_key if metadata.HasField("ordering_key") else None
    routing = ordering_key is None and key is not None
    fields = ChunkFields(
        chunk_id,
        n,
        total,
        metadata.uuid,
        compression,
        metadata.uncompressed_size if compression != pb.NONE else 0,
        key,
        len(payload),
        routing_only=routing,
        sequence_id=metadata.sequence_id if chunk_id < n - 1 else None,
    )
    props[CHUNK_PROPERTY] = fields.encode()
    return Record(
        None,  # keyless until the service has seen the whole message (``ChunkAssembly``)
        payload,
        props,
        0,
        metadata.event_time or None,
        None,
        None,
        metadata.producer_name,
        metadata.sequence_id if fields.sequence_id is None else None,
        metadata.deliver_at_time if metadata.HasField("deliver_at_time") else None,
        key.encode() if routing and key is not None else ordering_key,
        metadata.schema_version if metadata.HasField("schema_version") else None,
    )


class ChunkAssembly:
    """One producer's chunked message in progress: the ids and sizes of the chunks it stored,
    in order, since its chunk 0 -- no payload: the last chunk reads them back from the log
    (:meth:`complete`), so a message whose last chunk never comes holds no memory beyond these
    numbers, and none once the producer sends another message or closes."""

    def __init__(self) -> None:
        self.uuid: str | None = None
        self.num_chunks = 0
        self.ids: list[Position] = []
        self.sizes: list[int] = []
        self.pending = 0  # chunks of it taken in but not yet stored (their ids come with the write)

    def take(self, fields: ChunkFields) -> bool:
        """Follow one chunk the producer sent; True when it is the last chunk of a message whose
        earlier chunks all came before it, in order."""
        if fields.chunk_id == 0:
            self.uuid, self.num_chunks = fields.uuid, fields.num_chunks
            self.ids, self.sizes, self.pending = [], [], 0
        elif not (
            fields.uuid == self.uuid
            and fields.num_chunks == self.num_chunks
            and fields.chunk_id == len(self.ids) + self.pending
        ):
            self.uuid = None  # out of order: this message stays chunks, for compaction too
            return False
        if fields.chunk_id < fields.num_chunks - 1:
            self.pending += 1
            self.sizes.append(fields.own)
            return False
        self.uuid = None
        return True

    def stored(self, at: Position) -> None:
        """The next pending chunk was written at ``at``."""
        if self.pending:
            self.pending -= 1
            self.ids.append(at)

    def complete(self, last: Record, fields: ChunkFields, read: Callable[[Position], Entry | None]) -> None:
        """Make ``last`` (the message's last chunk, its earlier chunks stored) the message's
        record for compaction: its key, the whole payload read back from the log, the earlier
        chunks' ids. Left a keyless chunk if any of them does not read back as expected."""
        ids, sizes = self.ids, self.sizes
        self.ids, self.sizes = [], []
        if len(ids) != fields.num_chunks - 1:
            return
        parts: list[bytes] = []
        for i, (at, size) in enumerate(zip(ids, sizes, strict=True)):
            e = read(at)
            f = fields_of(e.properties) if e is not None and e.position == at else None
            if e is None or f is None or f.uuid != fields.uuid or f.chunk_id != i or f.own != size:
                return
            parts.append(own_payload(e.value, f))
        own = last.value or b""
        parts.append(own)
        whole = b"".join(parts)
        if len(whole) != fields.total_size:
            return
        fields.earlier = [str(p) for p in ids]
        fields.sizes = sizes
        if fields.routing_only:
            last.ordering_key = None  # routed by its key now
            fields.routing_only = False
        last.key = fields.key
        last.value = whole
        last.properties[CHUNK_PROPERTY] = fields.encode()


def chunk_frame(e: Entry, metadata: Callable[[Entry], pb.MessageMetadata]) -> tuple[bytes, bytes] | None:
    """The metadata and payload of the MESSAGE a stored chunk is delivered as (None when
    ``e`` is no chunk the service stored): the chunk's own bytes, its chunk fields, its
    message's key and its producer's properties. ``metadata`` makes the rest of it."""
    fields = fields_of(e.properties)
    if fields is None:
        return None
    shown = e._replace(
        key=fields.key,
        properties=user_properties(e.properties),
        ordering_key=None if fields.routing_only else e.ordering_key,
        sequence_id=e.sequence_id if fields.sequence_id is None else fields.sequence_id,
    )
    md = metadata(shown)
    md.uuid = fields.uuid
    md.chunk_id = fields.chunk_id
    md.num_chunks_from_msg = fields.num_chunks
    md.total_chunk_msg_size = fields.total_size
    if fields.compression != pb.NONE:
        md.compression = fields.compression  # type: ignore[assignment]
        md.uncompressed_size = fields.uncompressed_size
    return md.SerializeToString(), own_payload(e.value, fields)
