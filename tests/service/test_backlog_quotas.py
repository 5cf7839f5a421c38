"""Backlog quotas in the service: Pulsar's JSON checked, the levels (topic over namespace over
the service's default), when a topic is over one, and what each policy does."""

from __future__ import annotations

import time

import pytest

from ledger.entry import Record
from service.backlog_quota_checks import BacklogQuotaMonitor, exceeded, producer_refusal
from service.backlog_quotas import (
    DESTINATION_STORAGE,
    MESSAGE_AGE,
    BacklogQuota,
    BacklogQuotaStore,
    parse,
    quota_type,
)
from service.clock import now_ms
from service.db import Database
from service.errors import InvalidInput, ProducerBlocked, ProducerHeld
from service.names import TopicName
from service.policies import Scope
from service.settings import Settings
from service.subscription_service import SubscriptionService
from service.topics import Broker

NAME = TopicName("t", "ns", "quota")


@pytest.mark.parametrize(
    "body",
    [
        {"limitSize": 10, "policy": "drop_everything"},
        {"limitSize": 10},
        {"limitSize": -5, "policy": "producer_exception"},
        {"limitTime": -2, "policy": "producer_exception"},
        {"limitSize": "10", "policy": "producer_exception"},
        {"limitSize": True, "policy": "producer_exception"},
        {"limitSize": 10, "policy": "producer_exception", "extra": 1},
        [10, "producer_exception"],
    ],
)
def test_a_bad_quota_is_refused_with_a_reason(body: object) -> None:
    with pytest.raises(InvalidInput) as e:
        parse(body)
    assert e.value.reason


def test_pulsars_json_is_taken_as_its_clients_send_it() -> None:
    # Go's pulsaradmin sends every field; Java's older field name ``limit`` is limitSize.
    assert parse({"limitSize": 100, "limitTime": -1, "policy": "producer_exception"}) == BacklogQuota(
        100, -1, "producer_exception"
    )
    assert parse({"limit": 7, "policy": "consumer_backlog_eviction"}).limit_size == 7
    assert parse({"limitTime": 60, "policy": "producer_request_hold"}) == BacklogQuota(
        -1, 60, "producer_request_hold"
    )
    assert quota_type(None) == DESTINATION_STORAGE and quota_type("message_age") == MESSAGE_AGE
    with pytest.raises(InvalidInput):
        quota_type("disk")


def test_topic_over_namespace_over_the_default(settings: Settings, db: Database) -> None:
    settings.backlog_quota_default_limit_bytes = 5000
    store = BacklogQuotaStore(db=db, settings=settings)
    default = store.effective(NAME)[DESTINATION_STORAGE]
    assert default == BacklogQuota(5000, -1, "producer_request_hold")
    store.set(Scope("t", "ns"), DESTINATION_STORAGE, BacklogQuota(100, -1, "producer_exception"))
    assert store.effective(NAME)[DESTINATION_STORAGE].limit_size == 100
    store.set(Scope.topic_of(NAME), DESTINATION_STORAGE, BacklogQuota(10, -1, "consumer_backlog_eviction"))
    assert store.effective(NAME)[DESTINATION_STORAGE].policy == "consumer_backlog_eviction"
    assert store.effective(NAME)[MESSAGE_AGE] == default  # a type not set anywhere: the default
    store.remove(Scope.topic_of(NAME), DESTINATION_STORAGE)
    assert store.effective(NAME)[DESTINATION_STORAGE].limit_size == 100
    # A partition takes its partitioned topic's quota over its namespace's.
    store.set(
        Scope.topic_of(TopicName("t", "ns", "parted")), MESSAGE_AGE, BacklogQuota(-1, 9, "producer_exception")
    )
    partition = TopicName("t", "ns", "parted-partition-1")
    assert store.effective(partition)[MESSAGE_AGE].limit_time == 9
    assert store.effective(partition)[DESTINATION_STORAGE].limit_size == 100
    assert store.get(Scope.topic_of(NAME)) == {}


@pytest.fixture
def subs(broker: Broker) -> SubscriptionService:
    broker.create_topic(NAME)
    svc = SubscriptionService(broker=broker)
    svc.start()
    return svc


def _fill(broker: Broker, n: int, size: int = 100) -> None:
    broker.produce(NAME, [Record(key=f"k{i}", value=b"x" * size) for i in range(n)])


def _quotas(kind: str, quota: BacklogQuota) -> dict[str, BacklogQuota]:
    none = BacklogQuota(-1, -1, "producer_request_hold")
    return {DESTINATION_STORAGE: none, MESSAGE_AGE: none, kind: quota}


