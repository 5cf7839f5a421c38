"""End-to-end encryption through the official ``pulsar-client``: the service stores what an
encrypting producer sends and gives it back unchanged, so that a consumer with the private key
decrypts and one without it gets its crypto-failure action (``api.pulsar.encryption``). The RSA
key pair is made for each test, in its ``tmp_path``."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import pulsar
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.conftest import Server
from tests.e2e.conftest import QUIET
from tests.e2e.test_pulsar_batches import send_all, text
from tests.e2e.test_pulsar_clients import fresh, receive_all, rest_messages

pytestmark = [pytest.mark.e2e]

KEY_NAME = "client-rsa.pem"
LZ4 = pulsar.CompressionType.LZ4
Action = pulsar.ConsumerCryptoFailureAction


@pytest.fixture
def keys(tmp_path: Path) -> pulsar.CryptoKeyReader:
    """A key reader over a fresh RSA pair (PEM files, as Pulsar's clients read them)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub, priv = tmp_path / "public.pem", tmp_path / "private.pem"
    pub.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    priv.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return pulsar.CryptoKeyReader(str(pub), str(priv))


def encrypting(
    client: pulsar.Client, topic: str, keys: pulsar.CryptoKeyReader, *, batch: int = 0
) -> pulsar.Producer:
    return client.create_producer(
        topic,
        encryption_key=KEY_NAME,
        crypto_key_reader=keys,
        compression_type=LZ4,
        batching_enabled=batch > 0,
        batching_max_messages=max(batch, 2),
        batching_max_publish_delay_ms=1000,
    )


def check_context(msg: pulsar.Message, *, failed: bool, batch_size: int) -> None:
    """The context a consumer gets is the one the producer sent."""
    ctx = msg.encryption_context()
    assert ctx is not None
    (key,) = ctx.keys()
    assert key.key == KEY_NAME and len(key.value) > 0 and key.metadata == {}
    assert len(ctx.param()) > 0
    assert ctx.compression_type() == LZ4
    assert ctx.batch_size() == batch_size
    assert ctx.is_decryption_failed() == failed


def test_a_consumer_and_a_reader_with_the_key_decrypt(
    client: pulsar.Client, shared_server: Server, keys: pulsar.CryptoKeyReader
) -> None:
    topic = fresh("enc")
    consumer = client.subscribe(topic, "s", crypto_key_reader=keys)
    producer = encrypting(client, topic, keys)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, crypto_key_reader=keys)
    sent = producer.send(b"hello", partition_key="k", properties={"p": "1"})
    msg = consumer.receive(10_000)
    assert (msg.data(), msg.partition_key(), msg.properties()) == (b"hello", "k", {"p": "1"})
    assert msg.message_id() == sent
    check_context(msg, failed=False, batch_size=-1)
    consumer.acknowledge(msg)
    assert reader.read_next(10_000).data() == b"hello"
    with pytest.raises(pulsar.Timeout):
        reader.read_next(100)
    # REST shows the ciphertext and the context, not the service's own property.
    (m,) = rest_messages(shared_server, topic)
    assert m["key"] == "k" and m["properties"] == {"p": "1"}
    assert base64.b64decode(m["value"]) != b"hello"
    enc = m["encryption"]
    assert [k["key"] for k in enc["keys"]] == [KEY_NAME]
    assert enc["compression"] == "LZ4" and enc["uncompressedSize"] == len(b"hello")
    assert enc["batchSize"] is None and base64.b64decode(enc["param"])


