"""Topic ownership by lease, as Pulsar's bundle ownership, fenced as BookKeeper fences a ledger.

With one instance on SQLite (the default) every topic is this process's for good
(:data:`FOREVER`). With several instances on PostgreSQL, a topic belongs to the instance whose
row in ``topic_leases`` names it and has not lapsed:

- The owner renews all its leases in one statement every quarter lease
  (``COMPACTOR_OWNERSHIP_LEASE_MS``); the renewal also beats its heartbeat.
- A lapsed lease is taken over with ``epoch + 1``. The new owner waits out the old lease (by the
  database's clock) before it recovers the topic's files, so everything the old owner
  acknowledged is on the shared storage root by then.
- An owner acknowledges a write only while its lease is valid *by its own monotonic clock*:
  from the start of the last successful renewal, a lease minus a safety margin (a quarter
  lease). That is a comparison in memory, no database round trip per write, and it ends before
  the lease ends in the database, where another instance could take over.
- Metadata changes that shape the log (a new ledger at roll-over, sealing a ledger, committing
  a compaction) run :meth:`LeaseOwnership.fence` in their transaction: they commit only if the
  lease row still has this instance and epoch, and lock it against a takeover meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service import models
from service.db import Database
from service.errors import OwnershipLost
from service.instances import InstanceRegistry, db_now_ms

log = logging.getLogger(__name__)

Fence = Callable[[Session], None]


@dataclass(slots=True)
class Lease:
    """This instance's hold on one topic: the epoch it took it with, and until when (monotonic
    seconds) it may acknowledge writes."""

    epoch: int
    valid_until: float = math.inf

    def valid(self) -> bool:
        return time.monotonic() < self.valid_until

    def lose(self) -> None:
        self.valid_until = -math.inf


def forever() -> Lease:
    """The lease of a single instance: epoch 0, never lapsing."""
    return Lease(epoch=0)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a topic now, as the database says."""

    instance_id: int | None
    url: str | None
    valid: bool  # the lease has not lapsed
    broker_url: str | None = None  # where it serves Pulsar's binary protocol, if it does


