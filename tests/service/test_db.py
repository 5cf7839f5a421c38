"""The metadata store's durability levels, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from sqlalchemy import text

from service.db import Database


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
