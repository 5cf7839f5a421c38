"""Random and mutated frames against a real listener of Pulsar's binary protocol: whatever a
connection sends, the listener goes on serving, no message is stored that a producer did not
send intact, and every message acknowledged with a receipt is stored."""

from __future__ import annotations

import base64
import random
import socket
import struct
import uuid

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import FrameDecoder, command, encode, encode_payload
from tests.conftest import Server

pytestmark = [pytest.mark.e2e]

SEED = 20261125
CONNECTIONS = 40


def _send(producer_id: int, seq: int, payload: bytes) -> bytes:
    md = pb.MessageMetadata(producer_name="fuzz", sequence_id=seq, publish_time=1, partition_key=f"k{seq}")
    return encode_payload(
        command(pb.BaseCommand.SEND, producer_id=producer_id, sequence_id=seq),
        md.SerializeToString(),
        payload,
    )


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    kind = rng.randrange(4)
    if kind == 0:  # flip a few bits anywhere
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # cut it short
        data = data[: rng.randrange(1, len(data))]
    elif kind == 2:  # a wrong size in front
        struct.pack_into(">I", data, 0, rng.randrange(2**32))
    else:  # random bytes in the middle
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    return bytes(data)


def _random_command(rng: random.Random) -> bytes:
    kinds = [
        command(pb.BaseCommand.FLOW, consumer_id=rng.randrange(5), messagePermits=rng.randrange(2**32)),
        command(pb.BaseCommand.ACK, consumer_id=rng.randrange(5), ack_type=0),
        command(pb.BaseCommand.CLOSE_PRODUCER, producer_id=rng.randrange(5), request_id=rng.randrange(99)),
        command(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=rng.randrange(5), request_id=rng.randrange(99)),
        command(
            pb.BaseCommand.LOOKUP, topic=rng.choice(["x", "", "a/b/c/d", "persistent://p/q/r"]), request_id=1
        ),
        command(pb.BaseCommand.SEEK, consumer_id=rng.randrange(5), request_id=2),
        command(pb.BaseCommand.GET_LAST_MESSAGE_ID, consumer_id=rng.randrange(5), request_id=3),
        command(pb.BaseCommand.PING),
    ]
    return encode(rng.choice(kinds))


def _session(server: Server, topic: str, rng: random.Random, sent: dict[int, bytes]) -> dict[int, str]:
    """One connection's worth of frames; returns the receipts it got (sequence id -> "L:E")."""
    receipts: dict[int, str] = {}
    with socket.create_connection(("127.0.0.1", server.broker_port), timeout=5) as s:
        frames: list[bytes] = []
        if rng.random() < 0.9:
            frames.append(encode(command(pb.BaseCommand.CONNECT, client_version="fuzz", protocol_version=21)))
            frames.append(encode(command(pb.BaseCommand.PRODUCER, topic=topic, producer_id=1, request_id=1)))
        for _ in range(rng.randint(1, 12)):
            roll = rng.random()
            seq = len(sent) + rng.randrange(10**9) * 1000
            payload = rng.randbytes(rng.randint(0, 64)) + b"!"
            if roll < 0.5:
                sent[seq] = payload
                frames.append(_send(1, seq, payload))
            elif roll < 0.75:
                frames.append(_mutate(rng, _send(1, seq, payload)))
            elif roll < 0.9:
                frames.append(_random_command(rng))
            else:
                frames.append(rng.randbytes(rng.randint(1, 40)))
        try:
            for f in frames:
                s.sendall(f)
        except OSError:
            pass  # the listener closed on us: what it answered so far is still readable
        # Read until the listener closes the connection, or is quiet for a while (the receipts
        # of a healthy session come within milliseconds).
        s.settimeout(1.0)
        decoder = FrameDecoder(16 * 1024 * 1024)
        try:
            while chunk := s.recv(65536):
                for frame in decoder.feed(chunk):
                    if frame.command.type == pb.BaseCommand.SEND_RECEIPT:
                        r = frame.command.send_receipt
                        receipts[r.sequence_id] = f"{r.message_id.ledgerId}:{r.message_id.entryId}"
        except (OSError, TimeoutError):
            pass
    return receipts


def test_the_listener_survives_random_and_mutated_frames(server: Server) -> None:
    topic = f"persistent://public/default/fuzz-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(server.pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.create_producer(topic).close()
        rng = random.Random(SEED)
        sent: dict[int, bytes] = {}
        receipts: dict[int, str] = {}
        for _ in range(CONNECTIONS):
            receipts.update(_session(server, topic, rng, sent))
        r = httpx.get(
            f"{server.url}/topics/persistent/{topic.removeprefix('persistent://')}/messages",
            params={"maxMessages": 10_000},
        )
        stored = {m["messageId"]: base64.b64decode(m["value"]) for m in r.json()["messages"]}
        intact = set(sent.values())
        assert all(v in intact for v in stored.values()), "a message no producer sent intact was stored"
        for seq, mid in receipts.items():
            assert stored.get(mid) == sent[seq], f"acknowledged message {seq} ({mid}) is not stored as sent"
        assert receipts, "no session got a message through: the fuzzing is not reaching the producer"
        # Still serving, to a real client.
        producer = client.create_producer(topic, batching_enabled=False)
        consumer = client.subscribe(topic, "after", initial_position=pulsar.InitialPosition.Latest)
        producer.send(b"after the fuzz")
        assert consumer.receive(10_000).data() == b"after the fuzz"
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    finally:
        client.close()
