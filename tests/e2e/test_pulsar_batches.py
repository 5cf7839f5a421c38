"""Pulsar's batches through the official ``pulsar-client`` against a real ``compactor serve``:
every member of a batch is a message of the topic, with the id ``(ledger, entry, index)`` that
the producer's receipt gave it, whichever way it is read."""

from __future__ import annotations

import base64
import contextlib
import socket
import struct
import time

import httpx
import pulsar
import pyarrow as pa
import pytest

from api.client import Client
from api.client import MessageId as ClientMessageId
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import Frame, command, encode, encode_payload, parse_frame
from ledger import format as fmt
from tests.conftest import Server, local_wal_only
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh, read_available, receive_all, rest_messages

pytestmark = [pytest.mark.e2e]

CODECS = {
    "none": pulsar.CompressionType.NONE,
    "lz4": pulsar.CompressionType.LZ4,
    "zlib": pulsar.CompressionType.ZLib,
    "zstd": pulsar.CompressionType.ZSTD,
    "snappy": pulsar.CompressionType.SNAPPY,
}


def batched(client: pulsar.Client, topic: str, codec: str = "none", size: int = 10) -> pulsar.Producer:
    return client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=size,
        batching_max_publish_delay_ms=50,
        compression_type=CODECS[codec],
    )


def send_all(producer: pulsar.Producer, messages: list[tuple[str | None, bytes]]) -> list[pulsar.MessageId]:
    """Send asynchronously (so that the client batches them) and wait for every receipt."""
    ids: list[pulsar.MessageId | None] = [None] * len(messages)

    def done(i: int) -> object:
        def callback(result: pulsar.Result, mid: pulsar.MessageId) -> None:
            assert result == pulsar.Result.Ok, result
            ids[i] = mid

        return callback

    for i, (key, value) in enumerate(messages):
        kwargs = {"partition_key": key} if key is not None else {}
        producer.send_async(value, done(i), properties={"i": str(i)}, **kwargs)
    producer.flush()
    deadline = time.monotonic() + 15
    while any(m is None for m in ids):
        assert time.monotonic() < deadline, "receipts missing"
        time.sleep(0.01)
    return [m for m in ids if m is not None]


def text(mid: pulsar.MessageId) -> str:
    """A wire id as the service writes it: ``"L:E:i"`` for a batch member, ``"L:E"`` otherwise."""
    batch = f":{mid.batch_index()}" if mid.batch_index() >= 0 else ""
    return f"{mid.ledger_id()}:{mid.entry_id()}{batch}"


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_batched_producer_with_each_codec_and_a_consumer_agree_on_every_id(
    client: pulsar.Client, shared_server: Server, codec: str
) -> None:
    topic = fresh(f"batch-{codec}")
    messages = [(f"k{i % 4}", f"value-{i}-".encode() * (i % 5 + 1)) for i in range(25)]
    producer = batched(client, topic, codec)
    sent = send_all(producer, messages)
    # Batches of up to 10: members share an entry and count up their index.
    assert max(m.batch_index() for m in sent) > 0
    assert len({(m.ledger_id(), m.entry_id()) for m in sent}) < len(sent)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = receive_all(consumer, len(messages))
    assert [m.message_id() for m in got] == sent
    assert [(m.partition_key(), m.data()) for m in got] == messages
    assert [m.properties() for m in got] == [{"i": str(i)} for i in range(len(messages))]
    assert {m.producer_name() for m in got} == {producer.producer_name()}
    # REST and api.client name each member as the Pulsar client does; the id parses back to it.
    names = [text(m) for m in sent]
    assert [m["messageId"] for m in rest_messages(shared_server, topic)] == names
    with Client(shared_server.url) as rest:
        reader = rest.create_reader(topic.removeprefix("persistent://"), ClientMessageId.earliest)
        read = [reader.read_next(5000) for _ in sent]
        assert [str(m.message_id()) for m in read] == names
        assert [ClientMessageId.parse(n) for n in names] == [m.message_id() for m in read]
        again = rest.create_reader(
            topic.removeprefix("persistent://"), names[7], start_message_id_inclusive=True
        )
        assert again.read_next(5000).value() == messages[7][1]


def test_acknowledged_batches_are_not_delivered_again(client: pulsar.Client) -> None:
    topic = fresh("batch-ack")
    sent = send_all(batched(client, topic), [(None, f"m{i}".encode()) for i in range(30)])
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = receive_all(consumer, 20)
    for m in got:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, "s")
    rest = receive_all(again, 10)
    assert [m.message_id() for m in rest] == sent[20:]
    with pytest.raises(pulsar.Timeout):
        again.receive(500)


