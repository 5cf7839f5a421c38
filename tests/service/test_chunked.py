"""The stored form of Pulsar's chunked messages (``service.chunked``) and how a producer's chunks
become one message of their key (``api.pulsar.chunks``), without a server."""

from __future__ import annotations

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.chunks import ChunkAssembly, chunk_frame, chunk_record
from api.pulsar.messages import message_metadata
from ledger.entry import Entry, Position, Record
from service.chunked import (
    CHUNK_PROPERTY,
    ChunkAssignor,
    ChunkFields,
    expand_compacted,
    fields_of,
    limit_size,
)

LIMIT = 1100  # chunks of 1,000 bytes, their key and a property


def _metadata(
    chunk_id: int, n: int, total: int, *, uuid: str = "p-0", key: str | None = "k"
) -> pb.MessageMetadata:
    md = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1, uuid=uuid)
    md.num_chunks_from_msg, md.chunk_id, md.total_chunk_msg_size = n, chunk_id, total
    if key is not None:
        md.partition_key = key
    md.properties.add(key="app", value="x")
    return md


def _entry(r: Record, at: Position) -> Entry:
    return Entry(
        at.ledger_id,
        at.entry_id,
        r.key,
        r.value,
        r.properties,
        5,
        r.event_time,
        None,
        None,
        r.producer_name,
        r.sequence_id,
        r.deliver_at_time,
        r.ordering_key,
        r.schema_version,
    )


def _sent(payload: bytes, chunk: int) -> tuple[list[Record], list[Position], dict[Position, Entry]]:
    """``payload`` sent in chunks of ``chunk`` bytes through one producer's assembly, stored at
    entries 10, 12, 14, ... (interleaved with another producer's)."""
    parts = [payload[i : i + chunk] for i in range(0, len(payload), chunk)]
    assembly = ChunkAssembly()
    log: dict[Position, Entry] = {}
    records, ids = [], []
    for i, part in enumerate(parts):
        r = chunk_record(_metadata(i, len(parts), len(payload)), part, LIMIT, 10 * LIMIT)
        fields = fields_of(r.properties)
        assert fields is not None
        if assembly.take(fields):
            assembly.complete(r, fields, log.get)
        at = Position(3, 10 + 2 * i)
        assembly.stored(at)
        log[at] = _entry(r, at)
        records.append(r)
        ids.append(at)
    return records, ids, log


def test_the_last_chunk_becomes_the_message_and_the_others_stay_keyless() -> None:
    payload = bytes(range(256)) * 9  # 2,304 bytes: chunks of 1,000, 1,000 and 304
    records, ids, _ = _sent(payload, 1000)
    *earlier, last = records
    assert [r.key for r in earlier] == [None, None] and last.key == "k"
    assert last.value == payload
    # Chunks before it route as their message does (Key_Shared), and say nothing of it to a consumer.
    assert {r.ordering_key for r in earlier} == {b"k"} and last.ordering_key is None
    # Only the last chunk counts for deduplication (rebuilt from the ledgers' sequence ids too).
    assert [r.sequence_id for r in records] == [None, None, 7]
    fields = fields_of(last.properties)
    assert (
        fields is not None and fields.earlier == [str(p) for p in ids[:-1]] and fields.sizes == [1000, 1000]
    )
    # The size limit counts each chunk's own bytes: the whole last one passes as its chunk does.
    assert all(limit_size(r) <= LIMIT for r in records)
    assert limit_size(Record("k", b"v" * (LIMIT + 1))) > LIMIT


def test_a_consumer_receives_each_chunk_with_its_fields_and_own_bytes() -> None:
    payload = b"abcdefghij" * 250
    records, ids, log = _sent(payload, 1000)
    frames = [chunk_frame(log[at], message_metadata) for at in ids]
    got = b""
    for i, framed in enumerate(frames):
        assert framed is not None
        raw, body = framed
        md = pb.MessageMetadata.FromString(raw)
        assert (md.uuid, md.chunk_id, md.num_chunks_from_msg, md.total_chunk_msg_size) == ("p-0", i, 3, 2500)
        assert md.sequence_id == 7
        assert md.partition_key == "k" and not md.HasField("ordering_key")
        assert [(kv.key, kv.value) for kv in md.properties] == [("app", "x")]
        got += body
    assert got == payload
    # A message that is no chunk is not framed as one.
    assert chunk_frame(_entry(Record("k", b"v", {"app": "x"}), Position(1, 1)), message_metadata) is None


