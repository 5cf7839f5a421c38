"""Durable subscriptions: delivery, acks, redelivery, seek, restart, and readCompacted consumers
whose compacted ledger is replaced under them."""

from __future__ import annotations

import random
import time

import pytest

from ledger.entry import Position, Record
from service.db import Database
from service.errors import Conflict, InvalidInput, NotFound
from service.names import TopicName
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.topics import Broker

NAME = TopicName("t", "ns", "events")


@pytest.fixture
def subs(broker: Broker) -> SubscriptionService:
    broker.settings.max_entries_per_ledger = 6
    broker.create_topic(NAME)
    svc = SubscriptionService(broker=broker)
    svc.start()
    return svc


def produce(broker: Broker, *pairs: tuple[str | None, bytes | None]) -> list[Position]:
    return broker.produce(NAME, [Record(key=k, value=v) for k, v in pairs])


def drain(subs: SubscriptionService, sub: str, cid: str, *, ack: bool = False, page: int = 4) -> list:
    out = []
    while True:
        got = subs.receive(NAME, sub, cid, max_messages=page)
        if not got:
            return out
        out.extend(got)
        if ack:
            subs.ack(NAME, sub, cid, [d.entry.position for d in got], cumulative=False)


def ids(delivered: list) -> list[Position]:
    return [d.entry.position for d in delivered]


def test_earliest_and_latest_initial_positions(broker: Broker, subs: SubscriptionService) -> None:
    first = produce(broker, ("a", b"1"), ("b", b"2"))
    subs.create(NAME, "from-start", initial_position="earliest")
    subs.create(NAME, "from-now", initial_position="latest")
    later = produce(broker, ("c", b"3"))
    c1 = subs.attach(NAME, "from-start").consumer_id
    c2 = subs.attach(NAME, "from-now").consumer_id
    assert ids(drain(subs, "from-start", c1)) == first + later
    assert ids(drain(subs, "from-now", c2)) == later


def test_individual_and_cumulative_acks_move_the_mark_delete_position(broker, subs) -> None:
    ids_ = produce(broker, *[(f"k{i}", b"v") for i in range(10)])
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s").consumer_id
    got = subs.receive(NAME, "s", cid, max_messages=10)
    assert ids(got) == ids_
    subs.ack(NAME, "s", cid, [ids_[1], ids_[2]], cumulative=False)
    st = subs.get(NAME, "s")
    assert st.mark_delete == Position(-1, -1) and st.acked == {ids_[1], ids_[2]}  # 0 is still unacked
    subs.ack(NAME, "s", cid, [ids_[0]], cumulative=False)
    assert st.mark_delete == ids_[2] and st.acked == set()
    subs.ack(NAME, "s", cid, [ids_[6]], cumulative=True)
    assert st.mark_delete == ids_[6]
    assert subs.backlog(st)[0] == 3


def test_redeliver_sends_unacked_again_in_order_and_never_acked(broker, subs) -> None:
    ids_ = produce(broker, *[(f"k{i}", b"v") for i in range(8)])
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s").consumer_id
    subs.receive(NAME, "s", cid, max_messages=8)
    subs.ack(NAME, "s", cid, [ids_[0], ids_[3], ids_[5]], cumulative=False)
    subs.redeliver(NAME, "s", cid)
    again = subs.receive(NAME, "s", cid, max_messages=100)
    assert ids(again) == [ids_[i] for i in (1, 2, 4, 6, 7)]
    assert all(d.redelivery_count == 1 for d in again)


