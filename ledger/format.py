"""The byte layout of a write-ahead file (the file of one open ledger).

All integers are little-endian. A file is a header followed by zero or more frames::

    file header (HEADER_FORMAT, 16 bytes)
        8 bytes   magic            MAGIC = b"CLWAL\\x00\\x00\\x02" (the last byte is the version;
                                   version 1 files, which hold no batch frames, read the same)
        u64       ledger_id        the ledger this file belongs to

    frame (one per entry, or one per Pulsar batch; entry ids 0, 1, 2, ... in file order)
        u32       length           number of body bytes that follow the frame header; its top
                                   bit (BATCH_FRAME) marks a batch frame, whose body is laid
                                   out as "batch body" below
        u32       crc              crc32c(body)
        body      `length & ~BATCH_FRAME` bytes, laid out below

    body
        fixed part (BODY_HEADER_FORMAT, 37 bytes)
            u64   entry_id         the entry's id; recovery checks that ids are consecutive
            i64   publish_time     ms since the epoch
            u8    flags            FLAG_HAS_KEY | FLAG_HAS_VALUE | FLAG_HAS_EVENT_TIME
            i64   event_time       ms since the epoch; 0 when FLAG_HAS_EVENT_TIME is clear
            u32   key_length       0 when FLAG_HAS_KEY is clear
            u32   value_length     0 when FLAG_HAS_VALUE is clear
            u32   property_count
        key_length bytes           the key, UTF-8
        value_length bytes         the value (absent value = tombstone)
        property_count times:
            PROPERTY_HEADER_FORMAT u32 name_length, u32 value_length
            name_length bytes      property name, UTF-8
            value_length bytes     property value, UTF-8
        when FLAG_IN_BATCH is set (a member of a Pulsar batch, see ``ledger.entry.message_id``):
            BATCH_FORMAT u32 batch_index, u32 batch_size
        when FLAG_HAS_PRODUCER is set (sent by a Pulsar producer):
            PRODUCER_FORMAT u32 name_length, u64 sequence_id
            name_length bytes      the producer's name, UTF-8
        when FLAG_DELIVER_AT is set (Pulsar's delayed delivery):
            i64   deliver_at_time  ms since the epoch
        when FLAG_ORDERING_KEY is set (Pulsar's ordering key):
            u32   length, then that many bytes
        when FLAG_SCHEMA_VERSION is set (the version of the topic's schema it was written with):
            u32   length, then that many bytes

The flag byte has no bit left: a further field needs a new format version (MAGIC's last byte).

    batch body (a Pulsar batch as its producer sent it: entries first_entry_id ..
    first_entry_id + count - 1, see ``ledger.entry.StoredBatch``)
        fixed part (BATCH_HEADER_FORMAT, 50 bytes)
            u64   first_entry_id   recovery checks that ids are consecutive
            i64   publish_time     ms since the epoch, every member's
            u32   count            members (entries) the frame covers, at least 1
            u64   size             the members' payload bytes (``ledger.entry.record_size``)
            u8    compression      Pulsar's CompressionType of the payload
            u32   uncompressed_size
            u64   sequence_id      the batch's first sequence id
            u8    batch_flags      BATCH_DELIVER_AT | BATCH_ORDERING_KEY | BATCH_SCHEMA_VERSION
            i64   deliver_at_time  0 when BATCH_DELIVER_AT is clear
        u32 x 4                    lengths of the producer name, ordering key, schema version
                                   and metadata
        those four, in that order  (the metadata: Pulsar's MessageMetadata as sent)
        the rest                   the payload as sent (compressed as ``compression`` says)

Version 2 added batch frames: a version 1 reader would take one for a torn tail, so files that
may hold them carry version 2, which it refuses to open.

The flags tell an absent key (``None``) from an empty one (``""``), and a tombstone
(``value is None``) from an empty value (``b""``). A body must be consumed exactly: trailing
bytes, unknown flag bits or a length field that does not fit make it malformed.

Nothing in a frame points anywhere else, so a file can be scanned from the header alone;
the first frame that is short, absurdly long, fails its CRC, does not decode or carries the
wrong entry id marks the end of the good data (see :mod:`ledger.wal` for recovery).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import crc32c

from ledger.entry import Entry, Record, StoredBatch

MAGIC = b"CLWAL\x00\x00\x02"
assert len(MAGIC) == 8
# Files written before batch frames: read as ever, and appended to as files of today.
MAGIC_V1 = b"CLWAL\x00\x00\x01"

HEADER_FORMAT = "<8sQ"  # magic, ledger_id
HEADER_SIZE = 16
assert struct.calcsize(HEADER_FORMAT) == HEADER_SIZE

FRAME_HEADER_FORMAT = "<II"  # body length, crc32c(body)
FRAME_HEADER_SIZE = 8
assert struct.calcsize(FRAME_HEADER_FORMAT) == FRAME_HEADER_SIZE

BODY_HEADER_FORMAT = "<QqBqIII"  # entry_id, publish_time, flags, event_time, key_len, value_len, n_props
BODY_HEADER_SIZE = 37
assert struct.calcsize(BODY_HEADER_FORMAT) == BODY_HEADER_SIZE

PROPERTY_HEADER_FORMAT = "<II"  # name length, value length
PROPERTY_HEADER_SIZE = 8
assert struct.calcsize(PROPERTY_HEADER_FORMAT) == PROPERTY_HEADER_SIZE

BATCH_FORMAT = "<II"  # batch index, batch size
BATCH_SIZE = 8
assert struct.calcsize(BATCH_FORMAT) == BATCH_SIZE

BATCH_HEADER_FORMAT = "<QqIQBIQBq"  # see "batch body" above
BATCH_HEADER_SIZE = 50
assert struct.calcsize(BATCH_HEADER_FORMAT) == BATCH_HEADER_SIZE
# The top bit of a frame's length: the body is a batch body.
BATCH_FRAME = 0x8000_0000

PRODUCER_FORMAT = "<IQ"  # producer name length, sequence id
PRODUCER_SIZE = 12
assert struct.calcsize(PRODUCER_FORMAT) == PRODUCER_SIZE

_HEADER = struct.Struct(HEADER_FORMAT)
_FRAME_HEADER = struct.Struct(FRAME_HEADER_FORMAT)
_BODY_HEADER = struct.Struct(BODY_HEADER_FORMAT)
_PROPERTY_HEADER = struct.Struct(PROPERTY_HEADER_FORMAT)
_BATCH = struct.Struct(BATCH_FORMAT)
_PRODUCER = struct.Struct(PRODUCER_FORMAT)
_DELIVER_AT = struct.Struct("<q")
_LENGTH = struct.Struct("<I")
_ENTRY_ID = struct.Struct("<Q")  # the first field of a body
_BATCH_HEADER = struct.Struct(BATCH_HEADER_FORMAT)
_FOUR_LENGTHS = struct.Struct("<IIII")

BATCH_DELIVER_AT = 0x01
BATCH_ORDERING_KEY = 0x02
BATCH_SCHEMA_VERSION = 0x04
_KNOWN_BATCH_FLAGS = BATCH_DELIVER_AT | BATCH_ORDERING_KEY | BATCH_SCHEMA_VERSION

FLAG_HAS_KEY = 0x01
FLAG_HAS_VALUE = 0x02
FLAG_HAS_EVENT_TIME = 0x04
# Added with Pulsar's batches; files without it read as before (a file with it needs this version).
FLAG_IN_BATCH = 0x08
FLAG_HAS_PRODUCER = 0x10
FLAG_DELIVER_AT = 0x20
FLAG_ORDERING_KEY = 0x40
FLAG_SCHEMA_VERSION = 0x80
_KNOWN_FLAGS = (
    FLAG_HAS_KEY
    | FLAG_HAS_VALUE
    | FLAG_HAS_EVENT_TIME
    | FLAG_IN_BATCH
    | FLAG_HAS_PRODUCER
    | FLAG_DELIVER_AT
    | FLAG_ORDERING_KEY
    | FLAG_SCHEMA_VERSION
)

MIN_BODY_SIZE = BODY_HEADER_SIZE
# A length field above this is treated as garbage, not as a record to wait for: it keeps
# recovery from trusting a torn or zero-filled length, and bounds what one frame may allocate.
MAX_BODY_SIZE = 256 * 1024 * 1024

Buffer = bytes | bytearray | memoryview


class CorruptRecordError(Exception):
    """A write-ahead file holds bytes that are not what this format says.

    Carries the file and the byte offset where the bad data starts, so an operator can find it.
    """

    def __init__(self, path: Path | str, offset: int, reason: str) -> None:
        self.path = Path(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path}: offset {offset}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptRecordError], tuple[Path, int, str]]:
        return (type(self), (self.path, self.offset, self.reason))


class MalformedBodyError(ValueError):
    """A frame body that does not decode; the caller knows the file and offset to report."""


def encode_header(ledger_id: int) -> bytes:
    """The file header of ledger ``ledger_id``'s write-ahead file."""
    try:
        return _HEADER.pack(MAGIC, ledger_id)
    except struct.error as e:
        raise ValueError(f"ledger id out of range: {ledger_id}") from e