def test_batch_index_acks_redeliver_only_the_unacknowledged_members(client: pulsar.Client) -> None:
    topic = fresh("batch-index-ack")
    sent = send_all(batched(client, topic), [(None, f"m{i}".encode()) for i in range(10)])
    assert {(m.ledger_id(), m.entry_id()) for m in sent} == {(sent[0].ledger_id(), sent[0].entry_id())}
    consumer = client.subscribe(
        topic,
        "s",
        initial_position=pulsar.InitialPosition.Earliest,
        consumer_type=pulsar.ConsumerType.Shared,
        batch_index_ack_enabled=True,
    )
    got = receive_all(consumer, 10)
    for m in got[::2]:  # every other member of the one batch
        consumer.acknowledge(m)
    time.sleep(0.5)  # the client groups acks for 100 ms
    consumer.close()
    again = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True
    )
    rest = receive_all(again, 5)
    assert [m.message_id() for m in rest] == sent[1::2]
    with pytest.raises(pulsar.Timeout):
        again.receive(500)


def test_read_compacted_gets_the_retained_members_with_their_ids(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("batch-compacted")
    messages: list[tuple[str | None, bytes]] = []
    for i in range(40):
        # Empty values delete their key (Pulsar's rule); k0 ends deleted.
        messages.append((f"k{i % 6}", b"" if i in (13, 36) else f"v{i}".encode()))
    sent = send_all(batched(client, topic, "lz4", size=7), messages)
    latest: dict[str, tuple[pulsar.MessageId, bytes]] = {}
    for (key, value), mid in zip(messages, sent, strict=True):
        assert key is not None
        if value:
            latest[key] = (mid, value)
        else:
            latest.pop(key, None)
    assert shared_server.compact(topic) == "SUCCESS"
    consumer = client.subscribe(
        topic, "compacted", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest
    )
    got = receive_all(consumer, len(latest))
    assert {m.partition_key(): (m.message_id(), m.data()) for m in got} == latest
    with pytest.raises(pulsar.Timeout):
        consumer.receive(500)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert read_available(reader) == [v for _, v in sorted(latest.values())]
    # A TableView sees the latest value of every key.
    view = client.create_table_view(topic)
    try:
        deadline = time.monotonic() + 10
        while len(view) < len(latest) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {k: view.get(k) for k in latest} == {k: v for k, (_, v) in latest.items()}
    finally:
        view.close()


def test_a_reader_seeks_to_a_batch_member(client: pulsar.Client) -> None:
    topic = fresh("batch-seek")
    sent = send_all(batched(client, topic), [(None, f"m{i}".encode()) for i in range(10)])
    reader = client.create_reader(topic, sent[4], start_message_id_inclusive=True)
    assert [reader.read_next(5000).message_id() for _ in range(6)] == sent[4:]
    assert not reader.has_message_available()


@pytest.mark.parametrize("queue", [1, 100])
def test_batches_larger_than_the_receiver_queue_are_delivered_and_acknowledged_whole(
    client: pulsar.Client, shared_server: Server, queue: int
) -> None:
    # The client acknowledges a batch only once it has had every member, so the broker never
    # splits one over two deliveries, whatever the permits.
    topic = fresh("batch-queue")
    sent = send_all(batched(client, topic, size=250), [(None, f"m{i}".encode()) for i in range(1_000)])
    consumer = client.subscribe(
        topic, "s", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=queue
    )
    got = receive_all(consumer, 1_000)
    assert [m.message_id() for m in got] == sent
    for m in got:
        consumer.acknowledge(m)
    path = topic.removeprefix("persistent://")
    deadline = time.monotonic() + 10
    while (
        backlog := httpx.get(f"{shared_server.url}/admin/v2/persistent/{path}/stats").json()["subscriptions"][
            "s"
        ]["msgBacklog"]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backlog == 0


def test_a_batch_with_a_member_marked_compacted_out_is_refused_and_stores_nothing(
    shared_server: Server, client: pulsar.Client
) -> None:
    # Member i is stored at the batch's entry + i, so a producer's batch must have every member.
    topic = fresh("batch-holes")
    client.create_producer(topic).close()  # the topic exists, empty
    with raw(shared_server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
        assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS
        payload = b""
        for i, value in enumerate([b"kept", b""]):
            single = pb.SingleMessageMetadata(
                payload_size=len(value), compacted_out=i == 1
            ).SerializeToString()
            payload += struct.pack(">I", len(single)) + single + value
        md = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
        md.num_messages_in_batch = 2
        send = command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0, num_messages=2)
        s.sendall(encode_payload(send, md.SerializeToString(), payload))
        reply = read_frame(s)
        assert reply.type == pb.BaseCommand.SEND_ERROR and "compacted out" in reply.send_error.message
    assert rest_messages(shared_server, topic) == []


def _frame(s: socket.socket) -> Frame:
    """The next frame from the server, payload frames included."""
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    (total,) = struct.unpack(">I", head)
    body = b""
    while len(body) < total:
        body += s.recv(total - len(body))
    return parse_frame(memoryview(body))


def test_a_consumer_following_the_topic_receives_each_batch_as_its_producer_sent_it(
    shared_server: Server, client: pulsar.Client
) -> None:
    """A batch is stored whole and delivered as sent: the consumer gets the producer's own
    compressed payload, with the broker's publish time and the receipt's id."""
    topic = fresh("stored-bytes")
    client.create_producer(topic).close()
    members = [(f"k{i}", f"value-{i}".encode() * 8) for i in range(20)]
    batch_body = b""
    for key, value in members:
        single = pb.SingleMessageMetadata(payload_size=len(value), partition_key=key).SerializeToString()
        batch_body += struct.pack(">I", len(single)) + single + value
    payload = pa.compress(batch_body, codec="zstd", asbytes=True)
    md = pb.MessageMetadata(
        producer_name="raw", sequence_id=0, publish_time=1, num_messages_in_batch=len(members)
    )
    md.compression, md.uncompressed_size = pb.ZSTD, len(batch_body)
    with raw(shared_server) as s:
        connect(s)
        s.sendall(
            encode(
                command(
                    pb.BaseCommand.SUBSCRIBE,
                    topic=topic,
                    subscription="sub",
                    subType=0,
                    consumer_id=7,
                    request_id=1,
                )
            )
        )
        assert read_frame(s).type == pb.BaseCommand.SUCCESS
        s.sendall(encode(command(pb.BaseCommand.FLOW, consumer_id=7, messagePermits=1000)))
        s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=2)))
        assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS
        send = command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0, num_messages=len(members))
        before = int(time.time() * 1000)
        s.sendall(encode_payload(send, md.SerializeToString(), payload))
        frames = [_frame(s), _frame(s)]
    receipt = next(f.command for f in frames if f.command.type == pb.BaseCommand.SEND_RECEIPT)
    message = next(f for f in frames if f.command.type == pb.BaseCommand.MESSAGE)
    assert message.payload == payload  # the producer's bytes, not rebuilt
    assert message.metadata is not None
    assert message.metadata.compression == pb.ZSTD
    assert message.metadata.num_messages_in_batch == len(members)
    assert message.metadata.publish_time >= before  # the broker's clock, as every other path
    got = message.command.message.message_id
    assert (got.ledgerId, got.entryId) == (
        receipt.send_receipt.message_id.ledgerId,
        receipt.send_receipt.message_id.entryId,
    )
    assert not message.command.message.ack_set
    stored = rest_messages(shared_server, topic)
    assert [(m["key"], base64.b64decode(m["value"])) for m in stored] == members
    assert {m["publishTime"] for m in stored} == {message.metadata.publish_time}


