"""readCompacted consumers against a real server, through the client, compared with a model."""

from __future__ import annotations

import random
import time

import pytest

from api.client import Client, Consumer, Message

pytestmark = [pytest.mark.e2e, pytest.mark.spark]


class Model:
    """The log as produced, and what compaction must leave of it."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, bytes | None]] = []  # (message id, key, value)

    def latest(self) -> dict[str, bytes]:
        state: dict[str, bytes] = {}
        for _, k, v in self.log:
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
        return state


def produce(client: Client, topic: str, model: Model, rng: random.Random, n: int, keys: int) -> None:
    pairs = [(f"k{rng.randrange(keys)}", None if rng.random() < 0.1 else rng.randbytes(6)) for _ in range(n)]
    ids = client.create_producer(topic).send_many(pairs)
    model.log.extend((str(i), k, v) for i, (k, v) in zip(ids, pairs, strict=True))


def compact(client: Client, topic: str) -> None:
    client.admin.topics.compact(topic)
    assert client.admin.topics.wait_for_compaction(topic, timeout=180).status == "SUCCESS"


def drain(consumer: Consumer, limit: int | None = None) -> list[Message]:
    out: list[Message] = []
    while limit is None or len(out) < limit:
        batch = consumer.batch_receive(
            max_messages=min(50, limit - len(out)) if limit else 50, timeout_millis=300
        )
        if not batch:
            break
        out.extend(batch)
        consumer.acknowledge_cumulative(batch[-1])
    return out


def apply(state: dict[str, bytes], messages: list[Message]) -> None:
    for m in messages:
        if m.value() is None:
            state.pop(m.key(), None)
        else:
            state[m.key()] = m.value()


def test_compacted_and_full_subscriptions_match_the_model(shared_server) -> None:
    rng = random.Random(11)
    model = Model()
    with Client(shared_server.url) as client:
        topic = "persistent://e2e/consumers/model"
        client.admin.topics.create(topic)
        produce(client, topic, model, rng, 400, 60)
        compact(client, topic)
        horizon = client.admin.topics.internal_stats(topic)["horizon"]
        produce(client, topic, model, rng, 50, 60)

        compacted = client.subscribe(topic, "compacted", read_compacted=True, initial_position="earliest")
        full = client.subscribe(topic, "full", read_compacted=False, initial_position="earliest")
        got = drain(compacted)
        # The latest value of every live key as of the horizon, in id order, then everything after it.
        before = [m for m in got if _le(str(m.message_id()), horizon)]
        after = [
            (str(m.message_id()), m.key(), m.value()) for m in got if not _le(str(m.message_id()), horizon)
        ]
        state_at_horizon = Model()
        state_at_horizon.log = [r for r in model.log if _le(r[0], horizon)]
        assert {m.key(): m.value() for m in before} == state_at_horizon.latest()
        assert len({m.key() for m in before}) == len(before)
        assert [str(m.message_id()) for m in before] == sorted(
            (str(m.message_id()) for m in before), key=_key
        )
        assert after == [r for r in model.log if not _le(r[0], horizon)]
        assert [(str(m.message_id()), m.key(), m.value()) for m in drain(full)] == model.log


def test_consumer_in_the_compacted_range_survives_a_new_compaction(shared_server) -> None:
    rng = random.Random(5)
    model = Model()
    with Client(shared_server.url) as client:
        topic = "persistent://e2e/consumers/replaced"
        client.admin.topics.create(topic)
        produce(client, topic, model, rng, 300, 50)
        compact(client, topic)
        consumer = client.subscribe(topic, "mid", read_compacted=True, initial_position="earliest")
        state: dict[str, bytes] = {}
        apply(state, drain(consumer, limit=15))  # in the middle of the compacted range
        old = client.admin.topics.internal_stats(topic)["compactedLedger"]["ledgerId"]
        produce(client, topic, model, rng, 300, 50)
        compact(client, topic)
        assert client.admin.topics.internal_stats(topic)["compactedLedger"]["ledgerId"] != old
        apply(state, drain(consumer))
        truth = model.latest()
        assert {k: state.get(k) for k in truth} == truth  # no gap: no live key missed


def test_seek_by_id_and_by_time_on_compacted_and_full_subscriptions(shared_server) -> None:
    with Client(shared_server.url) as client:
        topic = "persistent://e2e/consumers/seek"
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        early = producer.send_many([(f"k{i}", b"early") for i in range(6)])
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        late = producer.send_many([("k0", b"late"), ("k9", b"late")])
        compact(client, topic)
        full = client.subscribe(topic, "f", initial_position="earliest")
        comp = client.subscribe(topic, "c", read_compacted=True, initial_position="earliest")
        assert len(drain(full)) == 8 and len(drain(comp)) == 7
        full.seek(early[3])
        assert [m.message_id() for m in drain(full)] == early[3:] + late
        comp.seek(early[3])  # compacted: from the first compacted record at or after the id
        assert [(m.key(), m.value()) for m in drain(comp)] == [
            ("k3", b"early"),
            ("k4", b"early"),
            ("k5", b"early"),
            ("k0", b"late"),
            ("k9", b"late"),
        ]
        full.seek(cut)
        assert [m.message_id() for m in drain(full)] == late
        comp.seek(cut)
        assert [(m.key(), m.value()) for m in drain(comp)] == [("k0", b"late"), ("k9", b"late")]


def _key(message_id: str) -> tuple[int, int]:
    ledger, entry = message_id.split(":")
    return int(ledger), int(entry)


def _le(a: str, b: str) -> bool:
    return _key(a) <= _key(b)