def test_ack_timeout_redelivers(broker, subs) -> None:
    ids_ = produce(broker, ("a", b"1"), ("b", b"2"))
    subs.create(NAME, "s", initial_position="earliest")
    # Pulsar's smallest ack timeout (its client refuses less): room enough on a busy machine
    # between the receive and the check that nothing is due yet.
    cid = subs.attach(NAME, "s", ack_timeout_ms=1_000).consumer_id
    assert ids(subs.receive(NAME, "s", cid, max_messages=10)) == ids_
    subs.ack(NAME, "s", cid, [ids_[0]], cumulative=False)
    assert not subs.receive(NAME, "s", cid, max_messages=10)
    # A long poll wakes when the ack timeout makes the unacked message due again.
    t0 = time.monotonic()
    assert ids(subs.receive(NAME, "s", cid, max_messages=10, timeout_ms=10_000)) == [ids_[1]]
    assert time.monotonic() - t0 < 5


def test_restart_redelivers_unacked_and_keeps_acks(broker, subs, settings: Settings, db: Database) -> None:
    ids_ = produce(broker, *[(f"k{i}", b"v") for i in range(9)])
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s").consumer_id
    subs.receive(NAME, "s", cid, max_messages=9)
    subs.ack(NAME, "s", cid, [ids_[0], ids_[1], ids_[4], ids_[8]], cumulative=False)
    broker.stop()
    b2 = Broker(settings=settings, db=db)
    b2.start()
    s2 = SubscriptionService(broker=b2)
    s2.start()
    cid2 = s2.attach(NAME, "s").consumer_id
    got = drain(s2, "s", cid2)
    assert ids(got) == [ids_[i] for i in (2, 3, 5, 6, 7)]
    b2.stop()


@pytest.mark.parametrize("seed", range(6))
def test_random_deliveries_acks_and_redeliveries_match_a_model(broker, subs, seed: int) -> None:
    """Pages, individual and cumulative acks, redelivery and reattaching in random order (the
    ids cross ledgers): what is delivered, how often it was before, and what the cursor holds
    as consumed agree at every step with a model that keeps one flag per message."""
    rng = random.Random(seed)
    ids_ = produce(broker, *[(f"k{i}", b"v") for i in range(40)])
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s").consumer_id
    consumed: set[Position] = set()
    times: dict[Position, int] = dict.fromkeys(ids_, 0)  # deliveries so far
    unacked: list[Position] = []  # delivered since the last rewind, not consumed
    cursor = 0  # index of the next id to read

    def rewind() -> None:
        nonlocal cursor
        unacked.clear()
        cursor = 0

    for _ in range(120):
        op = rng.random()
        if op < 0.45:
            n = rng.randint(1, 9)
            got = subs.receive(NAME, "s", cid, max_messages=n)
            expected = [p for p in ids_[cursor:] if p not in consumed][:n]
            assert ids(got) == expected
            assert [d.redelivery_count for d in got] == [times[p] for p in expected]
            for p in expected:
                times[p] += 1
            unacked.extend(expected)
            if expected:
                cursor = ids_.index(expected[-1]) + 1
        elif op < 0.65 and unacked:
            picked = rng.sample(unacked, rng.randint(1, min(3, len(unacked))))
            subs.ack(NAME, "s", cid, picked, cumulative=False)
            consumed.update(picked)
            unacked[:] = [p for p in unacked if p not in consumed]
        elif op < 0.8 and unacked:
            upto = rng.choice(unacked)
            subs.ack(NAME, "s", cid, [upto], cumulative=True)
            consumed.update(p for p in ids_ if p <= upto)
            unacked[:] = [p for p in unacked if p not in consumed]
        elif op < 0.9:
            subs.redeliver(NAME, "s", cid)
            rewind()
        else:
            subs.detach(NAME, "s", cid)
            cid = subs.attach(NAME, "s").consumer_id
            rewind()
        st = subs.get(NAME, "s")
        # What is stored as consumed -- up to the mark-delete position, and individually
        # beyond it -- is exactly what the model consumed (the position itself may lag until
        # the reader passes acked ids: it cannot know there is no gap without reading).
        assert {p for p in ids_ if p <= st.mark_delete} | st.acked == consumed
        assert all(p > st.mark_delete for p in st.acked)
        assert len(st.pending) == len(unacked)
        # Acknowledging an id the subscription never delivered is refused and changes nothing.
        never = next((p for p in ids_ if times[p] == 0), None)
        if never is not None:
            with pytest.raises(InvalidInput):
                subs.ack(NAME, "s", cid, [never], cumulative=False)


