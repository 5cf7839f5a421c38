"""Pulsar's producer deduplication through the official ``pulsar-client`` against a real
``compactor serve``: with the policy on, a producer that sends a sequence id already stored
(a retry after a reconnect) stores nothing twice, and a producer that comes back learns where
it stopped, across a restart of the service too."""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode, encode_payload
from tests.conftest import Server
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import QUIET, fresh, rest_messages

pytestmark = [pytest.mark.e2e]

# The id of a receipt for a duplicate: -1:-1, as the uint64 the wire carries.
NO_ID = 2**64 - 1


def turn_on(server: Server, topic: str) -> None:
    path = topic.removeprefix("persistent://")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put(f"/admin/v2/persistent/{path}").status_code == 204
        assert http.post(f"/admin/v2/persistent/{path}/deduplicationEnabled", json=True).status_code == 204


def resend_batch(server: Server, topic: str, producer: str) -> tuple[int, int]:
    """Send a batch of two (sequence ids 0 and 1) as producer ``producer`` on a connection of
    its own, as a client that reconnected sends what it has no receipt for; returns the id of
    its receipt."""
    with raw(server) as s:
        connect(s)
        producing = command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)
        producing.producer.producer_name = producer
        s.sendall(encode(producing))
        assert read_frame(s).type == pb.BaseCommand.PRODUCER_SUCCESS
        payload = b""
        for i, value in enumerate([b"b0", b"b1"]):
            single = pb.SingleMessageMetadata(payload_size=len(value), sequence_id=i).SerializeToString()
            payload += struct.pack(">I", len(single)) + single + value
        md = pb.MessageMetadata(producer_name=producer, sequence_id=0, publish_time=1)
        md.num_messages_in_batch = 2
        send = command(pb.BaseCommand.SEND, producer_id=1, sequence_id=0, num_messages=2)
        send.send.highest_sequence_id = 1
        s.sendall(encode_payload(send, md.SerializeToString(), payload))
        receipt = read_frame(s)
        assert receipt.type == pb.BaseCommand.SEND_RECEIPT, receipt
        return receipt.send_receipt.message_id.ledgerId, receipt.send_receipt.message_id.entryId


def stored(server: Server, topic: str) -> list[bytes]:
    import base64

    return [base64.b64decode(m["value"]) for m in rest_messages(server, topic)]


def test_a_producer_resumes_after_what_was_stored_and_retries_store_nothing(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = server_factory(tmp_path / "data")
    server.start()
    topic = fresh("dedup")
    turn_on(server, topic)
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    try:
        first = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert first.last_sequence_id() == -1
        for i in range(5):
            first.send(f"m{i}".encode(), sequence_id=i)
        first.close()
        again = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert again.last_sequence_id() == 4
        # The retries of 3 and 4 are acknowledged and not stored again; 5 is new.
        again.send(b"m3-retry", sequence_id=3)
        again.send(b"m4-retry", sequence_id=4)
        again.send(b"m5", sequence_id=5)
        # A batch resent after a reconnect (the client resends what it has no receipt for, with
        # the same sequence ids): acknowledged, stored once.
        assert resend_batch(server, topic, "batcher") == (1, 6)  # after m0..m5
        assert resend_batch(server, topic, "batcher") == (NO_ID, NO_ID)
        another = client.create_producer(topic, producer_name="other-app", batching_enabled=False)
        assert another.last_sequence_id() == -1
        another.send(b"o0", sequence_id=0)  # each producer name has its own sequence
    finally:
        client.close()
    expected = [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"b0", b"b1", b"o0"]
    assert stored(server, topic) == expected
    # Killed (-9) and started again: the state is built again from the ledgers (the open
    # ledger's write-ahead file here), so a retry is still recognised.
    server.kill()
    server.start()  # the same data directory and metadata database
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    try:
        back = client.create_producer(topic, producer_name="orders-app", batching_enabled=False)
        assert back.last_sequence_id() == 5
        assert client.create_producer(topic, producer_name="other-app").last_sequence_id() == 0
        back.send(b"m5-retry", sequence_id=5)
        back.send(b"m6", sequence_id=6)
    finally:
        client.close()
    assert stored(server, topic) == [*expected, b"m6"]


def test_without_the_policy_a_resent_sequence_id_is_stored_again(shared_server: Server) -> None:
    topic = fresh("no-dedup")
    client = pulsar.Client(shared_server.pulsar_url, operation_timeout_seconds=15, logger=QUIET)
    try:
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        producer.send(b"a", sequence_id=0)
        producer.close()
        producer = client.create_producer(topic, producer_name="p", batching_enabled=False)
        assert producer.last_sequence_id() == -1
        producer.send(b"a-again", sequence_id=0)
    finally:
        client.close()
    assert stored(shared_server, topic) == [b"a", b"a-again"]