def test_each_crypto_failure_action_of_a_consumer_without_the_key(
    client: pulsar.Client, keys: pulsar.CryptoKeyReader
) -> None:
    topic = fresh("enc-fail")
    producer = encrypting(client, topic, keys)
    producer.send(b"msg-0")

    def next_with_key(expected: bytes) -> None:
        c = client.subscribe(topic, "sub", crypto_key_reader=keys)
        msg = c.receive(10_000)
        assert msg.data() == expected
        check_context(msg, failed=False, batch_size=-1)
        assert msg.encryption_context().uncompressed_message_size() == len(expected)
        c.acknowledge(msg)
        c.close()

    # FAIL: not delivered, not acknowledged: the next consumer of the subscription gets it.
    c = client.subscribe(
        topic, "sub", initial_position=pulsar.InitialPosition.Earliest, crypto_failure_action=Action.FAIL
    )
    with pytest.raises(pulsar.Timeout):
        c.receive(1500)
    c.close()
    producer.send(b"msg-1")
    next_with_key(b"msg-0")
    # DISCARD: acknowledged by the client, so never delivered again.
    c = client.subscribe(topic, "sub", crypto_failure_action=Action.DISCARD)
    with pytest.raises(pulsar.Timeout):
        c.receive(1500)
    c.close()
    producer.send(b"msg-2")
    next_with_key(b"msg-2")
    producer.close()
    # A batch: msg-3 and msg-4 in one.
    batched = encrypting(client, topic, keys, batch=2)
    send_all(batched, [(None, b"msg-3"), (None, b"msg-4")])
    # CONSUME: delivered undecrypted; the encrypted batch as one message.
    c = client.subscribe(
        topic,
        "other",
        initial_position=pulsar.InitialPosition.Earliest,
        crypto_failure_action=Action.CONSUME,
    )
    reader = client.create_reader(topic, pulsar.MessageId.earliest, crypto_failure_action=Action.CONSUME)
    for got in (receive_all(c, 4), [reader.read_next(10_000) for _ in range(4)]):
        for i, msg in enumerate(got):
            assert msg.data() != f"msg-{i}".encode() and len(msg.data()) > 5
            check_context(msg, failed=True, batch_size=2 if i == 3 else -1)
        assert got[3].encryption_context().uncompressed_message_size() > len(b"msg-3")
    with pytest.raises(pulsar.Timeout):
        c.receive(500)


def test_encrypted_batches_decrypt_member_by_member_under_their_receipts_ids(
    client: pulsar.Client, shared_server: Server, keys: pulsar.CryptoKeyReader
) -> None:
    topic = fresh("enc-batch")
    producer = encrypting(client, topic, keys, batch=5)
    messages = [(f"k{i % 3}", f"v{i}".encode()) for i in range(15)]
    ids = send_all(producer, messages)
    assert {mid.batch_index() for mid in ids} == set(range(5))
    consumer = client.subscribe(
        topic, "s", initial_position=pulsar.InitialPosition.Earliest, crypto_key_reader=keys
    )
    got = receive_all(consumer, 15)
    assert [(m.partition_key(), m.data()) for m in got] == messages
    assert [m.message_id() for m in got] == ids
    assert [m.properties() for m in got] == [{"i": str(i)} for i in range(15)]
    # Acknowledge the first batch whole and two members of the second: the rest comes again.
    for m in got[:5] + got[5:7]:
        consumer.acknowledge(m)
    consumer.close()
    time.sleep(0.3)
    again = client.subscribe(topic, "s", crypto_key_reader=keys)
    back = receive_all(again, 10)
    assert [m.data() for m in back] == [v for _, v in messages[5:]]
    with pytest.raises(pulsar.Timeout):
        again.receive(500)
    # REST: the batch's first id holds its ciphertext and context; the others name it.
    rest = rest_messages(shared_server, topic)
    assert [m["messageId"] for m in rest] == [text(mid) for mid in ids]
    first, second = rest[0], rest[1]
    assert first["encryption"]["batchSize"] == 5 and first["key"] == "k0"
    assert second["value"] is None and second["encryption"] == {"batchFirstMessageId": rest[0]["messageId"]}
    assert second["properties"] == {}


@pytest.mark.parametrize("acked", [[0, 2, 4], [0, 1]], ids=["every-other", "first-two"])
def test_batch_index_acks_of_an_encrypted_batch_redeliver_only_the_members_left(
    client: pulsar.Client, keys: pulsar.CryptoKeyReader, acked: list[int]
) -> None:
    """The broker cannot rebuild an encrypted batch without members: it sends the ciphertext
    whole and leaves the acknowledged ones out by ``ack_set``, even when the first member (which
    holds the ciphertext) is acknowledged and the subscription's position is past it."""
    topic = fresh("enc-batch-ack")
    sent = send_all(encrypting(client, topic, keys, batch=6), [(None, f"m{i}".encode()) for i in range(6)])
    assert len({(m.ledger_id(), m.entry_id()) for m in sent}) == 1

    def subscribe() -> pulsar.Consumer:
        return client.subscribe(
            topic,
            "s",
            initial_position=pulsar.InitialPosition.Earliest,
            consumer_type=pulsar.ConsumerType.Shared,
            batch_index_ack_enabled=True,
            crypto_key_reader=keys,
        )

    consumer = subscribe()
    got = receive_all(consumer, 6)
    for i in acked:
        consumer.acknowledge(got[i])
    time.sleep(0.5)  # the client groups acks for 100 ms
    consumer.close()
    again = subscribe()
    left = [i for i in range(6) if i not in acked]
    rest = receive_all(again, len(left))
    assert [m.data() for m in rest] == [f"m{i}".encode() for i in left]
    assert [m.message_id() for m in rest] == [sent[i] for i in left]
    with pytest.raises(pulsar.Timeout):
        again.receive(500)