def test_long_poll_returns_when_a_message_arrives(broker, subs) -> None:
    import threading

    subs.create(NAME, "s", initial_position="latest")
    cid = subs.attach(NAME, "s").consumer_id
    t = threading.Timer(0.2, lambda: produce(broker, ("late", b"x")))
    t.start()
    t0 = time.monotonic()
    got = subs.receive(NAME, "s", cid, max_messages=5, timeout_ms=5000)
    assert [d.entry.key for d in got] == ["late"] and time.monotonic() - t0 < 4
    assert not subs.receive(NAME, "s", cid, max_messages=5, timeout_ms=50)


def test_seek_by_id_and_by_publish_time(broker, subs) -> None:
    early = produce(broker, *[(f"e{i}", b"v") for i in range(7)])
    time.sleep(0.02)
    cut = int(time.time() * 1000)
    time.sleep(0.02)
    late = produce(broker, *[(f"l{i}", b"v") for i in range(5)])
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s").consumer_id
    drain(subs, "s", cid, ack=True)
    subs.seek(NAME, "s", message_id=str(early[3]), consumer_id=cid)
    assert ids(drain(subs, "s", cid)) == early[3:] + late
    subs.seek(NAME, "s", publish_time=cut)
    assert ids(drain(subs, "s", cid)) == late
    subs.seek(NAME, "s", message_id="earliest")
    assert ids(drain(subs, "s", cid)) == early + late


def test_bad_input_is_refused_and_changes_no_cursor(broker, subs) -> None:
    ids_ = produce(broker, ("a", b"1"), ("b", b"2"), ("c", b"3"))
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s", read_compacted=True).consumer_id
    subs.receive(NAME, "s", cid, max_messages=1)
    st = subs.get(NAME, "s")
    before = (st.mark_delete, set(st.acked), st.read_pos)
    with pytest.raises(NotFound):
        subs.receive(NAME, "nope", cid)
    with pytest.raises(InvalidInput):
        subs.ack(NAME, "s", cid, [ids_[2]], cumulative=False)  # never delivered
    with pytest.raises(InvalidInput):
        subs.ack(NAME, "s", cid, [ids_[0], Position(999, 0)], cumulative=True)
    with pytest.raises(InvalidInput):
        subs.receive(NAME, "s", cid, max_messages=-1)
    with pytest.raises(InvalidInput):
        subs.receive(NAME, "s", cid, timeout_ms=-5)
    with pytest.raises(Conflict):  # exclusive: a second concurrent consumer is refused
        subs.attach(NAME, "s")
    with pytest.raises(Conflict):
        subs.create(NAME, "s")
    with pytest.raises(Conflict):
        subs.create(NAME, "__compaction")
    with pytest.raises(Conflict):
        subs.delete(NAME, "__compaction")
    with pytest.raises(NotFound):
        subs.ack(NAME, "s", "not-a-consumer", [ids_[0]], cumulative=False)
    assert (st.mark_delete, st.acked, st.read_pos) == before


# ---------------------------------------------------------------- readCompacted consumers