def test_chunks_out_of_order_or_missing_never_make_a_message() -> None:
    assembly = ChunkAssembly()
    log: dict[Position, Entry] = {}
    # Chunk 1 missing: the last chunk stays a keyless chunk.
    for i in (0, 2):
        r = chunk_record(_metadata(i, 3, 300), b"x" * 100, LIMIT, 10 * LIMIT)
        fields = fields_of(r.properties)
        assert fields is not None
        if assembly.take(fields):
            assembly.complete(r, fields, log.get)
        assembly.stored(Position(1, i))
        log[Position(1, i)] = _entry(r, Position(1, i))
        assert r.key is None
    # Chunks that read back as something else (not in the log): no message either.
    first = chunk_record(_metadata(0, 2, 200, uuid="q"), b"y" * 100, LIMIT, 10 * LIMIT)
    last = chunk_record(_metadata(1, 2, 200, uuid="q"), b"y" * 100, LIMIT, 10 * LIMIT)
    for r in (first, last):
        fields = fields_of(r.properties)
        assert fields is not None
        if assembly.take(fields):
            assembly.complete(r, fields, {}.get)
        assembly.stored(Position(2, 0))
    assert last.key is None and last.value == b"y" * 100


def test_the_compacted_view_gives_a_whole_chunked_message_back_as_its_chunks() -> None:
    payload = bytes(range(200)) * 12
    records, ids, log = _sent(payload, 1000)
    last = log[ids[-1]]
    plain = _entry(Record("a", b"1"), Position(4, 0))
    stray = log[ids[0]]  # a keyless chunk a retainNullKey round kept
    out = expand_compacted([stray, last, plain])
    assert [e.position for e in out] == [*ids, plain.position]
    assert [e.properties for e in out[:-1]] == [log[at].properties for at in ids]
    assert [(e.key, e.value, e.ordering_key) for e in out[:-2]] == [
        (log[at].key, log[at].value, log[at].ordering_key) for at in ids[:-1]
    ]
    assert out[-1] == plain
    # Pages without chunks pass as they are.
    assert expand_compacted([plain]) == [plain]


def test_chunk_fields_that_are_not_the_services_are_not_a_chunk() -> None:
    good = ChunkFields(0, 2, 10, "u", own=5)
    assert ChunkFields.decode(good.encode()) == good
    for text in ["", "{", "[]", '{"id":0}', '{"id":2,"n":2,"size":9,"uuid":"u","own":1}', '{"id":"x"}']:
        assert ChunkFields.decode(text) is None
    assert fields_of({CHUNK_PROPERTY: "nonsense"}) is None and fields_of({}) is None


def test_a_shared_subscription_keeps_a_message_s_chunks_on_one_consumer() -> None:
    a = ChunkAssignor()
    chunks = [_entry(r, Position(1, i)) for i, r in enumerate(_sent(b"z" * 2500, 1000)[0])]
    assert a.note((1, 0), chunks[0]) and not a.note((1, 9), _entry(Record("k", b"v"), Position(1, 9)))
    assert a.free((1, 0), "c1")
    a.take((1, 0), "c1")
    a.note((1, 1), chunks[1])
    a.note((1, 2), chunks[2])
    assert not a.free((1, 1), "c2") and a.free((1, 1), "c1") and a.free((1, 9), "c2")
    a.take((1, 1), "c1")
    a.take((1, 2), "c1")  # the last chunk: the message is done
    assert a.free((1, 2), "c2")
    # A consumer that leaves gives its unfinished message back to whoever takes its chunk 0.
    a.take((1, 0), "c1")
    a.remove_consumer("c1")
    assert a.free((1, 1), "c2")
    for pos in [(1, 0), (1, 1), (1, 2)]:
        a.forget(pos)
    assert not a