def test_over_a_size_quota_producers_are_held_or_refused(broker: Broker, subs: SubscriptionService) -> None:
    subs.create(NAME, "slow", initial_position="earliest")
    _fill(broker, 10)
    topic = broker.topic(NAME)
    hold = _quotas(DESTINATION_STORAGE, BacklogQuota(500, -1, "producer_request_hold"))
    assert isinstance(producer_refusal(topic, hold, now_ms()), ProducerHeld)
    assert topic.quota_refusal is None  # REST producers: only the periodic check refuses them
    refuse = _quotas(DESTINATION_STORAGE, BacklogQuota(500, -1, "producer_exception"))
    assert isinstance(producer_refusal(topic, refuse, now_ms()), ProducerBlocked)
    # The subscription catches up: the topic is under its quota, producers are welcome.
    cid = subs.attach(NAME, "slow").consumer_id
    got = subs.receive(NAME, "slow", cid, max_messages=100)
    subs.ack(NAME, "slow", cid, [got[-1].entry.position], cumulative=True)
    assert producer_refusal(topic, refuse, now_ms()) is None
    broker.produce(NAME, [Record(key="k", value=b"v")])


def test_without_subscriptions_there_is_no_backlog(broker: Broker, subs: SubscriptionService) -> None:
    _fill(broker, 10)
    quotas = _quotas(DESTINATION_STORAGE, BacklogQuota(1, -1, "producer_exception"))
    assert exceeded(broker.topic(NAME), quotas, now_ms()) == []


def test_eviction_moves_the_slow_subscription_under_the_quota(
    broker: Broker, subs: SubscriptionService, settings: Settings, db: Database
) -> None:
    subs.create(NAME, "slow", initial_position="earliest")
    subs.create(NAME, "fast", initial_position="latest")
    _fill(broker, 20)
    store = BacklogQuotaStore(db=db, settings=settings)
    store.set(Scope("t", "ns"), DESTINATION_STORAGE, BacklogQuota(1000, -1, "consumer_backlog_eviction"))
    before = subs.get(NAME, "slow").mark_delete
    BacklogQuotaMonitor(broker=broker, quotas=store, interval_s=60).tick()
    slow = {s.name: s for s in subs.stats(NAME)}["slow"]
    assert 0 < slow.backlog_bytes <= 1000 and slow.backlog < 20
    assert subs.get(NAME, "slow").mark_delete > before
    # The newest messages are still there for it, in order, and nothing is refused.
    got = subs.receive(NAME, "slow", subs.attach(NAME, "slow").consumer_id, max_messages=100)
    assert [d.entry.key for d in got] == [f"k{i}" for i in range(20 - len(got), 20)]
    assert broker.topic(NAME).quota_refusal is None


def test_eviction_by_age_skips_the_messages_older_than_the_limit(
    broker: Broker, subs: SubscriptionService, settings: Settings, db: Database
) -> None:
    subs.create(NAME, "slow", initial_position="earliest")
    _fill(broker, 3)
    time.sleep(2.5)
    broker.produce(NAME, [Record(key="young", value=b"v")])
    store = BacklogQuotaStore(db=db, settings=settings)
    store.set(Scope.topic_of(NAME), MESSAGE_AGE, BacklogQuota(-1, 2, "consumer_backlog_eviction"))
    BacklogQuotaMonitor(broker=broker, quotas=store, interval_s=60).tick()
    got = subs.receive(NAME, "slow", subs.attach(NAME, "slow").consumer_id, max_messages=100)
    assert [d.entry.key for d in got] == ["young"]


def test_the_check_flags_a_topic_over_a_producer_quota_and_tells_the_listener(
    broker: Broker, subs: SubscriptionService, settings: Settings, db: Database
) -> None:
    subs.create(NAME, "slow", initial_position="earliest")
    _fill(broker, 10)
    store = BacklogQuotaStore(db=db, settings=settings)
    store.set(Scope("t", "ns"), DESTINATION_STORAGE, BacklogQuota(100, -1, "producer_exception"))
    monitor = BacklogQuotaMonitor(broker=broker, quotas=store, interval_s=60)
    told: list[TopicName] = []
    monitor.on_blocked.append(told.append)
    monitor.tick()
    assert told == [NAME]
    with pytest.raises(ProducerBlocked):
        broker.produce(NAME, [Record(key="k", value=b"v")])
    store.remove(Scope("t", "ns"), DESTINATION_STORAGE)
    monitor.tick()
    assert broker.topic(NAME).quota_refusal is None
    broker.produce(NAME, [Record(key="k", value=b"v")])