@pytest.mark.spark
def test_read_compacted_subscription_sees_latest_per_key_then_new_messages(broker, subs, compaction) -> None:
    log = [("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("b", None), ("c", b"2")]
    ids_ = produce(broker, *log)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    after = produce(broker, ("d", b"1"), ("a", None))
    subs.create(NAME, "compacted", initial_position="earliest")
    subs.create(NAME, "full", initial_position="earliest")
    c1 = subs.attach(NAME, "compacted", read_compacted=True).consumer_id
    c2 = subs.attach(NAME, "full", read_compacted=False).consumer_id
    assert ids(drain(subs, "compacted", c1)) == [ids_[2], ids_[5], *after]
    assert ids(drain(subs, "full", c2)) == ids_ + after


@pytest.mark.spark
def test_read_compacted_is_the_consumers_and_the_position_is_the_subscriptions(
    broker, subs, compaction
) -> None:
    ids_ = produce(broker, ("a", b"1"), ("b", b"1"), ("a", b"2"), ("b", b"2"), ("a", b""))
    assert compaction.compact_now(NAME).status == "SUCCESS"
    subs.create(NAME, "s", initial_position="earliest")
    compacted = subs.attach(NAME, "s", read_compacted=True).consumer_id
    # "a" ends with an empty value: deleted; "b" keeps its latest.
    assert ids(drain(subs, "s", compacted)) == [ids_[3]]
    subs.detach(NAME, "s", compacted)
    # Nothing acknowledged: a consumer of the whole log gets the whole backlog...
    full = subs.attach(NAME, "s", read_compacted=False).consumer_id
    got = drain(subs, "s", full, page=2)
    assert ids(got) == ids_
    subs.ack(NAME, "s", full, [ids_[1]], cumulative=True)
    subs.detach(NAME, "s", full)
    # ...and the position both share moves for both: the compacted view after 1:1.
    again = subs.attach(NAME, "s", read_compacted=True).consumer_id
    assert ids(drain(subs, "s", again)) == [ids_[3]]
    # Seek, redelivery and ack timeouts follow the consumer's view.
    subs.seek(NAME, "s", message_id="earliest", consumer_id=again)
    assert ids(drain(subs, "s", again)) == [ids_[3]]
    subs.redeliver(NAME, "s", again)
    assert ids(drain(subs, "s", again)) == [ids_[3]]
    subs.detach(NAME, "s", again)
    full = subs.attach(NAME, "s", read_compacted=False).consumer_id
    subs.seek(NAME, "s", message_id="earliest", consumer_id=full)
    assert ids(drain(subs, "s", full)) == ids_
    stats = {st.name: st for st in subs.stats(NAME)}
    assert [c.read_compacted for c in stats["s"].consumers] == [False]


@pytest.mark.spark
def test_consumer_in_the_middle_of_the_compacted_range_survives_a_new_compaction(
    broker, subs, compaction
) -> None:
    rng = random.Random(4)
    keys = [f"k{i}" for i in range(40)]
    model: dict[str, bytes] = {}

    def write(n: int) -> None:
        pairs = []
        for _ in range(n):
            k = rng.choice(keys)
            v = None if rng.random() < 0.1 else rng.randbytes(4)
            pairs.append((k, v))
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        produce(broker, *pairs)

    write(120)
    compaction.compact_now(NAME)
    subs.create(NAME, "s", initial_position="earliest")
    cid = subs.attach(NAME, "s", read_compacted=True).consumer_id
    state: dict[str, bytes] = {}

    def apply(got: list) -> None:
        for d in got:
            if d.entry.value is None:
                state.pop(d.entry.key, None)
            else:
                state[d.entry.key] = d.entry.value
        if got:
            subs.ack(NAME, "s", cid, [got[-1].entry.position], cumulative=True)

    apply(subs.receive(NAME, "s", cid, max_messages=10))  # in the middle of the compacted range
    assert subs.get(NAME, "s").read_pos <= broker.topic(NAME).view.horizon
    old_ledger = broker.topic(NAME).view.ledger_id
    write(150)
    compaction.compact_now(NAME)
    assert broker.topic(NAME).view.ledger_id != old_ledger
    apply(drain(subs, "s", cid, page=7))
    # No gap: every live key has its latest value. A key the consumer saw before it was deleted
    # may linger, since compaction drops tombstones (Kafka's delete.retention.ms addresses that).
    assert {k: state.get(k) for k in model} == model
