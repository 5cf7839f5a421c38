"""Chunked messages through the official ``pulsar-client`` against a real ``compactor serve``.

The shared server announces a 64 KiB ``max_message_size`` (``COMPACTOR_MAX_MESSAGE_SIZE``), so a
message of about a megabyte from a producer with chunking on arrives as 16+ chunks: each is
stored as the entry it is, and every consumer and reader of the log receives them with their
chunk fields and puts the message back together."""

from __future__ import annotations

import base64
import os
import socket
import time
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode, encode_payload
from service.chunked import CHUNK_PROPERTY, ChunkFields
from tests.conftest import SHARED_MAX_MESSAGE_SIZE, Server
from tests.e2e.conftest import QUIET
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh, rest_messages
from tests.e2e.test_pulsar_deduplication import NO_ID, turn_on

pytestmark = [pytest.mark.e2e]

LIMIT = SHARED_MAX_MESSAGE_SIZE
BIG = 1024 * 1024  # 16+ chunks at the shared server's 64 KiB


def chunking(client: pulsar.Client, topic: str, **kwargs: object) -> pulsar.Producer:
    return client.create_producer(topic, chunking_enabled=True, batching_enabled=False, **kwargs)


def test_a_chunked_message_reaches_a_consumer_whole(client: pulsar.Client, shared_server: Server) -> None:
    topic = fresh("chunks")
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    value = os.urandom(BIG)
    producer = chunking(client, topic)
    sent = producer.send(value, partition_key="k", properties={"p": "v"})
    small = producer.send(b"after")
    msg = consumer.receive(10_000)
    assert msg.data() == value
    assert msg.partition_key() == "k"
    assert msg.properties() == {"p": "v"}  # the service's chunk property stays its own
    assert str(msg.message_id()) == str(sent)
    consumer.acknowledge(msg)
    after = consumer.receive(10_000)
    assert after.data() == b"after" and str(after.message_id()) == str(small)
    consumer.acknowledge(after)
    # Each chunk is its own entry of the log, as REST shows: chunks 0..n-2 keyless, the last
    # one the message's (its key, and the whole value: one message of its key for compaction).
    rows = rest_messages(shared_server, topic)
    chunks, last = rows[:-2], rows[-2]
    assert len(chunks) + 1 >= BIG // LIMIT
    assert {r["key"] for r in chunks} == {None} and last["key"] == "k"
    assert base64.b64decode(last["value"]) == value
    fields = [ChunkFields.decode(r["properties"][CHUNK_PROPERTY]) for r in [*chunks, last]]
    assert [f.chunk_id for f in fields] == list(range(len(chunks) + 1))  # type: ignore[union-attr]
    assert fields[-1].earlier == [r["messageId"] for r in chunks]  # type: ignore[union-attr]
    own = [base64.b64decode(r["value"]) for r in chunks] + [value[len(value) - fields[-1].own :]]  # type: ignore[union-attr]
    assert b"".join(own) == value
    assert {r["properties"]["p"] for r in [*chunks, last]} == {"v"}
    assert rows[-1]["value"] == base64.b64encode(b"after").decode()