def test_a_reader_from_a_member_of_an_encrypted_batch(
    client: pulsar.Client, keys: pulsar.CryptoKeyReader
) -> None:
    topic = fresh("enc-reader")
    sent = send_all(encrypting(client, topic, keys, batch=4), [(None, f"m{i}".encode()) for i in range(4)])
    reader = client.create_reader(topic, sent[2], start_message_id_inclusive=True, crypto_key_reader=keys)
    assert [reader.read_next(10_000).data() for _ in range(2)] == [b"m2", b"m3"]
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)


def _compact(server: Server, topic: str) -> None:
    admin = f"{server.url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/compaction"
    assert httpx.put(admin).status_code == 204
    deadline = time.monotonic() + 180
    while (status := httpx.get(admin).json())["status"] != "SUCCESS":
        assert status["status"] != "ERROR", status
        assert time.monotonic() < deadline, "compaction did not finish"
        time.sleep(0.2)


@pytest.mark.spark
def test_read_compacted_keeps_the_latest_encrypted_message_of_each_key_and_batches_whole(
    client: pulsar.Client, shared_server: Server, keys: pulsar.CryptoKeyReader
) -> None:
    """Keys are plaintext: encrypted messages compact by key. An encrypted batch cannot be read
    by the broker: as Pulsar's compactor, it is one message under its key, kept whole."""
    topic = fresh("enc-compact")
    single = encrypting(client, topic, keys)
    for i in range(6):
        single.send(f"s{i}".encode(), partition_key=f"k{i % 2}")
    single.send(b"", partition_key="k1")  # an empty value deletes its key, encrypted too
    batched = encrypting(client, topic, keys, batch=3)
    send_all(batched, [("b", b"b0"), ("x", b"b1"), ("y", b"b2")])  # the batch's key is its first's
    send_all(batched, [("c", b"c0"), ("c", b"c1"), ("z", b"c2")])
    single.send(b"c-latest", partition_key="c")  # supersedes the second batch, whole
    _compact(shared_server, topic)
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=True, crypto_key_reader=keys
    )
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(10_000))
    assert [(m.partition_key(), m.data()) for m in got] == [
        ("k0", b"s4"),
        ("b", b"b0"),
        ("x", b"b1"),
        ("y", b"b2"),
        ("c", b"c-latest"),
    ]
    compacted = rest_messages(shared_server, topic, readCompacted="true")
    assert [m["key"] for m in compacted] == ["k0", "b", "c"]
    assert compacted[1]["encryption"]["batchSize"] == 3
    # The full log still has the delete, which a consumer with the key decrypts as empty.
    full = client.subscribe(
        topic, "full", initial_position=pulsar.InitialPosition.Earliest, crypto_key_reader=keys
    )
    assert [m.data() for m in receive_all(full, 7)][-1] == b""


