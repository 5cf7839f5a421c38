"""Pulsar's subscription types, negative acks and dead letters, against a real server and
checked against a model of what each consumer holds.

The server's consumer timeout is short here (``TIMEOUT_MS``): a consumer that stops calling
is how a crash looks to the service. The randomized tests use a fixed seed and small sizes.
A consumer the server timed out although the test meant it alive (a slow machine) re-attaches
under a new id; the model then treats its old id as crashed, which is what it was to the server.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from functools import partial

import httpx
import pytest

from api.client import (
    BadRequest,
    Client,
    Consumer,
    ConsumerBusy,
    ConsumerType,
    DeadLetterPolicy,
    Message,
    MessageId,
)
from tests.conftest import SUPERUSER, SecureServer, Server

pytestmark = pytest.mark.e2e

TIMEOUT_MS = 3000
NS = "public/default"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(
        tmp_path_factory.mktemp("subscription-types") / "data",
        env={"COMPACTOR_CONSUMER_TIMEOUT_MS": str(TIMEOUT_MS)},
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture
def client(srv: Server) -> Iterator[Client]:
    with Client(srv.url, timeout=30) as c:
        yield c


def make_topic(client: Client, name: str) -> str:
    topic = f"{NS}/{name}"
    client.admin.topics.create(topic)
    return topic


def receive(consumer: Consumer, n: int, *, give_up_s: float = 60) -> list[Message]:
    """Exactly ``n`` messages, waiting as long as it takes (a takeover waits for a timeout)."""
    out: list[Message] = []
    stop = time.monotonic() + give_up_s
    while len(out) < n:
        assert time.monotonic() < stop, f"only {len(out)} of {n} messages came"
        out.extend(consumer.batch_receive(max_messages=n - len(out), timeout_millis=500))
    assert len(out) == n
    return out


def ids(messages: list[Message]) -> list[MessageId]:
    return [m.message_id() for m in messages]


# ------------------------------------------------------------------ Failover


def test_failover_takeover_loses_nothing_and_delivers_in_order(client: Client) -> None:
    topic = make_topic(client, "failover")
    sent = client.create_producer(topic).send_many([(f"k{i % 5}", b"%d" % i) for i in range(40)])
    sub = partial(
        client.subscribe,
        topic,
        "fo",
        initial_position="earliest",
        subscription_type=ConsumerType.Failover,
        ack_group_time_ms=0,
    )
    at_level_1 = {
        "b": sub(consumer_name="b", priority_level=1),
        "a": sub(consumer_name="a", priority_level=1),
    }
    z = sub(consumer_name="z", priority_level=2)
    stats = client.admin.topics.stats(topic)["subscriptions"]["fo"]
    # One of the highest level is active: which one, Pulsar's hash ring of the topic's name says.
    assert stats["type"] == "Failover" and stats["activeConsumerName"] in at_level_1
    a = at_level_1.pop(stats["activeConsumerName"])
    (b,) = at_level_1.values()
    assert [c["priorityLevel"] for c in stats["consumers"]] == [1, 1, 2]
    assert b.batch_receive(10, 0) == [] and z.batch_receive(10, 0) == []  # standbys get nothing

    first = receive(a, 10)
    assert ids(first) == sent[:10]
    for m in first[:6]:
        a.acknowledge(m)
    a.close()  # the other of level 1 is next: it starts from the mark-delete position
    second = receive(b, 15)
    assert ids(second) == sent[6:21]
    b.acknowledge_cumulative(second[9])  # up to sent[15]
    # b crashes: it stops calling. z, polling, takes over once the server times b out.
    third = receive(z, 24)
    assert ids(third) == sent[16:]
    z.acknowledge_cumulative(third[-1])
    z.close()
    stats = client.admin.topics.stats(topic)["subscriptions"]["fo"]
    assert stats["msgBacklog"] == 0 and stats["markDeletePosition"] == str(sent[-1])


def test_readcompacted_is_refused_on_shared_and_types_do_not_mix(client: Client) -> None:
    topic = make_topic(client, "type-rules")
    sub = partial(client.subscribe, topic, "s", ack_group_time_ms=0)
    with pytest.raises(BadRequest, match="readCompacted only allowed on failover or exclusive"):
        sub(subscription_type=ConsumerType.Shared, read_compacted=True)
    with pytest.raises(BadRequest, match="Shared or Key_Shared"):
        sub(dead_letter_policy=DeadLetterPolicy(3))
    shared = sub(subscription_type=ConsumerType.Shared)
    with pytest.raises(ConsumerBusy, match="Subscription is of different type"):
        sub(subscription_type=ConsumerType.KeyShared)
    with pytest.raises(ConsumerBusy):
        sub()  # Exclusive
    with pytest.raises(ValueError, match="cumulative"):
        shared.acknowledge_cumulative(MessageId(1, 0))
    shared.close()
    # With no consumer left, the next first consumer chooses the type again.
    sub(subscription_type=ConsumerType.Failover, read_compacted=True).close()


# ------------------------------------------------------------------ the model


class Model:
    """What each consumer (by its server id) holds: delivered and not acknowledged. A
    delivery of a message, or of a key, that another consumer holds is recorded against that
    holder, and excused only if the holder is gone (crashed, or timed out by the server)."""

    def __init__(self, sent: list[MessageId], keys: dict[MessageId, str]) -> None:
        self.sent = sent
        self.keys = keys
        self.holder: dict[MessageId, str] = {}
        self.acked: set[MessageId] = set()
        self.gone: set[str] = set()
        self.suspect: list[tuple[str, str]] = []  # (holder, what happened)
        self.errors: list[str] = []
        self.deliveries: dict[MessageId, list[str]] = {}

    def release(self, consumer_id: str) -> None:
        for mid in [m for m, h in self.holder.items() if h == consumer_id]:
            del self.holder[mid]

    def delivered(self, consumer_id: str, msg: Message, *, key_shared: bool = False) -> None:
        mid = msg.message_id()
        if mid in self.acked:
            self.errors.append(f"{mid} delivered after it was acknowledged")
        held_by = self.holder.get(mid)
        if held_by is not None and held_by != consumer_id:
            self.suspect.append((held_by, f"{mid} delivered to {consumer_id} while {held_by} held it"))
        if key_shared:
            key = self.keys[mid]
            for other, h in self.holder.items():
                if h != consumer_id and self.keys[other] == key and other != mid:
                    self.suspect.append((h, f"key {key} delivered to {consumer_id} while {h} held {other}"))
            for earlier in self.sent:
                if earlier >= mid:
                    break
                mine = self.holder.get(earlier) == consumer_id
                if self.keys[earlier] == key and earlier not in self.acked and not mine:
                    self.errors.append(f"{mid} (key {key}) delivered before {earlier}")
        self.holder[mid] = consumer_id
        self.deliveries.setdefault(mid, []).append(consumer_id)

    def acknowledged(self, mids: list[MessageId]) -> None:
        for mid in mids:
            self.acked.add(mid)
            self.holder.pop(mid, None)

    def check(self) -> None:
        assert self.errors == []
        assert [what for holder, what in self.suspect if holder not in self.gone] == []
        assert self.acked == set(self.sent)


class Members:
    """The live consumers of one subscription, by name, with the server id each had last."""

    def __init__(self, model: Model, subscribe: Callable[[str], Consumer]) -> None:
        self.model = model
        self.subscribe = subscribe
        self.live: dict[str, Consumer] = {}
        self.ids: dict[str, str] = {}
        self.n = 0

    def join(self) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.live[name] = self.subscribe(name)
        self.ids[name] = self.live[name].consumer_id or ""
        return name

    def _seen(self, name: str) -> str:
        now = self.live[name].consumer_id or ""
        if now != self.ids[name]:  # the server timed it out: it re-attached
            self.model.gone.add(self.ids[name])
            self.model.release(self.ids[name])
            self.ids[name] = now
        return now

    def receive(self, name: str, n: int, wait_ms: int = 0, *, key_shared: bool = False) -> None:
        got = self.live[name].batch_receive(max_messages=n, timeout_millis=wait_ms)
        me = self._seen(name)
        for m in got:
            self.model.delivered(me, m, key_shared=key_shared)

    def ack_some(self, name: str, rng: random.Random, share: float) -> None:
        me = self.ids[name]
        mine = [m for m, h in self.model.holder.items() if h == me]
        chosen = [m for m in mine if rng.random() < share]
        if chosen:
            self.live[name].acknowledge_many(chosen)
            self._seen(name)
            self.model.acknowledged(chosen)

    def close(self, name: str) -> None:
        consumer = self.live.pop(name)
        consumer.close()
        self.model.release(self.ids[name])

    def crash(self, name: str) -> None:
        self.live.pop(name)  # it never calls again; the server times it out
        self.model.gone.add(self.ids[name])

    def drain(self, key_shared: bool = False) -> None:
        stop = time.monotonic() + 120
        while self.model.acked != set(self.model.sent):
            assert time.monotonic() < stop, f"{len(self.model.sent) - len(self.model.acked)} never came"
            for name in list(self.live):
                self.receive(name, 50, 100, key_shared=key_shared)
                self.ack_some(name, random.Random(0), 1.0)


def test_shared_delivers_every_message_to_one_consumer_until_acked(client: Client) -> None:
    rng = random.Random(19)
    topic = make_topic(client, "shared")
    producer = client.create_producer(topic)
    sent = producer.send_many([(f"k{i % 7}", b"%d" % i) for i in range(150)])
    model = Model(sent, {m: "" for m in sent})
    subscribe = partial(
        client.subscribe,
        topic,
        "workers",
        initial_position="earliest",
        subscription_type=ConsumerType.Shared,
        ack_group_time_ms=0,
    )
    members = Members(model, lambda name: subscribe(consumer_name=name))
    for _ in range(3):
        members.join()
    for step in range(160):
        if step == 40:  # a consumer crashes holding messages: they go to the others later
            holders = {h for h in model.holder.values()}
            victim = next(n for n in members.live if members.ids[n] in holders)
            members.crash(victim)
        elif step == 70:
            members.join()
        elif step == 100:
            members.close(next(iter(members.live)))
        name = rng.choice(list(members.live))
        if rng.random() < 0.6:
            members.receive(name, rng.randint(1, 6))
        else:
            members.ack_some(name, rng, 0.7)
    stats = client.admin.topics.stats(topic)["subscriptions"]["workers"]
    assert stats["type"] == "Shared"
    held = {c["consumerId"]: c["unackedMessages"] for c in stats["consumers"]}
    for name in members.live:
        me = members.ids[name]
        assert held[me] == sum(1 for h in model.holder.values() if h == me)
    members.drain()
    model.check()
    # At least once: a message came twice only after its first holder crashed or closed.
    assert all(len(set(who)) == len(who) for who in model.deliveries.values())
    assert any(len(who) > 1 for who in model.deliveries.values())  # the crash's were redelivered
    assert client.admin.topics.stats(topic)["subscriptions"]["workers"]["msgBacklog"] == 0


def test_key_shared_keeps_each_keys_order_as_consumers_join_leave_and_crash(client: Client) -> None:
    rng = random.Random(1919)
    topic = make_topic(client, "key-shared")
    producer = client.create_producer(topic)
    keys: dict[MessageId, str] = {}
    sent: list[MessageId] = []
    model = Model(sent, keys)

    def produce(n: int) -> None:
        batch = [(f"key-{rng.randrange(8)}", b"v") for _ in range(n)]
        for mid, (key, _) in zip(producer.send_many(batch), batch, strict=True):
            keys[mid] = key
            sent.append(mid)

    subscribe = partial(
        client.subscribe,
        topic,
        "ordered",
        initial_position="earliest",
        subscription_type=ConsumerType.KeyShared,
        ack_group_time_ms=0,
    )
    members = Members(model, lambda name: subscribe(consumer_name=name))
    members.join()
    members.join()
    produce(30)
    events = {30: "join", 60: "crash", 90: "join", 120: "close", 150: "join", 180: "crash", 210: "close"}
    for step in range(240):
        event = events.get(step)
        if event == "join":
            members.join()
        elif event == "crash" and len(members.live) > 1:
            members.crash(rng.choice(list(members.live)))
        elif event == "close" and len(members.live) > 1:
            members.close(rng.choice(list(members.live)))
        if step % 10 == 5 and step < 200:
            produce(10)
        name = rng.choice(list(members.live))
        if rng.random() < 0.55:
            members.receive(name, rng.randint(1, 5), key_shared=True)
        else:
            members.ack_some(name, rng, 0.6)
    stats = client.admin.topics.stats(topic)["subscriptions"]["ordered"]
    assert stats["type"] == "Key_Shared"
    shown = [r for c in stats["consumers"] for r in c["keyHashRanges"]]
    ranges = sorted(tuple(int(x) for x in r.strip("[]").split(", ")) for r in shown)
    assert ranges[0][0] == 0 and ranges[-1][1] == 65536
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    members.drain(key_shared=True)
    model.check()


# ------------------------------------------------------------------ negative acks, dead letters


def test_negative_ack_redelivers_then_the_dead_letter_topic_takes_the_message(client: Client) -> None:
    topic = make_topic(client, "payments")
    producer = client.create_producer(topic)
    good = producer.send_many([("a", b"1"), ("b", b"2")])
    poison = producer.send(b"boom", key="p", properties={"origin": "test"})
    consumer = client.subscribe(
        topic,
        "billing",
        initial_position="earliest",
        subscription_type=ConsumerType.Shared,
        ack_group_time_ms=0,
        negative_ack_redelivery_delay_ms=50,
        dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2),
    )
    counts: list[int] = []
    dlq = f"{topic}-billing-DLQ"
    stop = time.monotonic() + 60
    while True:
        assert time.monotonic() < stop, "the poison message never reached the dead letter topic"
        for m in consumer.batch_receive(10, 200):
            if m.message_id() == poison:
                counts.append(m.redelivery_count())
                consumer.negative_acknowledge(m)
            else:
                consumer.acknowledge(m)
        if f"persistent://{dlq}" in client.admin.topics.list(NS):
            break
    # Delivered once and redelivered twice (max_redeliver_count), then dead-lettered.
    assert counts == [0, 1, 2]
    dead = list(client.create_reader(dlq, MessageId.earliest, start_message_id_inclusive=True))
    assert len(dead) == 1
    assert dead[0].key() == "p" and dead[0].value() == b"boom"
    assert dead[0].properties() == {
        "origin": "test",
        "REAL_TOPIC": f"persistent://{topic}",
        "ORIGIN_MESSAGE_ID": str(poison),
    }
    assert consumer.batch_receive(10, 300) == []  # acknowledged on the original
    stats = client.admin.topics.stats(topic)["subscriptions"]["billing"]
    assert stats["msgBacklog"] == 0 and stats["markDeletePosition"] == str(poison)
    assert good[0] < poison


def test_negative_ack_on_exclusive_redelivers_every_unacked_message_in_order(client: Client) -> None:
    topic = make_topic(client, "nack-exclusive")
    sent = client.create_producer(topic).send_many([(None, b"%d" % i) for i in range(5)])
    consumer = client.subscribe(
        topic, "s", initial_position="earliest", ack_group_time_ms=0, negative_ack_redelivery_delay_ms=50
    )
    first = receive(consumer, 5)
    consumer.acknowledge(first[0])
    consumer.negative_acknowledge(first[2])
    again = receive(consumer, 4)  # as Pulsar: order first, so everything unacknowledged comes again
    assert ids(again) == sent[1:]
    assert [m.redelivery_count() for m in again] == [1, 1, 1, 1]


def test_a_dead_letter_policy_needs_produce_on_the_dead_letter_topic(secure_server: SecureServer) -> None:
    s = secure_server
    base = "/admin/v2/persistent/dlq-t/ns"
    with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as admin:
        assert admin.put("/admin/v2/tenants/dlq-t", json={"adminRoles": []}).status_code == 204
        assert admin.put("/admin/v2/namespaces/dlq-t/ns").status_code == 204
        assert admin.put(f"{base}/jobs").status_code == 204
        assert admin.post(f"{base}/jobs/permissions/worker", json=["consume"]).status_code == 204
    consumers = "/topics/persistent/dlq-t/ns/jobs/subscription/w/consumers"
    body = {"subscriptionType": "Shared", "deadLetterPolicy": {"maxRedeliverCount": 3}}
    with httpx.Client(base_url=s.url, headers=s.headers("worker")) as worker:
        assert worker.put(f"{base}/jobs/subscription/w").status_code == 204
        refused = worker.post(consumers, json=body)
        assert refused.status_code == 403 and "produce" in refused.json()["reason"]
        assert worker.post(consumers, json={"subscriptionType": "Shared"}).status_code == 200
        with httpx.Client(base_url=s.url, headers=s.headers(SUPERUSER)) as admin:
            perms = "/admin/v2/namespaces/dlq-t/ns/permissions/worker"
            assert admin.post(perms, json=["produce"]).status_code == 204
        assert worker.post(consumers, json=body).status_code == 200
