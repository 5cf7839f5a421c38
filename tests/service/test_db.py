"""The metadata store's durability levels, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from sqlalchemy import inspect, text

from service.db import Database
from tests.conftest import local_wal_only


def _sync_level(db: Database, *, synced: bool) -> str:
    with db.session(synced=synced) as s:
        if db.engine.dialect.name == "sqlite":
            return {0: "off", 1: "normal", 2: "full", 3: "extra"}[
                s.execute(text("PRAGMA synchronous")).scalar_one()
            ]
        return str(s.execute(text("SHOW synchronous_commit")).scalar_one())


def test_metadata_commits_wait_for_the_disk_and_cursor_commits_do_not(db: Database) -> None:
    # Topics, ledgers and compactions are synced before a commit returns; acknowledgements
    # only reach the database (they survive the service, and at worst are delivered again).
    assert _sync_level(db, synced=True) in ("full", "on")
    assert _sync_level(db, synced=False) in ("normal", "off")
    # Both levels commit to the same store, visible at once to every session.
    with db.session(synced=False) as s:
        s.execute(text("UPDATE alembic_version SET version_num = version_num"))
    with db.session() as s:
        assert s.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1


@local_wal_only("downgrades to the first schema, which has no write-ahead chunks")
def test_subscriptions_made_with_a_read_compacted_flag_survive_its_removal(settings, db: Database) -> None:
    # Migration 0002 drops the subscription-level readCompacted (each consumer chooses now):
    # a subscription created with it keeps its position and acknowledgements.
    from alembic import command

    from ledger.entry import Record
    from migrations import alembic_config, upgrade
    from service.names import TopicName
    from service.subscription_service import SubscriptionService
    from service.topics import Broker

    name = TopicName("t", "ns", "migrated")
    broker = Broker(settings=settings, db=db)
    broker.start()
    broker.create_topic(name)
    ids = broker.produce(name, [Record(key=k, value=b"v") for k in "abc"])
    subs = SubscriptionService(broker=broker)
    subs.start()
    subs.create(name, "old", initial_position="earliest")
    cid = subs.attach(name, "old").consumer_id
    subs.receive(name, "old", cid, max_messages=1)
    subs.ack(name, "old", cid, [ids[0]], cumulative=True)
    broker.stop()

    command.downgrade(alembic_config(settings.database_url), "0001")
    with db.session() as s:
        s.execute(text("UPDATE cursors SET read_compacted = true WHERE name = 'old'"))
    upgrade(settings.database_url)
    with db.session() as s:
        columns = {c["name"] for c in inspect(s.connection()).get_columns("cursors")}
    assert "read_compacted" not in columns

    broker = Broker(settings=settings, db=db)
    broker.start()
    subs = SubscriptionService(broker=broker)
    subs.start()
    try:
        assert subs.get(name, "old").mark_delete == ids[0]
        cid = subs.attach(name, "old", read_compacted=True).consumer_id
        assert [d.entry.position for d in subs.receive(name, "old", cid, max_messages=10)] == ids[1:]
    finally:
        broker.stop()
