"""Rounds on object storage read the local copies of the ledgers this instance sealed (Spark
in local mode), never trusting a damaged one. Object storage only: a local disk has no copies."""

from __future__ import annotations

import pytest

from ledger import paths
from ledger.compacted_store import Manifest
from ledger.entry import Record
from ledger.storage import Storage, StoragePath
from service.compaction import CompactionService
from service.names import TopicName
from service.settings import Settings
from service.topics import Broker
from tests.ledger.test_checksums import flip_value_page

pytestmark = pytest.mark.spark

NAME = TopicName("t", "ns", "copies")


@pytest.fixture
def settings(settings: Settings, storage: Storage) -> Settings:
    if storage.local:
        pytest.skip("local copies are of objects: object storage only")
    settings.storage_url = storage.url
    assert storage.s3 is not None
    settings.s3_endpoint_url = storage.s3.endpoint_url or ""
    settings.s3_region = storage.s3.region or ""
    settings.max_entries_per_ledger = 7
    return settings


def produce(broker: Broker, first: int, n: int) -> dict[str, bytes]:
    records = [Record(key=f"k{i}", value=f"v{i}".encode()) for i in range(first, first + n)]
    broker.produce(NAME, records)
    return {r.key: r.value for r in records if r.key is not None and r.value is not None}


def compacted(broker: Broker) -> dict[str | None, bytes | None]:
    out: dict[str | None, bytes | None] = {}
    start = "earliest"
    while True:
        page, nxt = broker.read(NAME, start, 100, read_compacted=True)
        if not page:
            return out
        out.update((e.key, e.value) for e in page)
        start = str(nxt)


def sealed_objects(broker: Broker) -> list:
    ledger = broker.topic(NAME).ledger
    return [
        paths.sealed_path(ledger.store, i.ledger_id, i.sealed_epoch)
        for i in ledger.ledgers()
        if i.state == "CLOSED"
    ]


def test_a_round_reads_the_copies_not_the_bucket(broker: Broker, compaction: CompactionService) -> None:
    broker.create_topic(NAME)
    model = produce(broker, 0, 20)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    copies = broker.resources.copies
    assert copies is not None and copies.total_bytes > 0
    read_before = {str(p) for p in sealed_objects(broker)}
    model |= produce(broker, 100, 20)
    broker.topic(NAME).ledger.roll_over()
    new = [p for p in sealed_objects(broker) if str(p) not in read_before]
    assert len(new) >= 3
    # The new ledgers' objects gone from the bucket (but the last one's: a compacted read
    # looks past the horizon there): a round that read them would fail.
    for path in new[:-1]:
        lease = copies.lease(path)
        assert lease is not None, f"{path} has no local copy"
        copies.release(lease)
        path.unlink()
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert compacted(broker) == model


def test_a_damaged_copy_is_dropped_and_the_next_round_reads_the_object(
    broker: Broker, compaction: CompactionService
) -> None:
    broker.create_topic(NAME)
    model = produce(broker, 0, 14)
    broker.topic(NAME).ledger.roll_over()
    copies = broker.resources.copies
    assert copies is not None
    first = sealed_objects(broker)[0]
    lease = copies.lease(first)
    assert lease is not None and lease.local is not None
    flip_value_page(lease.local, 0)
    copies.release(lease)

    failed = compaction.compact_now(NAME)
    assert failed.status == "ERROR"
    assert "local copy" in (failed.last_error or ""), failed.last_error
    # Only the copy was damaged: the ledger is not, and its object serves the next round.
    assert all(i.damage is None for i in broker.topic(NAME).ledger.ledgers())
    assert copies.lease(first) is None
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert compacted(broker) == model


def key_indexes(broker: Broker) -> list[StoragePath]:
    """The key indexes of the older layers of the topic's compacted ledger (objects): the ones
    the next delta round probes, and the last round verified (all but its own layer's)."""
    view = broker.topic(NAME).view
    assert view is not None
    manifest = Manifest.load(view.directory, checksum=view.checksum)
    root = view.directory.parent
    return [
        root / layer.dir / part.keys
        for layer in manifest.layers
        if layer.dir != view.directory.name
        for part in layer.parts
        if part.keys
    ]


def test_a_delta_round_reads_the_older_layers_key_indexes_from_verified_copies(
    broker: Broker, compaction: CompactionService
) -> None:
    broker.create_topic(NAME)
    model = produce(broker, 0, 20)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    model |= produce(broker, 5, 10)
    assert compaction.compact_now(NAME).status == "SUCCESS"  # a delta: it verified the base's files
    copies = broker.resources.copies
    assert copies is not None
    older = key_indexes(broker)
    assert older
    for path in older:
        lease = copies.lease(path)
        assert lease is not None, f"{path} has no local copy"
        assert lease.local is not None and lease.local.read_bytes() == path.read_bytes()
        copies.release(lease)
    # A damaged copy is dropped and its object, intact, verified and copied again.
    damaged = copies.lease(older[0])
    assert damaged is not None and damaged.local is not None
    damaged.local.write_bytes(b"\0" + damaged.local.read_bytes()[1:])
    copies.release(damaged)
    model |= produce(broker, 10, 10)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert compacted(broker) == model
    again = copies.lease(older[0])
    assert again is not None and again.local is not None
    assert again.local.read_bytes() == older[0].read_bytes()
    copies.release(again)
    # With every older key index copied, the next delta round needs none of their objects.
    for path in key_indexes(broker):
        lease = copies.lease(path)
        if lease is not None:
            copies.release(lease)
            path.unlink()
    model |= produce(broker, 15, 10)
    assert compaction.compact_now(NAME).status == "SUCCESS"
    assert compacted(broker) == model
