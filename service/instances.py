"""The service instances sharing one metadata database: who is alive, and where clients reach it.

Each process registers a row of its own at start (its advertised URL, ``COMPACTOR_ADVERTISED_URL``)
and beats a heartbeat with every lease renewal; an instance whose heartbeat is older than a lease
is not alive. Times are the database's clock (:func:`db_now_ms`), so the instances' own clocks
need not agree.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from service import models
from service.clock import now_ms
from service.db import Database

_PG_NOW = text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")


def db_now_ms(session: Session) -> int:
    """Milliseconds since the epoch on the database's clock (one clock for every instance)."""
    if session.get_bind().dialect.name == "postgresql":
        return int(session.scalar(_PG_NOW) or 0)
    return now_ms()  # SQLite: one process on one machine


class InstanceRegistry:
    """This instance's row in ``instances`` and the view of the others."""

    def __init__(self, *, db: Database, url: str, lease_ms: int, broker_url: str | None = None) -> None:
        self.db = db
        self.url = url
        self.broker_url = broker_url
        self.lease_ms = lease_ms
        self._id: int | None = None

    @property
    def id(self) -> int:
        if self._id is None:
            raise RuntimeError("the instance is not registered")
        return self._id

    def register(self) -> int:
        """Add this process's row (and drop the rows of instances long gone: every start adds one)."""
        with self.db.session() as s:
            now = db_now_ms(s)
            self.forget_dead(s, now)
            row = models.Instance(url=self.url, started_at=now, heartbeat_at=now, broker_url=self.broker_url)
            s.add(row)
            s.flush()
            self._id = row.id
        return self._id

    def deregister(self) -> None:
        if self._id is None:
            return
        with self.db.session() as s:
            s.execute(delete(models.Instance).where(models.Instance.id == self._id))

    def heartbeat(self, session: Session, now: int) -> None:
        session.execute(update(models.Instance).where(models.Instance.id == self.id).values(heartbeat_at=now))

    def live(self, session: Session, now: int) -> dict[int, str]:
        """The instances alive now, by id: their advertised URLs."""
        rows = session.execute(
            select(models.Instance.id, models.Instance.url).where(
                models.Instance.heartbeat_at >= now - self.lease_ms
            )
        ).all()
        return {int(i): str(u) for i, u in rows}

    def url_of(self, session: Session, instance_id: int) -> str | None:
        return session.scalar(select(models.Instance.url).where(models.Instance.id == instance_id))

    def urls_of(self, session: Session, instance_id: int) -> tuple[str | None, str | None]:
        """The instance's advertised URL and its broker URL (Pulsar's binary protocol)."""
        row = session.execute(
            select(models.Instance.url, models.Instance.broker_url).where(models.Instance.id == instance_id)
        ).first()
        return (row[0], row[1]) if row is not None else (None, None)

    def forget_dead(self, session: Session, now: int) -> None:
        """Rows of instances silent for a day and holding no topic (each start adds one)."""
        held = select(models.TopicLease.instance_id).where(models.TopicLease.instance_id.is_not(None))
        session.execute(
            delete(models.Instance).where(
                models.Instance.heartbeat_at < now - 86_400_000, models.Instance.id.not_in(held)
            )
        )

    def count_live(self, session: Session, now: int) -> int:
        return int(
            session.scalar(
                select(func.count())
                .select_from(models.Instance)
                .where(models.Instance.heartbeat_at >= now - self.lease_ms)
            )
            or 0
        )


# The open descriptor that holds the SQLite store's lock, for as long as the process lives.
_sqlite_lock: int | None = None


def lock_sqlite_store(database_url: str) -> str | None:
    """Hold an exclusive lock beside a SQLite metadata file for the life of the process; the
    reason a second instance may not start on it, or None. SQLite is the single-process store:
    several instances need PostgreSQL (leases), and the kernel drops the lock with the process,
    even after kill -9."""
    global _sqlite_lock
    if not database_url.startswith("sqlite:///") or _sqlite_lock is not None:
        return None
    path = Path(database_url.removeprefix("sqlite:///") + ".instance-lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return (
            f"another instance is running on the SQLite metadata store {path.with_suffix('')}: "
            "SQLite serves one instance; run several on PostgreSQL (COMPACTOR_DATABASE_URL)"
        )
    _sqlite_lock = fd
    return None
