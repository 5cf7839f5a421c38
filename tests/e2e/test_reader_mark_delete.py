"""A reader's mark-delete position, as ``GET_LAST_MESSAGE_ID`` reports it: where the reader's
acknowledgements put it, as Pulsar's non-durable cursor keeps it, not how far the service has
already sent messages ahead into the client's queue. Go's ``Reader.HasNext`` decides with it
whether a reader that sought by publish time has anything left: from the position sent ahead, it
saw nothing left to read (tests/e2e/test_go_client.py drives that with the Go client)."""

from __future__ import annotations

import pulsar

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from api.pulsar.messages import position
from tests.conftest import Server
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh


def _frames_until(s, wanted: int) -> pb.BaseCommand:  # type: ignore[no-untyped-def]
    while True:
        frame = read_frame(s)
        if frame.type == wanted:
            return frame


def test_the_mark_delete_position_moves_with_acknowledgements_not_with_deliveries(
    client: pulsar.Client, shared_server: Server
) -> None:
    topic = fresh("rmark")
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [producer.send(f"m{i}".encode()) for i in range(4)]
    first, third = sent[0], sent[2]
    with raw(shared_server) as s:
        connect(s)
        subscribe = command(
            pb.BaseCommand.SUBSCRIBE,
            topic=topic,
            subscription="reader-raw",
            subType=pb.CommandSubscribe.Exclusive,
            consumer_id=1,
            request_id=1,
            durable=False,
            start_message_id=pb.MessageIdData(ledgerId=first.ledger_id(), entryId=first.entry_id()),
        )
        s.sendall(encode(subscribe))
        assert _frames_until(s, pb.BaseCommand.SUCCESS).success.request_id == 1
        s.sendall(encode(command(pb.BaseCommand.FLOW, consumer_id=1, messagePermits=100)))
        for _ in range(4):  # everything sent ahead, nothing acknowledged
            _frames_until(s, pb.BaseCommand.MESSAGE)

        def mark(request_id: int) -> tuple[int, int]:
            s.sendall(
                encode(command(pb.BaseCommand.GET_LAST_MESSAGE_ID, consumer_id=1, request_id=request_id))
            )
            answer = _frames_until(s, pb.BaseCommand.GET_LAST_MESSAGE_ID_RESPONSE).getLastMessageIdResponse
            assert answer.last_message_id.entryId == sent[-1].entry_id()
            return tuple(position(answer.consumer_mark_delete_position))  # type: ignore[return-value]

        assert mark(2) == (first.ledger_id(), first.entry_id() - 1)
        ack = command(
            pb.BaseCommand.ACK,
            consumer_id=1,
            ack_type=pb.CommandAck.Cumulative,
            message_id=[pb.MessageIdData(ledgerId=third.ledger_id(), entryId=third.entry_id())],
        )
        s.sendall(encode(ack))
        assert mark(3) == (third.ledger_id(), third.entry_id())
