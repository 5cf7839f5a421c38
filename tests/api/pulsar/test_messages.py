"""A message of the topic as the wire carries it: batch members read from a producer's batch,
and written back in a consumer's batch, field for field."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.messages import batch_message, entry_id_data, id_data, partition_index, to_records
from ledger.batch_encoder import single_metadata
from ledger.entry import Entry, Position
from service.names import TopicName

_SIZE = struct.Struct(">I")
u63 = st.integers(min_value=0, max_value=2**63 - 1)

members = st.builds(
    Entry,
    ledger_id=st.just(7),
    entry_id=st.just(0),
    key=st.none() | st.text(max_size=20),
    value=st.none() | st.binary(max_size=300),
    properties=st.dictionaries(st.text(max_size=8), st.text(max_size=200), max_size=3),
    publish_time=st.just(1_700_000_000_000),
    event_time=st.none() | u63,
    batch_index=st.just(0),
    batch_size=st.just(1),
    producer_name=st.just("p"),
    sequence_id=st.none() | u63,
    deliver_at_time=st.none(),
    ordering_key=st.none() | st.binary(max_size=10),
    schema_version=st.none(),
)


def reference(e: Entry) -> bytes:
    """What protobuf itself writes for the member (the hand encoder must match it)."""
    single = pb.SingleMessageMetadata(payload_size=len(e.value or b""))
    if e.sequence_id is not None:
        single.sequence_id = e.sequence_id
    if e.key is not None:
        single.partition_key = e.key
    if e.ordering_key is not None:
        single.ordering_key = e.ordering_key
    single.properties.extend(pb.KeyValue(key=k, value=v) for k, v in e.properties.items())
    if e.event_time:
        single.event_time = e.event_time
    if e.value is None:
        single.null_value = True
    return single.SerializeToString()


@settings(max_examples=300, deadline=None)
@given(members)
def test_a_members_metadata_is_the_bytes_protobuf_writes(e: Entry) -> None:
    assert single_metadata(e) == reference(e)


@settings(max_examples=100, deadline=None)
@given(st.lists(members, min_size=1, max_size=6))
def test_a_batch_sent_to_a_consumer_reads_back_as_the_members_stored(batch: list[Entry]) -> None:
    n = len(batch)
    stored = [
        e._replace(entry_id=10 + i, batch_index=i, batch_size=n, sequence_id=100 + i)
        for i, e in enumerate(batch)
    ]
    _, metadata, payload, ack_set = batch_message(stored)
    assert ack_set == []
    md = pb.MessageMetadata.FromString(metadata)
    records = to_records(md, payload, 10 * 1024 * 1024)
    assert [(r.key, r.value, r.properties, r.event_time, r.ordering_key, r.sequence_id) for r in records] == [
        (e.key, e.value, e.properties, e.event_time or None, e.ordering_key, e.sequence_id) for e in stored
    ]


def test_the_ids_of_a_partitions_messages_name_its_index_as_pulsars_broker_does() -> None:
    """Pulsar's rule (``TopicName.getPartitionIndex``): ``x-partition-i`` is partition ``i``;
    any other name, a zero-padded index included, is no partition (-1)."""
    assert partition_index(TopicName.parse("persistent://t/n/orders-partition-3")) == 3
    assert partition_index(TopicName.parse("persistent://t/n/a-partition-1-partition-12")) == 12
    for plain in ("orders", "orders-partition-03", "orders-partition-", "orders-partition-x"):
        assert partition_index(TopicName.parse(f"persistent://t/n/{plain}")) == -1
    member = Entry(
        ledger_id=7,
        entry_id=11,
        key="k",
        value=b"v",
        properties={},
        publish_time=1,
        event_time=None,
        batch_index=1,  # the second member of the batch stored from entry 10
        batch_size=2,
        producer_name="p",
        sequence_id=5,
    )
    stored = [member._replace(entry_id=10, batch_index=0), member]
    for mid in (
        id_data(Position(7, 3), 4),
        entry_id_data(member, 4),
        entry_id_data(member._replace(batch_index=None, batch_size=None), 4),
        batch_message(stored, 4)[0],
    ):
        assert (mid.ledgerId, mid.partition) == (7, 4)
    assert (entry_id_data(member, 4).entryId, entry_id_data(member, 4).batch_index) == (10, 1)
    # Unless told, an id names no partition (as for every topic that is not a partition).
    assert batch_message(stored)[0].partition == entry_id_data(member).partition == -1