class LeaseOwnership:
    """This instance's leases: claiming, renewing, fencing, releasing. Thread-safe."""

    def __init__(self, *, db: Database, registry: InstanceRegistry, lease_ms: int) -> None:
        self.db = db
        self.registry = registry
        self.lease_ms = lease_ms
        self.margin_s = lease_ms / 4000
        self.renew_every_s = lease_ms / 4000
        self._leases: dict[int, Lease] = {}  # by topic id
        self._lock = threading.Lock()

    @property
    def instance_id(self) -> int:
        return self.registry.id

    @property
    def url(self) -> str:
        return self.registry.url

    # ---------------------------------------------------------------- looking up

    def owner(self, topic_id: int) -> Owner:
        with self.db.session() as s:
            now = db_now_ms(s)
            row = s.get(models.TopicLease, topic_id)
            if row is None or row.instance_id is None:
                return Owner(None, None, False)
            url, broker_url = self.registry.urls_of(s, row.instance_id)
            return Owner(row.instance_id, url, row.expires_at > now, broker_url)

    # ---------------------------------------------------------------- claiming

    def claim(self, topic_id: int) -> Lease | None:
        """Take the topic if this instance may: a lease assigned to this process is adopted; a
        lapsed one, or one of an earlier process with this instance's URL, is taken with a
        higher epoch, and the old lease waited out. None if another instance holds it (or the
        topic is gone)."""
        started = time.monotonic()
        with self.db.session() as s:
            now = db_now_ms(s)
            row = s.scalar(
                select(models.TopicLease).where(models.TopicLease.topic_id == topic_id).with_for_update()
            )
            if row is None:
                return None
            wait_until = now
            if row.instance_id != self.instance_id:
                earlier_self = (
                    row.instance_id is not None and self.registry.url_of(s, row.instance_id) == self.url
                )
                if row.expires_at > now and not earlier_self:
                    return None
                wait_until = max(now, row.expires_at)
                row.epoch += 1
                row.instance_id = self.instance_id
            row.expires_at = wait_until + self.lease_ms
            epoch = row.epoch
        lease = Lease(epoch=epoch, valid_until=started + (wait_until - now) / 1000 + self.lease_ms / 1000)
        lease.valid_until -= self.margin_s
        with self._lock:
            self._leases[topic_id] = lease
        if wait_until > now:
            log.info(
                "topic %s: waiting %d ms for the previous owner's lease to lapse", topic_id, wait_until - now
            )
            time.sleep((wait_until - now) / 1000)
        return lease

    def assign(self, session: Session, topic_id: int, now: int) -> int:
        """The lease row of a new topic, given to the live instance with the fewest topics (this
        one on a tie); returns that instance's id."""
        live = self.registry.live(session, now) or {self.instance_id: self.url}
        counts = dict(
            session.execute(
                select(models.TopicLease.instance_id, func.count())
                .where(models.TopicLease.instance_id.in_(list(live)), models.TopicLease.expires_at > now)
                .group_by(models.TopicLease.instance_id)
            ).all()
        )
        chosen = min(live, key=lambda i: (counts.get(i, 0), i != self.instance_id, i))
        session.add(
            models.TopicLease(topic_id=topic_id, instance_id=chosen, epoch=1, expires_at=now + self.lease_ms)
        )
        return chosen

    def to_balance(self) -> list[int]:
        """Lapsed topics this instance should take to hold its share (topics / live instances)."""
        with self.db.session() as s:
            now = db_now_ms(s)
            live = max(1, self.registry.count_live(s, now))
            total = int(s.scalar(select(func.count()).select_from(models.TopicLease)) or 0)
            mine = int(
                s.scalar(
                    select(func.count())
                    .select_from(models.TopicLease)
                    .where(models.TopicLease.instance_id == self.instance_id)
                )
                or 0
            )
            want = math.ceil(total / live) - mine
            if want <= 0:
                return []
            return list(
                s.scalars(
                    select(models.TopicLease.topic_id)
                    .where(models.TopicLease.expires_at <= now)
                    .order_by(models.TopicLease.topic_id)
                    .limit(want)
                )
            )

    def earlier_selves(self) -> list[int]:
        """Topics held by an earlier process with this instance's URL (a restart after a crash):
        this process takes them back at start, once their leases lapse."""
        with self.db.session() as s:
            earlier = select(models.Instance.id).where(
                models.Instance.url == self.url, models.Instance.id != self.instance_id
            )
            return list(
                s.scalars(
                    select(models.TopicLease.topic_id)
                    .where(models.TopicLease.instance_id.in_(earlier))
                    .order_by(models.TopicLease.topic_id)
                )
            )

    # ---------------------------------------------------------------- renewing

    def renew(self) -> tuple[list[int], list[int]]:
        """Renew every lease of this instance and beat the heartbeat. Returns the topics lost
        (held here, no longer this instance's at this epoch) and the topics assigned to this
        instance that it has not claimed yet."""
        started = time.monotonic()
        with self.db.session() as s:
            now = db_now_ms(s)
            self.registry.heartbeat(s, now)
            held = dict(
                s.execute(
                    update(models.TopicLease)
                    .where(models.TopicLease.instance_id == self.instance_id)
                    .values(expires_at=now + self.lease_ms)
                    .returning(models.TopicLease.topic_id, models.TopicLease.epoch)
                ).all()
            )
        valid_until = started + self.lease_ms / 1000 - self.margin_s
        lost: list[int] = []
        with self._lock:
            for topic_id, lease in list(self._leases.items()):
                if held.get(topic_id) == lease.epoch:
                    lease.valid_until = max(lease.valid_until, valid_until)
                else:
                    lease.lose()
                    lost.append(topic_id)
                    del self._leases[topic_id]
            assigned = [t for t in held if t not in self._leases]
        return lost, assigned

    def forget(self, topic_id: int) -> None:
        """A topic this instance no longer serves (deleted, or its loading failed)."""
        with self._lock:
            lease = self._leases.pop(topic_id, None)
        if lease is not None:
            lease.lose()

    def release_all(self) -> None:
        """At a clean stop, after every topic is closed: let other instances take them at once."""
        with self._lock:
            for lease in self._leases.values():
                lease.lose()
            self._leases.clear()
        with self.db.session() as s:
            s.execute(
                update(models.TopicLease)
                .where(models.TopicLease.instance_id == self.instance_id)
                .values(expires_at=0)
            )

    # ---------------------------------------------------------------- fencing

    def fence(self, topic_id: int, epoch: int) -> Fence:
        """A check for a transaction that changes the topic's log: it raises ``OwnershipLost``
        unless this instance still holds the topic at ``epoch``, and locks the lease row until
        the transaction ends (a takeover waits for it)."""
        me = self.instance_id

        def check(session: Session) -> None:
            result = session.execute(
                update(models.TopicLease)
                .where(
                    models.TopicLease.topic_id == topic_id,
                    models.TopicLease.instance_id == me,
                    models.TopicLease.epoch == epoch,
                )
                .values(epoch=epoch)
            )
            if result.rowcount != 1:  # type: ignore[attr-defined]
                raise OwnershipLost(f"this instance no longer owns topic {topic_id} (epoch {epoch})")

        return check