def test_compressed_chunks_are_stored_as_sent_and_reassembled(client: pulsar.Client) -> None:
    topic = fresh("chunks-lz4")
    consumer = client.subscribe(topic, "s")
    # Compressible, yet over the limit once compressed: chunks of the compressed payload.
    value = os.urandom(BIG // 4) * 4
    chunking(client, topic, compression_type=pulsar.CompressionType.LZ4).send(value)
    assert consumer.receive(10_000).data() == value


def test_a_reader_and_seek_by_a_chunked_message_id(client: pulsar.Client) -> None:
    topic = fresh("chunks-reader")
    producer = chunking(client, topic)
    values = [os.urandom(BIG // 2 + i) for i in range(3)]
    ids = [producer.send(v) for v in values]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = [reader.read_next(10_000) for _ in values]
    assert [m.data() for m in got] == values
    assert [str(m.message_id()) for m in got] == [str(i) for i in ids]
    # A reader from a chunked message's id: from its first chunk when inclusive, else after it.
    inclusive = client.create_reader(topic, ids[1], start_message_id_inclusive=True)
    assert [inclusive.read_next(10_000).data() for _ in values[1:]] == values[1:]
    assert client.create_reader(topic, ids[1]).read_next(10_000).data() == values[2]
    # Seek by a chunked message's id (the client sends its first chunk's), and acks by it: the
    # message after it comes next, as after a seek to any message's id.
    consumer = client.subscribe(topic, "seek", initial_position=pulsar.InitialPosition.Earliest)
    for _ in values:
        consumer.acknowledge(consumer.receive(10_000))
    consumer.seek(ids[0])
    again = consumer.receive(10_000)
    assert again.data() == values[1] and str(again.message_id()) == str(ids[1])


def test_interleaved_chunked_messages_of_two_producers(client: pulsar.Client) -> None:
    topic = fresh("chunks-two")
    consumer = client.subscribe(topic, "s")
    a, b = chunking(client, topic), chunking(client, topic)
    values = {f"a{i}": os.urandom(200_000 + i) for i in range(3)}
    values |= {f"b{i}": os.urandom(300_000 + i) for i in range(3)}
    done: list[str] = []
    for i in range(3):  # asynchronous: the two producers' chunks interleave in the log
        a.send_async(values[f"a{i}"], lambda r, _m, k=f"a{i}": done.append(k), partition_key=f"a{i}")
        b.send_async(values[f"b{i}"], lambda r, _m, k=f"b{i}": done.append(k), partition_key=f"b{i}")
    a.flush()
    b.flush()
    got = {}
    for _ in values:
        m = consumer.receive(10_000)
        got[m.partition_key()] = m.data()
        consumer.acknowledge(m)
    assert got == values
    assert sorted(done) == sorted(values)


def test_the_python_clients_test_chunking(shared_server: Server) -> None:
    """pulsar-client-python's ``test_chunking``: 10 MB against the announced limit."""
    client = pulsar.Client(shared_server.pulsar_url, operation_timeout_seconds=30, logger=QUIET)
    try:
        data_size = 10 * 1024 * 1024
        producer = client.create_producer(fresh("test_chunking"), chunking_enabled=True)
        consumer = client.subscribe(
            producer.topic(),
            "my-subscription",
            max_pending_chunked_message=10,
            auto_ack_oldest_chunked_message_on_queue_full=False,
        )
        data = os.urandom(data_size)
        producer.send(data, None)
        msg = consumer.receive(30_000)
        assert len(msg.data()) == data_size and msg.data() == data
    finally:
        client.close()


@pytest.mark.spark
def test_ten_megabytes_against_the_default_limit(server_factory: type[Server], tmp_path: Path) -> None:
    """A 10 MB message at the default 5 MiB ``max_message_size``: three chunks, reassembled by a
    consumer, and kept whole by compaction for a reader of the compacted view."""
    server = server_factory(tmp_path / "data")
    server.start()
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=30, logger=QUIET)
    try:
        topic = fresh("ten-mb")
        consumer = client.subscribe(topic, "s")
        data = os.urandom(10 * 1024 * 1024)
        chunking(client, topic).send(data, partition_key="k")
        assert consumer.receive(30_000).data() == data
        assert len(rest_messages(server, topic)) == 3
        assert server.compact(topic) == "SUCCESS"
        assert _compacted(client, topic) == {"k": data}
    finally:
        client.close()


def test_deduplication_counts_a_chunked_message_once(shared_server: Server, client: pulsar.Client) -> None:
    # Chunks share their message's sequence id: only the last one counts, as in Pulsar.
    topic = fresh("chunks-dedup")
    turn_on(shared_server, topic)
    consumer = client.subscribe(topic, "s")
    producer = chunking(client, topic, producer_name="dedup")
    values = [os.urandom(BIG // 4 + i) for i in range(2)]
    ids = [producer.send(v) for v in values]
    assert [consumer.receive(10_000).data() for _ in values] == values
    producer.close()
    # The last message again from a producer of that name that reconnected: not stored again.
    with raw(shared_server) as s:
        connect(s)
        producing = command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)
        producing.producer.producer_name = "dedup"
        s.sendall(encode(producing))
        assert read_frame(s).producer_success.last_sequence_id == 1
        receipt = _send_chunk(s, 0, 2, 200, b"x" * 100, uuid="dedup-1", sequence_id=1)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT
        receipt = _send_chunk(s, 1, 2, 200, b"x" * 100, uuid="dedup-1", sequence_id=1)
        assert receipt.send_receipt.message_id.entryId == NO_ID  # a duplicate: -1:-1
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)  # its first chunk alone: the client drops it
    assert str(ids[-1])


def test_the_python_clients_test_invalid_chunking_config(client: pulsar.Client) -> None:
    """pulsar-client-python's ``test_invalid_chunking_config``: chunking with batching is the
    client's error, before anything reaches the service."""
    with pytest.raises(ValueError):
        client.create_producer(fresh("invalid"), chunking_enabled=True, batching_enabled=True)


@pytest.mark.parametrize("kind", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_shared_and_key_shared_consumers_each_get_whole_messages(
    client: pulsar.Client, kind: pulsar.ConsumerType
) -> None:
    # Shared: every chunk goes to the consumer that took the message's chunk 0 (Pulsar's
    # SharedConsumerAssignor); Key_Shared: every chunk routes by its message's key.
    topic = fresh("chunks-shared")
    consumers = [
        client.subscribe(topic, "sub", consumer_type=kind, consumer_name=f"c{i}", receiver_queue_size=2)
        for i in range(2)
    ]
    producer = chunking(client, topic)
    values = {f"key-{i}": os.urandom(150_000 + i) for i in range(8)}
    for key, value in values.items():
        producer.send(value, partition_key=key)
    got: dict[str, bytes] = {}
    owner: dict[str, int] = {}
    deadline = time.monotonic() + 20
    while len(got) < len(values) and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            try:
                m = c.receive(200)
            except pulsar.Timeout:
                continue
            got[m.partition_key()] = m.data()
            owner[m.partition_key()] = i
            c.acknowledge(m)
    assert got == values
    assert set(owner.values()) == {0, 1}  # both consumers had messages


# ------------------------------------------------------------------ compaction


def _compacted(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    out: dict[str, bytes] = {}
    while reader.has_message_available():
        m = reader.read_next(10_000)
        out[m.partition_key()] = m.data()
    reader.close()
    return out


@pytest.mark.spark
def test_compaction_keeps_the_latest_whole_chunked_message_of_each_key(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("chunks-compacted")
    producer = chunking(client, topic)
    big = {k: os.urandom(BIG // 4 + i) for i, k in enumerate("abc")}
    producer.send(b"a-small", partition_key="a")
    producer.send(big["a"], partition_key="a")  # a chunked value replaces a small one
    producer.send(big["b"], partition_key="b")
    producer.send(b"b-small", partition_key="b")  # a small value replaces a chunked one
    producer.send(big["c"], partition_key="c")
    producer.send(b"", partition_key="c")  # a delete removes a chunked value
    producer.send(b"d-small", partition_key="d")
    assert shared_server.compact(topic) == "SUCCESS"
    want = {"a": big["a"], "b": b"b-small", "d": b"d-small"}
    assert _compacted(client, topic) == want
    # A consumer of the compacted view gets the chunks and acknowledges the message by them.
    consumer = client.subscribe(
        topic, "compacted", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest
    )
    got = {}
    for _ in want:
        m = consumer.receive(10_000)
        got[m.partition_key()] = m.data()
        consumer.acknowledge(m)
    assert got == want
    _no_backlog(shared_server, topic, "compacted")
    # A second round merges with the first: a new chunked value of b, a kept by the last one.
    producer.send(big["b"], partition_key="b")
    assert shared_server.compact(topic) == "SUCCESS"
    assert _compacted(client, topic) == want | {"b": big["b"]}


@pytest.mark.spark
def test_an_incomplete_chunked_message_never_replaces_a_value(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("chunks-incomplete")
    client.create_producer(topic, batching_enabled=False).send(b"old", partition_key="k")
    with raw(shared_server) as s:
        _producer(s, topic)
        # Chunks 0 and 1 of 3 and never the last: each is stored and acknowledged.
        for i in range(2):
            assert _send_chunk(s, i, 3, 300, b"x" * 100, key="k").type == pb.BaseCommand.SEND_RECEIPT
        # Another message whose chunk 1 never came: its last chunk is no message either.
        for i in (0, 2):
            reply = _send_chunk(s, i, 3, 300, b"y" * 100, key="k", uuid="other", sequence_id=1)
            assert reply.type == pb.BaseCommand.SEND_RECEIPT
    assert shared_server.compact(topic) == "SUCCESS"
    assert _compacted(client, topic) == {"k": b"old"}
    # The log holds every chunk as it came, for readers of it (the client drops what it cannot
    # put together).
    assert len(rest_messages(shared_server, topic)) == 5


@pytest.mark.spark
def test_a_chunked_message_across_the_horizon_reaches_compacted_readers_whole(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("chunks-straddle")
    client.create_producer(topic, batching_enabled=False).send(b"old", partition_key="k")
    parts = [os.urandom(100) for _ in range(3)]
    with raw(shared_server) as s:
        _producer(s, topic)
        for i in range(2):
            assert _send_chunk(s, i, 3, 300, parts[i], key="k").type == pb.BaseCommand.SEND_RECEIPT
        assert shared_server.compact(topic) == "SUCCESS"  # its horizon falls inside the message
        assert _send_chunk(s, 2, 3, 300, parts[2], key="k").type == pb.BaseCommand.SEND_RECEIPT
    # The compacted ledger has the old value; the log after the horizon the message, whole.
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert [reader.read_next(10_000).data() for _ in range(2)] == [b"old", b"".join(parts)]
    assert not reader.has_message_available()
    assert shared_server.compact(topic) == "SUCCESS"
    assert _compacted(client, topic) == {"k": b"".join(parts)}


def _no_backlog(server: Server, topic: str, subscription: str) -> None:
    path = topic.removeprefix("persistent://")
    deadline = time.monotonic() + 10
    while True:
        stats = httpx.get(f"{server.url}/admin/v2/persistent/{path}/stats").json()
        backlog = stats["subscriptions"][subscription]["msgBacklog"]
        if backlog == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert backlog == 0


# ------------------------------------------------------------------ bad input


def _producer(s: socket.socket, topic: str) -> None:
    connect(s)
    s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
    assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS


def _send_chunk(
    s: socket.socket,
    chunk_id: int,
    num_chunks: int,
    total: int,
    payload: bytes,
    *,
    key: str | None = None,
    uuid: str = "raw-0",
    sequence_id: int = 0,
    **fields: object,
) -> pb.BaseCommand:
    md = pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1, **fields)  # type: ignore[arg-type]
    if uuid:
        md.uuid = uuid
    md.num_chunks_from_msg, md.chunk_id, md.total_chunk_msg_size = num_chunks, chunk_id, total
    if key is not None:
        md.partition_key = key
    send = command(pb.BaseCommand.SEND, producer_id=1, sequence_id=sequence_id, is_chunk=True)
    s.sendall(encode_payload(send, md.SerializeToString(), payload))
    while (reply := read_frame(s)).type == pb.BaseCommand.PING:  # a connection kept open a while
        s.sendall(encode(command(pb.BaseCommand.PONG)))
    return reply


@pytest.mark.parametrize(
    ("chunk_id", "num_chunks", "total", "payload", "uuid", "fields", "why"),
    [
        (3, 3, 300, b"x" * 100, "u", {}, "chunk 3 of a message of 3 chunks"),
        (0, 3, 50, b"x" * 100, "u", {}, "100 bytes of a message of 50 bytes"),
        (0, 3, 300, b"", "u", {}, "0 bytes"),
        (0, 3, 300, b"x" * 100, "", {}, "without a uuid"),
        (0, 2, 2**31 - 1, b"x" * 100, "u", {}, "the limit is"),
        (0, 3, 300, b"x" * 100, "u", {"num_messages_in_batch": 2}, "a batch cannot be a chunk"),
        (0, 3, 300, b"x" * 100, "u", {"null_value": True}, "null value"),
        (
            0,
            2,
            2 * SHARED_MAX_MESSAGE_SIZE + 2,
            b"x" * (SHARED_MAX_MESSAGE_SIZE + 1),
            "u",
            {},
            "the limit is",
        ),
    ],
    ids=[
        "id-past-n",
        "chunk-over-total",
        "empty",
        "no-uuid",
        "total-over-limit",
        "batch",
        "null",
        "chunk-over-limit",
    ],
)
def test_chunks_that_do_not_add_up_are_refused_and_store_nothing(
    shared_server: Server,
    chunk_id: int,
    num_chunks: int,
    total: int,
    payload: bytes,
    uuid: str,
    fields: dict[str, object],
    why: str,
) -> None:
    topic = fresh("chunks-bad")
    with raw(shared_server) as s:
        _producer(s, topic)
        reply = _send_chunk(s, chunk_id, num_chunks, total, payload, uuid=uuid, **fields)
        assert reply.type == pb.BaseCommand.SEND_ERROR, reply
        assert reply.send_error.error == pb.NotAllowedError and why in reply.send_error.message
        # The connection serves on: a good chunk after it is stored.
        assert _send_chunk(s, 0, 2, 150, b"z" * 100, sequence_id=1).type == pb.BaseCommand.SEND_RECEIPT
    assert [base64.b64decode(m["value"]) for m in rest_messages(shared_server, topic)] == [b"z" * 100]


def test_the_chunk_property_is_the_services_own(shared_server: Server) -> None:
    topic = fresh("chunks-reserved")
    with raw(shared_server) as s:
        _producer(s, topic)
        md = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
        md.properties.add(key=CHUNK_PROPERTY, value='{"id":0}')
        s.sendall(
            encode_payload(
                command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0), md.SerializeToString(), b"v"
            )
        )
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.SEND_ERROR and reply.send_error.error == pb.NotAllowedError
        reply = _send_chunk(s, 0, 2, 150, b"z" * 100, properties=[pb.KeyValue(key=CHUNK_PROPERTY, value="x")])
        assert reply.type == pb.BaseCommand.SEND_ERROR and reply.send_error.error == pb.NotAllowedError
    path = topic.removeprefix("persistent://")
    r = httpx.post(
        f"{shared_server.url}/topics/persistent/{path}",
        json={"messages": [{"key": "k", "value": "dg==", "properties": {CHUNK_PROPERTY: "{}"}}]},
    )
    assert r.status_code == 400 and CHUNK_PROPERTY in r.json()["reason"]
    assert rest_messages(shared_server, topic) == []
