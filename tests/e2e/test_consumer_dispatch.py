"""Which consumer gets what, over Pulsar's binary protocol: a Shared subscription's priority
levels, a Failover subscription's ACTIVE_CONSUMER_CHANGE notifications (per partition on a
partitioned topic), a consumer id reused on its connection, and negative acknowledgements
redelivered when the client asks. Raw frames where the Python client has no such option
(priority levels, consumer event listeners); the Python client otherwise."""

from __future__ import annotations

import socket
import time
import uuid

import httpx
import pulsar
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server
from tests.e2e.partitioned import full, partitioned
from tests.e2e.raw_wire import connect, raw, read_frame
from tests.e2e.test_pulsar_clients import fresh

pytestmark = pytest.mark.e2e

_TYPES = {"Shared": pb.CommandSubscribe.Shared, "Failover": pb.CommandSubscribe.Failover}
_request = iter(range(1000, 10**9))


def connected(server: Server) -> socket.socket:
    s = raw(server)
    connect(s)
    return s


def subscribe(
    s: socket.socket,
    topic: str,
    *,
    consumer_id: int,
    kind: int = pb.CommandSubscribe.Shared,
    name: str = "",
    level: int = 0,
    sub: str = "s",
) -> list[pb.BaseCommand]:
    """Send a SUBSCRIBE; the frames up to its answer (SUCCESS or ERROR), the answer last."""
    rid = next(_request)
    fields: dict[str, object] = {"consumer_name": name} if name else {}
    s.sendall(
        encode(
            command(
                pb.BaseCommand.SUBSCRIBE,
                topic=topic,
                subscription=sub,
                subType=kind,
                consumer_id=consumer_id,
                request_id=rid,
                priority_level=level,
                initialPosition=pb.CommandSubscribe.Earliest,
                **fields,
            )
        )
    )
    return until_answer(s, rid)


def until_answer(s: socket.socket, rid: int) -> list[pb.BaseCommand]:
    frames = []
    while True:
        frame = read_frame(s)
        frames.append(frame)
        if frame.type == pb.BaseCommand.SUCCESS and frame.success.request_id == rid:
            return frames
        if frame.type == pb.BaseCommand.ERROR and frame.error.request_id == rid:
            return frames


def flow(s: socket.socket, consumer_id: int, permits: int) -> None:
    s.sendall(encode(command(pb.BaseCommand.FLOW, consumer_id=consumer_id, messagePermits=permits)))


def frames_for(s: socket.socket, seconds: float) -> list[pb.BaseCommand]:
    """Every frame that arrives in ``seconds``."""
    got = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            got.append(read_frame(s))
        except TimeoutError:
            break
    s.settimeout(10)
    return got


def messages(s: socket.socket, n: int, quiet: float = 0.5) -> int:
    """MESSAGE frames counted until ``n`` came (up to 10 s), then any more within ``quiet``."""
    count = 0
    end = time.monotonic() + 10
    while count < n and time.monotonic() < end:
        s.settimeout(max(end - time.monotonic(), 0.01))
        try:
            count += read_frame(s).type == pb.BaseCommand.MESSAGE
        except TimeoutError:
            break
    return count + sum(f.type == pb.BaseCommand.MESSAGE for f in frames_for(s, quiet))


def active_changes(frames: list[pb.BaseCommand]) -> list[tuple[int, bool]]:
    return [
        (f.active_consumer_change.consumer_id, f.active_consumer_change.is_active)
        for f in frames
        if f.type == pb.BaseCommand.ACTIVE_CONSUMER_CHANGE
    ]


def produce(client: pulsar.Client, topic: str, n: int) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"m{i}".encode())
    producer.close()


# ------------------------------------------------------------------ priority levels


