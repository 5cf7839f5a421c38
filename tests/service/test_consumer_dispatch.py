"""Which consumer gets messages: priority levels of a Shared subscription, the active consumer of a
Failover subscription (and the notifications of its changes), and receives woken at once when
messages are given back."""

from __future__ import annotations

import threading
import time

import pytest

from ledger.entry import Record
from service.failover import active_index
from service.names import TopicName
from service.subscription_service import SubscriptionService
from service.topics import Broker

NAME = TopicName("t", "ns", "dispatch")


@pytest.fixture
def subs(broker: Broker) -> SubscriptionService:
    broker.create_topic(NAME)
    svc = SubscriptionService(broker=broker)
    svc.start()
    return svc


def produce(broker: Broker, n: int, topic: TopicName = NAME) -> None:
    broker.produce(topic, [Record(key=None, value=f"m{i}".encode()) for i in range(n)])


# Choices of Pulsar 4.0.7's broker, read from ACTIVE_CONSUMER_CHANGE with three Failover
# consumers named alpha, beta and gamma (priority 0) on these topics of public/default.
PULSAR_CHOSE = {
    "ring-check-0": "beta",
    "ring-check-1": "beta",
    "ring-check-2": "alpha",
    "ring-check-3": "beta",
    "ring-check-4": "gamma",
    "ring-check-5": "gamma",
    "ring-check-x-partition-4": "beta",
}


@pytest.mark.parametrize("topic", sorted(PULSAR_CHOSE))
def test_failover_chooses_the_active_consumer_that_pulsar_chooses(topic: str) -> None:
    names = ["alpha", "beta", "gamma"]
    partition = 4 if topic.endswith("-partition-4") else -1
    chosen = active_index(f"persistent://public/default/{topic}", partition, [0, 0, 0], names)
    assert names[chosen] == PULSAR_CHOSE[topic]


def test_only_the_highest_priority_level_is_a_candidate() -> None:
    # Partition 3 of three candidates would be the first; of the two at level 0, the second.
    assert active_index("persistent://t/n/x-partition-3", 3, [0, 0, 1], ["a", "b", "c"]) == 1
    for topic in ("persistent://t/n/one", "persistent://t/n/two", "persistent://t/n/three"):
        assert active_index(topic, -1, [-1, 0, 0], ["z", "a", "b"]) == 0


def test_failover_tells_each_consumer_when_it_becomes_or_stops_being_the_active_one(
    broker: Broker, subs: SubscriptionService
) -> None:
    subs.create(NAME, "f")
    told: list[tuple[str, bool]] = []

    def attach(name: str, level: int) -> str:
        return subs.attach(
            NAME,
            "f",
            consumer_name=name,
            subscription_type="Failover",
            priority_level=level,
            on_active_change=lambda active: told.append((name, active)),
        ).consumer_id

    low = attach("low", 1)
    assert told == [("low", True)]
    told.clear()
    # The hash ring of this topic keeps "low" active beside "c3": only the newcomer hears.
    attach("c3", 1)
    assert told == [("c3", False)]
    told.clear()
    high = attach("high", 0)  # a higher level takes over: everyone hears
    assert sorted(told) == [("c3", False), ("high", True), ("low", False)]
    produce(broker, 2)
    assert len(subs.receive(NAME, "f", high, max_messages=10)) == 2
    assert not subs.receive(NAME, "f", low, max_messages=10)
    told.clear()
    subs.detach(NAME, "f", high)  # the active one leaves: the next takes over, with what it held
    assert ("high", False) not in told and any(active for _, active in told)
    active = [name for name, is_active in told if is_active]
    assert active == ["low"]


def test_a_shared_subscription_gives_messages_to_the_highest_level_that_has_permits(
    broker: Broker, subs: SubscriptionService
) -> None:
    subs.create(NAME, "s")
    permits = {"high": 0, "low": 0}

    def attach(name: str, level: int) -> str:
        return subs.attach(
            NAME,
            "s",
            consumer_name=name,
            subscription_type="Shared",
            priority_level=level,
            permits_of=lambda: permits[name],
        ).consumer_id

    high, low = attach("high", 0), attach("low", 1)
    produce(broker, 6)
    permits.update(high=10, low=10)
    assert not subs.receive(NAME, "s", low, max_messages=10)  # the higher level can take them
    assert len(subs.receive(NAME, "s", high, max_messages=3)) == 3
    permits["high"] = 0  # its client has no room left: the lower level gets the rest
    assert len(subs.receive(NAME, "s", low, max_messages=10)) == 3


def test_priority_levels_do_not_hold_back_a_key_shared_consumer(
    broker: Broker, subs: SubscriptionService
) -> None:
    subs.create(NAME, "k")
    ids = [
        subs.attach(
            NAME,
            "k",
            consumer_name=n,
            subscription_type="Key_Shared",
            priority_level=level,
            permits_of=lambda: 100,
        ).consumer_id
        for n, level in (("high", 0), ("low", 1))
    ]
    broker.produce(NAME, [Record(key=f"k{i}", value=b"v") for i in range(40)])
    got = [len(subs.receive(NAME, "k", cid, max_messages=100)) for cid in ids]
    assert sum(got) == 40 and all(got)  # each key goes to the consumer whose range holds it


def test_a_waiting_receive_ends_when_messages_are_given_back(
    broker: Broker, subs: SubscriptionService
) -> None:
    subs.create(NAME, "x")
    cid = subs.attach(NAME, "x", subscription_type="Exclusive").consumer_id
    produce(broker, 1)
    assert len(subs.receive(NAME, "x", cid, max_messages=10)) == 1
    got: list[int] = []
    waiting = threading.Thread(
        target=lambda: got.append(len(subs.receive(NAME, "x", cid, max_messages=10, timeout_ms=20_000)))
    )
    waiting.start()
    time.sleep(0.2)  # let it wait first
    subs.redeliver(NAME, "x", cid)
    waiting.join(10)  # far below the receive's 20 s: the redelivery ended its wait, no append did
    assert not waiting.is_alive() and got == [1]