def test_a_batch_that_does_not_decode_gets_a_send_error_and_the_next_one_is_stored(
    shared_server: Server, client: pulsar.Client
) -> None:
    """Members are checked off the event loop, in bulk: a bad batch in a group of sends fails
    alone, and the producer goes on."""
    topic = fresh("bad-batch")
    client.create_producer(topic).close()

    def batch_frame(seq: int, raw: bytes, n: int) -> bytes:
        md = pb.MessageMetadata(producer_name="raw", sequence_id=seq, publish_time=1, num_messages_in_batch=n)
        return encode_payload(
            command(pb.BaseCommand.SEND, producer_id=1, sequence_id=seq, num_messages=n),
            md.SerializeToString(),
            raw,
        )

    good = pb.SingleMessageMetadata(payload_size=2, partition_key="k").SerializeToString()
    good_raw = struct.pack(">I", len(good)) + good + b"ok"
    with raw(shared_server) as s:
        connect(s)
        s.sendall(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
        assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS
        # Sent together: the second claims two members and holds one.
        s.sendall(batch_frame(0, good_raw, 1) + batch_frame(1, good_raw, 2) + batch_frame(2, good_raw, 1))
        replies = [read_frame(s) for _ in range(3)]
    receipts = sorted(r.send_receipt.sequence_id for r in replies if r.type == pb.BaseCommand.SEND_RECEIPT)
    [error] = [r.send_error for r in replies if r.type == pb.BaseCommand.SEND_ERROR]
    assert receipts == [0, 2]
    assert error.sequence_id == 1 and "malformed batch" in error.message
    assert [(m["key"], m["value"]) for m in rest_messages(shared_server, topic)] == [
        ("k", "b2s="),
        ("k", "b2s="),
    ]


@local_wal_only("a torn tail of a local write-ahead file")
def test_acknowledged_batches_survive_sigkill_and_a_torn_batch_frame_is_cut(server_factory, tmp_path) -> None:
    """Every batch the producer got a receipt for is there after kill -9, with the id the receipt
    gave each member; a batch frame torn by the crash is cut whole and kept aside."""
    data = tmp_path / "data"
    srv = server_factory(data, env={"COMPACTOR_MAX_ENTRIES_PER_LEDGER": "300"})
    srv.start()
    topic = fresh("kill-batches")
    client = pulsar.Client(srv.pulsar_url)
    try:
        producer = batched(client, topic, codec="lz4", size=40)
        messages = [(f"k{i % 13}", f"v{i}".encode() * 5) for i in range(700)]
        acked = [text(m) for m in send_all(producer, messages)]
        # More batches on their way when the process dies: stored or not, never in part.
        for i in range(400):
            producer.send_async(b"late", None, partition_key=f"late{i}")
        srv.kill()
    finally:
        client.close()
    wal = max((data / "ledgers").rglob("*.wal"))
    with open(wal, "ab") as f:  # a batch frame cut short: its header says 4 KB, 20 bytes follow
        f.write(struct.pack("<II", 4096 | fmt.BATCH_FRAME, 0) + b"torn-batch-frame....")
    srv.start()
    got = rest_messages(srv, topic, maxMessages=5000)
    ids = [m["messageId"] for m in got]
    assert ids[: len(acked)] == acked
    assert [(m["key"], base64.b64decode(m["value"])) for m in got[: len(acked)]] == messages
    late = got[len(acked) :]
    assert all(base64.b64decode(m["value"]) == b"late" for m in late)
    # Whole batches only: each late batch stored has every member, indexes 0..n-1.
    batches: dict[str, list[int]] = {}
    for m in late:
        entry, index = m["messageId"].rsplit(":", 1)
        batches.setdefault(entry, []).append(int(index))
    assert all(indexes == list(range(len(indexes))) for indexes in batches.values())
    assert len(set(ids)) == len(ids) and ids == sorted(ids, key=lambda t: tuple(map(int, t.split(":"))))
    assert list(wal.parent.glob("*.quarantine*")), "the torn bytes are kept aside"


def test_messages_read_ahead_for_a_consumer_are_never_lost(client: pulsar.Client) -> None:
    # An Exclusive consumer is sent from pages read ahead of its permits: a redelivery asked for
    # while such a page waits, and a consumer closed with one, must give those messages back.
    topic = fresh("read-ahead")
    sent = send_all(batched(client, topic, size=10), [(None, f"m{i}".encode()) for i in range(200)])
    consumer = client.subscribe(
        topic, "s", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=10
    )
    first = receive_all(consumer, 20)
    assert [m.message_id() for m in first] == sent[:20]
    for m in first[:10]:
        consumer.acknowledge(m)
    time.sleep(0.3)  # the acks go out (grouped by the client) before the redelivery
    consumer.redeliver_unacknowledged_messages()
    # The C++ client keeps what its queue holds (Pulsar's broker sends those again too): every
    # message not acknowledged comes again, from the first, counted; none acknowledged does.
    again: list[pulsar.Message] = []
    with contextlib.suppress(pulsar.Timeout):
        while True:
            again.append(consumer.receive(1000))
    ids = [text(m.message_id()) for m in again]
    assert set(ids) == {text(m) for m in sent[10:]}
    assert len(ids) - len(set(ids)) <= 10  # twice: at most what the client's queue held
    start = ids.index(text(sent[10]))
    assert ids[start:] == [text(m) for m in sent[10:]]
    assert all(m.redelivery_count() == 1 for m in again[start : start + 10])
    for m in again[start : start + 50]:
        consumer.acknowledge(m)
    consumer.close()
    later = client.subscribe(topic, "s", receiver_queue_size=10)
    rest = receive_all(later, 140)
    assert [m.message_id() for m in rest] == sent[60:]
    with pytest.raises(pulsar.Timeout):
        later.receive(300)