def test_a_shared_subscription_serves_the_highest_priority_level_while_it_has_permits(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("priority")
    high, low = connected(shared_server), connected(shared_server)
    assert subscribe(low, topic, consumer_id=1, level=1)[-1].type == pb.BaseCommand.SUCCESS
    assert subscribe(high, topic, consumer_id=1, level=0)[-1].type == pb.BaseCommand.SUCCESS
    flow(low, 1, 100)
    flow(high, 1, 100)
    produce(client, topic, 10)
    assert messages(high, 10) == 10
    assert messages(low, 0) == 0


def test_a_lower_priority_level_gets_what_the_higher_level_has_no_permits_for(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("priority")
    high, low = connected(shared_server), connected(shared_server)
    assert subscribe(high, topic, consumer_id=1, level=0)[-1].type == pb.BaseCommand.SUCCESS
    assert subscribe(low, topic, consumer_id=1, level=2)[-1].type == pb.BaseCommand.SUCCESS
    flow(high, 1, 3)
    flow(low, 1, 100)
    produce(client, topic, 10)
    assert messages(high, 3) == 3
    assert messages(low, 7) == 7


def test_a_negative_priority_level_is_above_zero_on_the_wire_and_refused_over_rest(
    shared_server: Server, client: pulsar.Client, http: httpx.Client
) -> None:
    topic = fresh("priority")
    zero, negative = connected(shared_server), connected(shared_server)
    assert subscribe(zero, topic, consumer_id=1, level=0)[-1].type == pb.BaseCommand.SUCCESS
    # Pulsar's broker takes any int32 (its Java and Go clients refuse a negative level first).
    assert subscribe(negative, topic, consumer_id=1, level=-1)[-1].type == pb.BaseCommand.SUCCESS
    flow(zero, 1, 100)
    flow(negative, 1, 100)
    produce(client, topic, 4)
    assert messages(negative, 4) == 4
    assert messages(zero, 0) == 0
    path = topic.removeprefix("persistent://")
    r = http.post(f"/topics/persistent/{path}/subscription/s/consumers", json={"priorityLevel": -1})
    assert r.status_code == 422 and "priorityLevel" in r.text


# ------------------------------------------------------------------ active consumer notifications


def test_failover_consumers_are_told_when_they_become_and_stop_being_the_active_one(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("active")
    standby, primary = connected(shared_server), connected(shared_server)
    kind = pb.CommandSubscribe.Failover
    joined = subscribe(standby, topic, consumer_id=4, kind=kind, name="standby", level=1)
    assert joined[-1].type == pb.BaseCommand.SUCCESS
    # Told after the SUCCESS, as Pulsar's broker tells it.
    assert active_changes(frames_for(standby, 0.5)) == [(4, True)]
    joined = subscribe(primary, topic, consumer_id=5, kind=kind, name="primary", level=0)
    assert joined[-1].type == pb.BaseCommand.SUCCESS and not active_changes(joined)
    assert active_changes(frames_for(primary, 0.5)) == [(5, True)]
    assert active_changes(frames_for(standby, 0.5)) == [(4, False)]
    flow(primary, 5, 10)
    flow(standby, 4, 10)
    produce(client, topic, 2)
    assert messages(primary, 2) == 2 and messages(standby, 0) == 0
    rid = next(_request)
    primary.sendall(encode(command(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=5, request_id=rid)))
    until_answer(primary, rid)
    # The standby takes over, told so, with what the primary did not acknowledge.
    got = frames_for(standby, 1.5)
    assert active_changes(got) == [(4, True)]
    assert sum(f.type == pb.BaseCommand.MESSAGE for f in got) == 2


def test_a_consumer_that_joins_beside_the_active_one_is_told_it_is_not_active(shared_server: Server) -> None:
    topic = fresh("active")
    first, second = connected(shared_server), connected(shared_server)
    kind = pb.CommandSubscribe.Failover
    subscribe(first, topic, consumer_id=1, kind=kind, name="first", level=0)
    assert active_changes(frames_for(first, 0.3)) == [(1, True)]
    subscribe(second, topic, consumer_id=1, kind=kind, name="second", level=3)
    assert active_changes(frames_for(second, 0.5)) == [(1, False)]
    assert active_changes(frames_for(first, 0.3)) == []


def test_an_exclusive_consumer_gets_no_active_consumer_change_as_in_pulsar(shared_server: Server) -> None:
    s = connected(shared_server)
    answer = subscribe(s, fresh("exclusive"), consumer_id=1, kind=pb.CommandSubscribe.Exclusive)
    assert answer[-1].type == pb.BaseCommand.SUCCESS
    assert active_changes(answer + frames_for(s, 0.5)) == []


def test_each_partition_has_its_own_active_consumer_spread_by_partition_index(
    shared_server: Server, http: httpx.Client
) -> None:
    name = partitioned(http, 2, "active")
    a, b = connected(shared_server), connected(shared_server)
    kind = pb.CommandSubscribe.Failover
    seen: dict[str, list[pb.BaseCommand]] = {"a": [], "b": []}
    for s, who in ((a, "a"), (b, "b")):
        for p in (0, 1):
            answer = subscribe(s, full(f"{name}-partition-{p}"), consumer_id=10 + p, kind=kind, name=who)
            assert answer[-1].type == pb.BaseCommand.SUCCESS
            seen[who] += answer
    last = {who: dict(active_changes(seen[who] + frames_for(s, 0.8))) for s, who in ((a, "a"), (b, "b"))}
    # Ordered by name, partition i goes to consumer i % 2 (Pulsar's rule for partitions).
    assert last == {"a": {10: True, 11: False}, "b": {10: False, 11: True}}


# ------------------------------------------------------------------ consumer ids across reconnections


def test_a_subscribe_for_a_consumer_the_connection_has_succeeds_and_adds_none(
    shared_server: Server, http: httpx.Client
) -> None:
    topic = fresh("again")
    s = connected(shared_server)
    assert subscribe(s, topic, consumer_id=7)[-1].type == pb.BaseCommand.SUCCESS
    assert subscribe(s, topic, consumer_id=7)[-1].type == pb.BaseCommand.SUCCESS
    stats = http.get(f"/admin/v2/persistent/{topic.removeprefix('persistent://')}/stats").json()
    assert len(stats["subscriptions"]["s"]["consumers"]) == 1


def test_a_consumer_id_closed_or_closed_by_a_seek_is_reused_at_once(
    shared_server: Server, client: pulsar.Client
) -> None:
    topic = fresh("reuse")
    produce(client, topic, 1)
    s = connected(shared_server)
    exclusive = pb.CommandSubscribe.Exclusive
    assert subscribe(s, topic, consumer_id=3, kind=exclusive)[-1].type == pb.BaseCommand.SUCCESS
    for _ in range(5):
        rid = next(_request)
        s.sendall(encode(command(pb.BaseCommand.CLOSE_CONSUMER, consumer_id=3, request_id=rid)))
        until_answer(s, rid)
        assert subscribe(s, topic, consumer_id=3, kind=exclusive)[-1].type == pb.BaseCommand.SUCCESS
        # A seek closes the consumer from the broker's side; the client subscribes again at once.
        rid = next(_request)
        earliest = pb.MessageIdData(ledgerId=0, entryId=0)
        s.sendall(encode(command(pb.BaseCommand.SEEK, consumer_id=3, request_id=rid, message_id=earliest)))
        until_answer(s, rid)
        answer = subscribe(s, topic, consumer_id=3, kind=exclusive)[-1]
        assert answer.type == pb.BaseCommand.SUCCESS, answer
    flow(s, 3, 10)
    assert messages(s, 1) == 1


# ------------------------------------------------------------------ negative acknowledgements


@pytest.mark.parametrize("kind", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Shared])
def test_a_negatively_acknowledged_message_comes_back_after_the_clients_delay(
    client: pulsar.Client, kind: pulsar.ConsumerType
) -> None:
    topic = fresh("nack")
    consumer = client.subscribe(
        topic, f"nack-{uuid.uuid4().hex[:6]}", consumer_type=kind, negative_ack_redelivery_delay_ms=100
    )
    produce(client, topic, 1)
    first = consumer.receive(10_000)
    nacked = time.monotonic()
    consumer.negative_acknowledge(first)
    again = consumer.receive(10_000)
    assert again.data() == first.data() and again.redelivery_count() == 1
    assert time.monotonic() - nacked >= 0.1  # not before the delay the client asked for
    consumer.acknowledge(again)
    consumer.close()
