"""``service.publishers``: the producers a topic's stats list, and the client facts they show."""

from __future__ import annotations

from datetime import UTC, datetime

from api.pulsar import pulsar_api_pb2 as pb
from service.names import TopicName
from service.publishers import (
    MAX_METADATA_ENTRIES,
    MAX_METADATA_TEXT,
    ClientInfo,
    Publisher,
    Publishers,
    address_of,
    bounded_metadata,
    now_iso,
)

TOPIC = TopicName.parse("persistent://public/default/t")


def test_producers_are_listed_in_attach_order_until_they_go() -> None:
    reg = Publishers()
    a, b = object(), object()
    reg.add(TOPIC, a, Publisher(1, "a", "Shared", ClientInfo()))
    reg.add(TOPIC, b, Publisher(2, "b", "Shared", ClientInfo()))
    assert [p.name for p in reg.of(TOPIC)] == ["a", "b"]
    reg.remove(TOPIC, a)
    reg.remove(TOPIC, a)  # twice (a fence, then the connection's loss): no error
    assert [p.name for p in reg.of(TOPIC)] == ["b"]
    reg.remove(TOPIC, b)
    assert reg.of(TOPIC) == [] and reg._topics == {}  # nothing kept for a topic without producers


def test_a_clients_metadata_is_kept_bounded() -> None:
    pairs = [
        pb.KeyValue(key=f"k{i}", value="v" * (MAX_METADATA_TEXT + 10))
        for i in range(MAX_METADATA_ENTRIES + 5)
    ]
    kept = bounded_metadata(pairs)
    assert len(kept) == MAX_METADATA_ENTRIES
    assert all(len(v) == MAX_METADATA_TEXT for v in kept.values())
    assert bounded_metadata([pb.KeyValue(key="app", value="billing")]) == {"app": "billing"}


def test_addresses_and_times_are_written_as_pulsar_writes_them() -> None:
    assert address_of("127.0.0.1", 6650) == "/127.0.0.1:6650"
    assert address_of(None, None) == ""
    text = now_iso()
    assert text.endswith("Z")
    assert abs((datetime.fromisoformat(text.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()) < 5
