"""The metadata store: engine and sessions. The schema comes from ``migrations.upgrade``, which the
top layer calls before it opens a ``Database``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, *, synced: bool = True) -> Engine:
    """An engine for ``url``; SQLite gets WAL journaling, foreign keys and a busy timeout
    so the API threads, the scheduler and the compaction workers can share the file.
    ``synced``: each SQLite commit is synced to disk before it returns (else at the next synced
    commit or checkpoint; see ``Database.session``)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        synchronous = "FULL" if synced else "NORMAL"

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


class Database:
    """The engine and session factory of one service instance."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._unsynced_engine = (
            make_engine(url, synced=False) if self.engine.dialect.name == "sqlite" else None
        )
        self._unsynced = (
            sessionmaker(self._unsynced_engine, expire_on_commit=False) if self._unsynced_engine else None
        )

    @contextmanager
    def session(self, *, synced: bool = True) -> Iterator[Session]:
        """A session in a transaction: committed when the block ends, rolled back on error.

        ``synced=False`` is for writes that may be lost with the machine (not with this
        process) and are then redone, such as a cursor's acknowledgements (at worst some
        messages are delivered again): the commit returns once the database has it, without
        waiting for the disk (SQLite ``synchronous=NORMAL`` in WAL mode; PostgreSQL
        ``synchronous_commit=off``). It reaches the disk with the next synced commit or
        checkpoint, or within a fraction of a second."""
        if synced or self._unsynced is None:
            with self._sessions.begin() as s:
                if not synced and self.engine.dialect.name == "postgresql":
                    s.execute(text("SET LOCAL synchronous_commit TO OFF"))
                yield s
            return
        with self._unsynced.begin() as s:
            yield s

    def dispose(self) -> None:
        self.engine.dispose()
        if self._unsynced_engine is not None:
            self._unsynced_engine.dispose()