def decode_header(data: Buffer, path: Path | str) -> int:
    """Check a file header and return its ledger id.

    ``data`` must hold at least :data:`HEADER_SIZE` bytes; a shorter header is torn and is the
    caller's business. A wrong magic raises :class:`CorruptRecordError`: it is not a torn
    write, it is not our file (or not this version of it).
    """
    if len(data) < HEADER_SIZE:
        raise CorruptRecordError(path, 0, f"file header is {len(data)} bytes, expected {HEADER_SIZE}")
    magic, ledger_id = _HEADER.unpack_from(data, 0)
    if magic != MAGIC and magic != MAGIC_V1:
        raise CorruptRecordError(path, 0, f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    return int(ledger_id)


def encode_record(entry_id: int, record: Record) -> bytes:
    """The full frame (frame header and body) storing ``record`` as entry ``entry_id``.

    Raises ``ValueError`` for a record the format cannot hold (an integer out of range, a
    string that is not encodable as UTF-8, a body above :data:`MAX_BODY_SIZE`).
    """
    return bytes(encode_frames(entry_id, [encode_body(entry_id, record)]))


def encode_frames(
    first_entry_id: int, bodies: Sequence[Buffer], counts: Sequence[int] | None = None
) -> bytearray:
    """The frames of consecutive entries from ``first_entry_id`` on: body ``i`` is one entry
    (a record body), or ``counts[i]`` entries (a batch body, when ``counts`` is given and
    ``counts[i]`` is not 0).

    Each body's entry-id field is overwritten with its (first) entry's id, so a writer can
    encode the (costly) bodies before it knows the ids and only number and checksum them under
    its lock. Frame ``i`` is ``FRAME_HEADER_SIZE + len(bodies[i])`` bytes long.
    """
    _check_ids(first_entry_id, bodies, counts)
    buf = bytearray(sum(FRAME_HEADER_SIZE + len(b) for b in bodies))
    view = memoryview(buf)
    pos = 0
    entry_id = first_entry_id
    for i, body in enumerate(bodies):
        start = pos + FRAME_HEADER_SIZE
        end = start + len(body)
        view[start:end] = body
        _ENTRY_ID.pack_into(buf, start, entry_id)
        n = counts[i] if counts is not None else 0
        length = len(body) | BATCH_FRAME if n else len(body)
        _FRAME_HEADER.pack_into(buf, pos, length, crc32c.crc32c(view[start:end]))
        entry_id += n or 1
        pos = end
    return buf


def _check_ids(first_entry_id: int, bodies: Sequence[Buffer], counts: Sequence[int] | None) -> None:
    """``ValueError`` unless the entries of ``bodies`` from ``first_entry_id`` on have ids that fit."""
    total = sum(counts or ()) + (len(bodies) if counts is None else counts.count(0))
    if first_entry_id < 0 or first_entry_id + total > 2**64:
        raise ValueError(f"entry ids out of range: {first_entry_id} + {total}")


def frame_parts(
    first_entry_id: int, bodies: Sequence[bytes], counts: Sequence[int] | None = None
) -> tuple[list[Buffer], int]:
    """:func:`encode_frames`' bytes as the pieces of one gathered write (``os.pwritev``), and
    their total length: each frame's header, its entry id, and the rest of its body as a view,
    so that a body (a whole batch's payload) is not copied again into one buffer, zeroed first."""
    _check_ids(first_entry_id, bodies, counts)
    parts: list[Buffer] = []
    size = 0
    entry_id = first_entry_id
    id_size = _ENTRY_ID.size
    for i, body in enumerate(bodies):
        n = counts[i] if counts is not None else 0
        length = len(body) | BATCH_FRAME if n else len(body)
        head = _ENTRY_ID.pack(entry_id)
        rest = memoryview(body)[id_size:]
        parts += (_FRAME_HEADER.pack(length, crc32c.crc32c(rest, crc32c.crc32c(head))), head, rest)
        size += FRAME_HEADER_SIZE + len(body)
        entry_id += n or 1
    return parts, size


def encode_batch_body(entry_id: int, batch: StoredBatch) -> bytes:
    """The body of a batch frame (see "batch body" in the module docstring)."""
    flags = 0
    deliver_at = 0
    if batch.deliver_at_time is not None:
        flags |= BATCH_DELIVER_AT
        deliver_at = batch.deliver_at_time
    ordering = b""
    if batch.ordering_key is not None:
        flags |= BATCH_ORDERING_KEY
        ordering = bytes(batch.ordering_key)
    version = b""
    if batch.schema_version is not None:
        flags |= BATCH_SCHEMA_VERSION
        version = bytes(batch.schema_version)
    producer = batch.producer_name.encode("utf-8")
    if batch.count < 1:
        raise ValueError(f"a batch of {batch.count} messages")
    try:
        head = _BATCH_HEADER.pack(
            entry_id,
            batch.publish_time,
            batch.count,
            batch.size,
            batch.compression,
            batch.uncompressed_size,
            batch.sequence_id,
            flags,
            deliver_at,
        )
        lengths = _FOUR_LENGTHS.pack(len(producer), len(ordering), len(version), len(batch.metadata))
    except struct.error as e:
        raise ValueError(f"batch for entry {entry_id} does not fit the format: {e}") from e
    body = b"".join((head, lengths, producer, ordering, version, batch.metadata, batch.payload))
    if len(body) > MAX_BODY_SIZE:
        raise ValueError(f"batch for entry {entry_id} is {len(body)} bytes, above {MAX_BODY_SIZE}")
    return body


def decode_batch_body(body: Buffer) -> tuple[int, StoredBatch]:
    """``(first_entry_id, batch)`` of a batch frame's body; :class:`MalformedBodyError` if it
    does not decode exactly (its members are checked when they are decoded, not here: they
    were checked before the frame was written, and the frame's CRC covers them)."""
    view = memoryview(body)
    size = len(view)
    fixed = BATCH_HEADER_SIZE + _FOUR_LENGTHS.size
    if size < fixed:
        raise MalformedBodyError(f"batch body is {size} bytes, shorter than its fixed part ({fixed})")
    entry_id, publish_time, count, total, compression, uncompressed, sequence_id, flags, deliver_at = (
        _BATCH_HEADER.unpack_from(view, 0)
    )
    if flags & ~_KNOWN_BATCH_FLAGS:
        raise MalformedBodyError(f"unknown batch flag bits {flags:#04x}")
    if count < 1:
        raise MalformedBodyError(f"a batch of {count} messages")
    if not flags & BATCH_DELIVER_AT and deliver_at:
        raise MalformedBodyError("delivery time set on a batch without one")
    lengths = _FOUR_LENGTHS.unpack_from(view, BATCH_HEADER_SIZE)
    pos = fixed
    parts: list[bytes] = []
    for n in lengths:
        if n > size - pos:
            raise MalformedBodyError(f"a field of {n} bytes overruns the batch body at {pos}/{size}")
        parts.append(bytes(view[pos : pos + n]))
        pos += n
    producer, ordering, version, metadata = parts
    if not flags & BATCH_ORDERING_KEY and ordering:
        raise MalformedBodyError("ordering key set on a batch without one")
    if not flags & BATCH_SCHEMA_VERSION and version:
        raise MalformedBodyError("schema version set on a batch without one")
    try:
        producer_name = str(producer, "utf-8")
    except UnicodeDecodeError as e:
        raise MalformedBodyError(f"invalid UTF-8: {e}") from e
    return int(entry_id), StoredBatch(
        metadata=metadata,
        payload=bytes(view[pos:]),
        count=int(count),
        size=int(total),
        compression=int(compression),
        uncompressed_size=int(uncompressed),
        producer_name=producer_name,
        sequence_id=int(sequence_id),
        deliver_at_time=int(deliver_at) if flags & BATCH_DELIVER_AT else None,
        ordering_key=ordering if flags & BATCH_ORDERING_KEY else None,
        schema_version=version if flags & BATCH_SCHEMA_VERSION else None,
        publish_time=int(publish_time),
    )


def encode_body(entry_id: int, record: Record) -> bytes:
    """The body of one frame (see the module docstring)."""
    flags = 0
    key = b""
    if record.key is not None:
        flags |= FLAG_HAS_KEY
        key = record.key.encode("utf-8")
    value = b""
    if record.value is not None:
        flags |= FLAG_HAS_VALUE
        value = bytes(record.value)
    event_time = 0
    if record.event_time is not None:
        flags |= FLAG_HAS_EVENT_TIME
        event_time = record.event_time
    if record.batch_index is not None:
        flags |= FLAG_IN_BATCH
    if record.producer_name is not None:
        flags |= FLAG_HAS_PRODUCER
    if record.deliver_at_time is not None:
        flags |= FLAG_DELIVER_AT
    if record.ordering_key is not None:
        flags |= FLAG_ORDERING_KEY
    if record.schema_version is not None:
        flags |= FLAG_SCHEMA_VERSION
    parts: list[bytes] = []
    try:
        parts.append(
            _BODY_HEADER.pack(
                entry_id,
                record.publish_time,
                flags,
                event_time,
                len(key),
                len(value),
                len(record.properties),
            )
        )
        parts.append(key)
        parts.append(value)
        for name, text in record.properties.items():
            name_bytes = name.encode("utf-8")
            text_bytes = text.encode("utf-8")
            parts.append(_PROPERTY_HEADER.pack(len(name_bytes), len(text_bytes)))
            parts.append(name_bytes)
            parts.append(text_bytes)
        if flags & FLAG_IN_BATCH:
            parts.append(_BATCH.pack(record.batch_index, record.batch_size))
        if flags & FLAG_HAS_PRODUCER:
            producer = (record.producer_name or "").encode("utf-8")
            parts.append(_PRODUCER.pack(len(producer), record.sequence_id or 0))
            parts.append(producer)
        if flags & FLAG_DELIVER_AT:
            parts.append(_DELIVER_AT.pack(record.deliver_at_time))
        for extra in (record.ordering_key, record.schema_version):
            if extra is not None:
                parts.append(_LENGTH.pack(len(extra)))
                parts.append(bytes(extra))
    except struct.error as e:
        raise ValueError(f"record for entry {entry_id} does not fit the format: {e}") from e
    body = b"".join(parts)
    if len(body) > MAX_BODY_SIZE:
        raise ValueError(f"record for entry {entry_id} is {len(body)} bytes, above {MAX_BODY_SIZE}")
    return body


def decode_frame_header(data: Buffer, offset: int = 0) -> tuple[int, int]:
    """``(body_length, crc)`` of the frame header at ``offset`` in ``data``."""
    length, crc = _FRAME_HEADER.unpack_from(data, offset)
    return int(length), int(crc)


def body_length_is_sane(length: int) -> bool:
    """Whether a frame's length field (its batch bit cleared) could belong to a real frame."""
    return MIN_BODY_SIZE <= length <= MAX_BODY_SIZE


def body_crc(body: Buffer) -> int:
    """The checksum stored in a frame header for ``body``."""
    return int(crc32c.crc32c(body))


def decode_body(body: Buffer, ledger_id: int) -> Entry:
    """Decode one frame body into the :class:`Entry` it stores in ledger ``ledger_id``.

    The CRC is the caller's to check (it lives in the frame header). Raises
    :class:`MalformedBodyError` if the body does not decode exactly.
    """
    view = memoryview(body)
    size = len(view)
    if size < BODY_HEADER_SIZE:
        raise MalformedBodyError(f"body is {size} bytes, shorter than its fixed part ({BODY_HEADER_SIZE})")
    entry_id, publish_time, flags, event_time, key_len, value_len, n_props = _BODY_HEADER.unpack_from(view, 0)
    if flags & ~_KNOWN_FLAGS:
        raise MalformedBodyError(f"unknown flag bits {flags:#04x}")
    if not flags & FLAG_HAS_KEY and key_len:
        raise MalformedBodyError("key length set on a record without a key")
    if not flags & FLAG_HAS_VALUE and value_len:
        raise MalformedBodyError("value length set on a tombstone")
    if not flags & FLAG_HAS_EVENT_TIME and event_time:
        raise MalformedBodyError("event time set on a record without one")
    pos = BODY_HEADER_SIZE

    def take(n: int, what: str) -> memoryview:
        nonlocal pos
        if n > size - pos:
            raise MalformedBodyError(f"{what} of {n} bytes overruns the body at {pos}/{size}")
        chunk = view[pos : pos + n]
        pos += n
        return chunk

    try:
        key = str(take(key_len, "key"), "utf-8") if flags & FLAG_HAS_KEY else None
        value = bytes(take(value_len, "value")) if flags & FLAG_HAS_VALUE else None
        properties: dict[str, str] = {}
        for _ in range(n_props):
            name_len, text_len = _PROPERTY_HEADER.unpack_from(take(PROPERTY_HEADER_SIZE, "property header"))
            name = str(take(name_len, "property name"), "utf-8")
            properties[name] = str(take(text_len, "property value"), "utf-8")
        batch_index = batch_size = None
        if flags & FLAG_IN_BATCH:
            batch_index, batch_size = _BATCH.unpack_from(take(BATCH_SIZE, "batch index and size"))
            if batch_index >= batch_size:
                raise MalformedBodyError(f"batch index {batch_index} not below batch size {batch_size}")
        producer_name = sequence_id = None
        if flags & FLAG_HAS_PRODUCER:
            name_len, sequence_id = _PRODUCER.unpack_from(take(PRODUCER_SIZE, "producer header"))
            producer_name = str(take(name_len, "producer name"), "utf-8")
        deliver_at_time = None
        if flags & FLAG_DELIVER_AT:
            (deliver_at_time,) = _DELIVER_AT.unpack_from(take(_DELIVER_AT.size, "delivery time"))
        ordering_key = schema_version = None
        if flags & FLAG_ORDERING_KEY:
            (n,) = _LENGTH.unpack_from(take(_LENGTH.size, "ordering key length"))
            ordering_key = bytes(take(n, "ordering key"))
        if flags & FLAG_SCHEMA_VERSION:
            (n,) = _LENGTH.unpack_from(take(_LENGTH.size, "schema version length"))
            schema_version = bytes(take(n, "schema version"))
    except UnicodeDecodeError as e:
        raise MalformedBodyError(f"invalid UTF-8: {e}") from e
    if pos != size:
        raise MalformedBodyError(f"{size - pos} trailing bytes after the record")
    if len(properties) != n_props:
        raise MalformedBodyError("duplicate property names")
    return Entry(
        ledger_id=ledger_id,
        entry_id=int(entry_id),
        key=key,
        value=value,
        properties=properties,
        publish_time=int(publish_time),
        event_time=int(event_time) if flags & FLAG_HAS_EVENT_TIME else None,
        batch_index=batch_index,
        batch_size=batch_size,
        producer_name=producer_name,
        sequence_id=sequence_id,
        deliver_at_time=deliver_at_time,
        ordering_key=ordering_key,
        schema_version=schema_version,
    )