def test_encryption_context_survives_sealed_ledgers_and_a_restart(
    server_factory: type[Server], tmp_path: Path, keys: pulsar.CryptoKeyReader
) -> None:
    srv = server_factory(tmp_path / "data", env={"COMPACTOR_MAX_ENTRIES_PER_LEDGER": "4"})
    srv.start()
    topic = fresh("enc-restart")
    c = pulsar.Client(srv.pulsar_url, logger=QUIET)
    try:
        single = encrypting(c, topic, keys)
        ids = [single.send(f"m{i}".encode(), partition_key=f"k{i}") for i in range(5)]
        ids += send_all(encrypting(c, topic, keys, batch=4), [(f"b{i}", f"n{i}".encode()) for i in range(8)])
    finally:
        c.close()
    before = rest_messages(srv, topic)
    srv.stop()
    srv.start()
    assert rest_messages(srv, topic) == before
    c = pulsar.Client(srv.pulsar_url, logger=QUIET)
    try:
        consumer = c.subscribe(
            topic, "s", initial_position=pulsar.InitialPosition.Earliest, crypto_key_reader=keys
        )
        got = receive_all(consumer, 13)
        assert [m.data() for m in got] == [f"m{i}".encode() for i in range(5)] + [
            f"n{i}".encode() for i in range(8)
        ]
        assert [m.message_id() for m in got] == ids
        check_context(got[0], failed=False, batch_size=-1)
        undecrypted = c.subscribe(
            topic,
            "raw",
            initial_position=pulsar.InitialPosition.Earliest,
            crypto_failure_action=Action.CONSUME,
        )
        raw = receive_all(undecrypted, 7)  # five messages and two batches, each one message
        assert [m.encryption_context().batch_size() for m in raw] == [-1] * 5 + [4, 4]
    finally:
        c.close()


def _compacted_messages(
    client: pulsar.Client, topic: str, keys: pulsar.CryptoKeyReader
) -> list[tuple[str, bytes]]:
    """What subscription ``sub1`` (made before anything was sent) receives reading compacted."""
    consumer = client.subscribe(topic, "sub1", is_read_compacted=True, crypto_key_reader=keys)
    got = []
    while True:
        try:
            m = consumer.receive(1500)
        except pulsar.Timeout:
            return got
        got.append((m.partition_key(), m.data()))


@pytest.mark.spark
@pytest.mark.parametrize("compression", [pulsar.CompressionType.NONE, LZ4], ids=["plain", "lz4"])
@pytest.mark.parametrize("batching", [False, True], ids=["no-batch", "batching"])
def test_pulsar_compaction_scenarios_of_encrypted_messages(
    client: pulsar.Client,
    shared_server: Server,
    keys: pulsar.CryptoKeyReader,
    batching: bool,
    compression: object,
) -> None:
    """Pulsar's ``CompactionTest.testCompactEncrypted[AndCompressed]{NoBatch,Batching}``: sent
    alone, key2's older message is compacted away; in one batch the broker cannot read, all
    three come through (the batch is one message of its key, key1, and the latest of it)."""
    topic = fresh("enc-pulsar-compact")
    client.subscribe(topic, "sub1", is_read_compacted=True).close()
    producer = client.create_producer(
        topic,
        encryption_key=KEY_NAME,
        crypto_key_reader=keys,
        compression_type=compression,
        batching_enabled=batching,
        batching_max_messages=3,
        batching_max_publish_delay_ms=3_600_000,
    )
    send_all(producer, [("key1", b"my-message-1"), ("key2", b"my-message-2"), ("key2", b"my-message-3")])
    _compact(shared_server, topic)
    expected = [("key1", b"my-message-1"), ("key2", b"my-message-3")]
    if batching:
        expected[1:1] = [("key2", b"my-message-2")]
    assert _compacted_messages(client, topic, keys) == expected


@pytest.mark.spark
def test_pulsar_empty_payload_deletes_when_encrypted(
    client: pulsar.Client, shared_server: Server, keys: pulsar.CryptoKeyReader
) -> None:
    """Pulsar's ``CompactionTest.testEmptyPayloadDeletesWhenEncrypted``: an empty encrypted
    message sent alone deletes its key; inside a batch (which the broker cannot read) it does
    not, and the batch comes through whole."""
    topic = fresh("enc-empty-deletes")
    client.subscribe(topic, "sub1", is_read_compacted=True).close()
    alone = encrypting(client, topic, keys)
    batched = encrypting(client, topic, keys, batch=3)
    alone.send(b"my-message-0", partition_key="key0")
    alone.send(b"my-message-1", partition_key="key1")
    alone.send(b"", partition_key="key1")
    send_all(batched, [("key2", b"my-message-2"), ("key3", b"my-message-3"), ("key2", b"")])
    alone.send(b"my-message-4", partition_key="key4")
    _compact(shared_server, topic)
    assert _compacted_messages(client, topic, keys) == [
        ("key0", b"my-message-0"),
        ("key2", b"my-message-2"),
        ("key3", b"my-message-3"),
        ("key2", b""),
        ("key4", b"my-message-4"),
    ]
