"""Chunks of Pulsar's chunked messages as the log stores them, and the compacted view of them.

A producer with chunking on sends a message too large for ``max_message_size`` as chunks
(``api.pulsar.chunks``). Each chunk is one entry of the log, as in Pulsar, stored as a record
whose value is the chunk's payload as sent and whose chunk fields are kept in one property of
the service's own, :data:`CHUNK_PROPERTY` (a JSON object, :class:`ChunkFields`); consumers
receive those fields as the chunk fields of the message's metadata, never as a property, and
neither REST nor the binary protocol lets a producer set that property itself.

For compaction a chunked message is **one** message of its key, held by its **last** chunk's
entry: when the service stored the message's chunks 0..n-2 from the same producer before it, the
last chunk's record carries the message's key and the **whole** payload (the chunks joined:
that entry is stored twice over, the price of a compacted view that never depends on entries it
does not hold), plus the ids of the earlier chunks. Every other chunk is stored keyless and
without a sequence id, both kept in its fields, so phase one never takes it for its key's latest
message (a chunked message whose last chunk never came, or whose chunks the service did not see
in order, never replaces an older value) and deduplication never counts a message of which only
some chunks were stored. Readers of the compacted view get the kept message back as its chunks,
with their original ids (:func:`expand_compacted`), from the compacted ledger and from the log
after its horizon alike (a message may straddle it); chunks that are no whole message are left
out there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ledger.entry import Entry, LedgerItem, Position, Record, record_size

CHUNK_PROPERTY = "__pulsar.chunk"
T = TypeVar("T", Entry, LedgerItem)


@dataclass(slots=True)
class ChunkFields:
    """What a stored chunk's :data:`CHUNK_PROPERTY` holds."""

    chunk_id: int
    num_chunks: int
    total_size: int  # the whole (compressed) payload's bytes
    uuid: str
    compression: int = 0  # Pulsar's CompressionType of the whole payload
    uncompressed_size: int = 0
    key: str | None = None  # the message's key (the record of a chunk other than a whole last is keyless)
    own: int = 0  # the chunk's own payload: the last ``own`` bytes of the record's value
    # On a whole last chunk: the ids of chunks 0..n-2, "L:E", and their sizes (empty on any
    # other chunk).
    earlier: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    # Whether the record's ordering key was set only so that Key_Shared routes the chunk with its message.
    routing_only: bool = False
    # A chunk before the last: its message's sequence id (its record has none, so that neither
    # deduplication nor its state rebuilt from the ledgers counts a message not stored whole).
    sequence_id: int | None = None

    @property
    def whole(self) -> bool:
        return bool(self.earlier)

    def encode(self) -> str:
        d: dict[str, object] = {
            "id": self.chunk_id,
            "n": self.num_chunks,
            "size": self.total_size,
            "uuid": self.uuid,
            "own": self.own,
        }
        if self.compression:
            d["c"], d["u"] = self.compression, self.uncompressed_size
        if self.key is not None:
            d["key"] = self.key
        if self.earlier:
            d["earlier"], d["sizes"] = self.earlier, self.sizes
        if self.routing_only:
            d["ro"] = True
        if self.sequence_id is not None:
            d["seq"] = self.sequence_id
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> ChunkFields | None:
        """The fields of a property value the service wrote; None for anything else."""
        try:
            d = json.loads(text)
            f = cls(
                int(d["id"]),
                int(d["n"]),
                int(d["size"]),
                str(d["uuid"]),
                int(d.get("c", 0)),
                int(d.get("u", 0)),
                None if d.get("key") is None else str(d["key"]),
                int(d["own"]),
                [str(x) for x in d.get("earlier", [])],
                [int(x) for x in d.get("sizes", [])],
                bool(d.get("ro", False)),
                None if d.get("seq") is None else int(d["seq"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if not (0 <= f.chunk_id < f.num_chunks and f.own >= 0 and f.uuid):
            return None
        if f.earlier and not (len(f.earlier) == len(f.sizes) == f.num_chunks - 1 and min(f.sizes) >= 0):
            return None
        return f


def fields_of(properties: dict[str, str]) -> ChunkFields | None:
    """A stored chunk's fields, None when ``properties`` are not a chunk's."""
    text = properties.get(CHUNK_PROPERTY) if properties else None
    return None if text is None else ChunkFields.decode(text)


def user_properties(properties: dict[str, str]) -> dict[str, str]:
    """A chunk's properties as its producer set them."""
    return {k: v for k, v in properties.items() if k != CHUNK_PROPERTY}


def own_payload(value: bytes | None, fields: ChunkFields) -> bytes:
    """The bytes of the chunk itself (a whole last chunk's record holds every chunk's)."""
    if value is None:
        return b""
    return value[len(value) - fields.own :] if fields.whole else value


def limit_size(r: Record) -> int:
    """A record's size as the message size limit counts it: a stored chunk counts its own
    payload, key and the producer's properties (its fields and a whole last chunk's earlier
    chunks were each checked as they arrived)."""
    fields = fields_of(r.properties)
    if fields is None:
        return record_size(r.key, r.value, r.properties)
    return record_size(fields.key, own_payload(r.value, fields), user_properties(r.properties))


def expand_compacted(items: Sequence[T]) -> list[T]:
    """What a reader of the compacted view receives of ``items``, read from a compacted ledger
    or from the log after its horizon: a chunked message's whole last chunk becomes its chunks
    again (each with its original id, the earlier ones keyless as stored), and chunks that are
    no whole message are left out (a chunk alone is not a message of its key; in the log they
    may be the first chunks of a message that straddles the horizon, which its last chunk
    brings whole). Items that are no chunks pass as read, stored batches too."""
    if not any(type(e) is Entry and e.properties and CHUNK_PROPERTY in e.properties for e in items):
        return list(items)
    out: list[T] = []
    for e in items:
        fields = fields_of(e.properties) if type(e) is Entry and e.batch_index is None else None
        if fields is None:
            out.append(e)
            continue
        if not fields.whole:
            continue  # a chunk without its message
        out.extend(_earlier_chunks(e, fields))  # type: ignore[arg-type]
        out.append(e)
    return out


def _earlier_chunks(last: Entry, fields: ChunkFields) -> list[Entry]:
    """Chunks 0..n-2 of a whole last chunk, as the log stored them: keyless, routed by the
    message's key (``routing_only``) unless it has an ordering key of its own."""
    value = last.value or b""
    props = user_properties(last.properties)
    routing = last.ordering_key is None and fields.key is not None
    ordering_key = fields.key.encode() if routing and fields.key is not None else last.ordering_key
    out: list[Entry] = []
    start = 0
    for i, (at, size) in enumerate(zip(fields.earlier, fields.sizes, strict=True)):
        chunk = ChunkFields(
            i,
            fields.num_chunks,
            fields.total_size,
            fields.uuid,
            fields.compression,
            fields.uncompressed_size,
            fields.key,
            size,
            routing_only=routing,
            sequence_id=last.sequence_id,
        )
        pos = Position.parse(at)
        out.append(
            last._replace(
                ledger_id=pos.ledger_id,
                entry_id=pos.entry_id,
                key=None,
                value=value[start : start + size],
                properties={**props, CHUNK_PROPERTY: chunk.encode()},
                ordering_key=ordering_key,
                sequence_id=None,
            )
        )
        start += size
    return out


class ChunkAssignor:
    """Pulsar's ``SharedConsumerAssignor`` for a Shared subscription: every chunk of a chunked
    message goes to the consumer that took its chunk 0, so that one client has all of them.

    A chunk whose chunk 0 no consumer holds (an orphan: its chunk 0 was acknowledged, or it never
    came) goes to whichever consumer asks, as Pulsar dispatches it (the client drops it). Holds
    the chunks' uuids of positions pending or waiting for redelivery, and which consumer each
    unfinished message's chunks go to; a consumer that leaves releases its messages."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}  # uuid -> the consumer its chunks go to
        self.chunks: dict[tuple[int, int], tuple[str, bool, bool]] = {}  # pos -> (uuid, first, last)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def note(self, pos: tuple[int, int], e: Entry) -> bool:
        """Whether ``e`` (at ``pos``) is a chunk: then remembered."""
        fields = fields_of(e.properties)
        if fields is None:
            return False
        self.chunks[pos] = (fields.uuid, fields.chunk_id == 0, fields.chunk_id == fields.num_chunks - 1)
        return True

    def free(self, pos: tuple[int, int], consumer_id: str) -> bool:
        """Whether ``consumer_id`` may take the message at ``pos``."""
        chunk = self.chunks.get(pos)
        if chunk is None:
            return True
        owner = self.owner.get(chunk[0])
        return owner is None or owner == consumer_id

    def take(self, pos: tuple[int, int], consumer_id: str) -> None:
        """``consumer_id`` takes the message at ``pos`` (``free`` said it may)."""
        chunk = self.chunks.get(pos)
        if chunk is None:
            return
        uuid, first, last = chunk
        if last:
            self.owner.pop(uuid, None)
        elif first:
            self.owner[uuid] = consumer_id

    def forget(self, pos: tuple[int, int]) -> None:
        """The message at ``pos`` is acknowledged."""
        self.chunks.pop(pos, None)

    def remove_consumer(self, consumer_id: str) -> None:
        for uuid in [u for u, c in self.owner.items() if c == consumer_id]:
            del self.owner[uuid]

    def clear(self) -> None:
        self.owner.clear()
        self.chunks.clear()
