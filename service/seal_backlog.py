"""Back-pressure on sealing: how many closed ledgers may wait to be sealed, and how much memory
their records may hold meanwhile.

A roll-over closes a ledger for appends and queues it for sealing; a producer faster than the
sealer would otherwise queue ledgers without end (each with its records in memory and its
write-ahead file on disk). A produce that will roll ledgers over first *reserves* room here,
before it writes anything, and waits (bounded) for the sealer to make room; when none comes it
is refused with :class:`service.errors.SealBacklogFull` (503) and nothing of it was written.

Invariants (``used`` counts pending seals plus reservations not yet spent):

* ``used[topic] <= per_topic`` and ``sum(used) <= total``, except for roll-overs no produce
  could foresee (by size or age, or a batch spanning more ledgers than ``per_topic``): those
  are counted too but never wait, so the overshoot is at most what one request rolls over;
* ``cache_bytes <= cache_limit``: a ledger whose records would pass it drops its cache and is
  sealed from its write-ahead file instead.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from service.errors import SealBacklogFull


@dataclass(frozen=True, slots=True)
class SealBacklogStats:
    pending: int  # ledgers waiting to be sealed, all topics, plus reservations of produce requests
    limit: int
    per_topic_limit: int
    waiting_producers: int  # produce requests waiting for room now
    refused: int  # produce requests answered 503 since start
    cache_bytes: int  # records of open and closed ledgers kept in memory for their sealing
    cache_limit: int


class SealBacklog:
    """Counts of ledgers waiting to be sealed, per topic and overall. Thread-safe."""

    def __init__(self, *, per_topic: int, total: int, cache_bytes: int) -> None:
        if per_topic < 1 or total < per_topic:
            raise ValueError(f"bad seal backlog bounds: per topic {per_topic}, total {total}")
        self.per_topic = per_topic
        self.total = total
        self.cache_limit = cache_bytes
        self._used: dict[int, int] = {}
        self._sum = 0
        self._cache = 0
        self._waiting = 0
        self._refused = 0
        self._refused_at: float | None = None
        self._cond = threading.Condition(threading.Lock())

    # ------------------------------------------------------------------ ledgers

    def reserve(self, topic_id: int, n: int, timeout: float) -> int:
        """Room for ``n`` roll-overs of a topic (at most ``per_topic`` of them: more are counted
        when they happen); waits up to ``timeout`` s. Returns how many were reserved; raises
        :class:`SealBacklogFull` if the room did not come."""
        n = min(n, self.per_topic)
        if n <= 0:
            return 0
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            try:
                while not self._fits(topic_id, n):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._refused += 1
                        self._refused_at = time.monotonic()
                        mine = self._used.get(topic_id, 0)
                        raise SealBacklogFull(
                            f"the service is sealing closed ledgers more slowly than they are "
                            f"produced: {mine} of this topic (limit {self.per_topic}) and "
                            f"{self._sum} in all (limit {self.total}) wait; try again shortly"
                        )
                    self._cond.wait(remaining)
            finally:
                self._waiting -= 1
            self._add(topic_id, n)
        return n

    def _fits(self, topic_id: int, n: int) -> bool:
        return self._used.get(topic_id, 0) + n <= self.per_topic and self._sum + n <= self.total

    def force(self, topic_id: int) -> None:
        """Count a roll-over no reservation covered (by size or age); never waits."""
        with self._cond:
            self._add(topic_id, 1)

    def release(self, topic_id: int, n: int = 1) -> None:
        """A ledger was sealed (or dropped), or reserved room went unused."""
        if n <= 0:
            return
        with self._cond:
            have = self._used.get(topic_id, 0)
            n = min(n, have)  # a forgotten topic's late release counts nothing
            if not n:
                return
            if have == n:
                del self._used[topic_id]
            else:
                self._used[topic_id] = have - n
            self._sum -= n
            self._cond.notify_all()

    def forget(self, topic_id: int) -> None:
        """The topic was closed (deleted, or the service stops): its pending seals count no more."""
        with self._cond:
            self._sum -= self._used.pop(topic_id, 0)
            self._cond.notify_all()

    def pending(self, topic_id: int) -> int:
        with self._cond:
            return self._used.get(topic_id, 0)

    def _add(self, topic_id: int, n: int) -> None:
        self._used[topic_id] = self._used.get(topic_id, 0) + n
        self._sum += n

    # ------------------------------------------------------------------ memory

    def charge_cache(self, n: int) -> bool:
        """Take ``n`` bytes of the seal-cache budget; False (nothing taken) when it is spent."""
        with self._cond:
            if self._cache + n > self.cache_limit:
                return False
            self._cache += n
            return True

    def refund_cache(self, n: int) -> None:
        if n > 0:
            with self._cond:
                self._cache = max(0, self._cache - n)

    # ------------------------------------------------------------------ state

    @property
    def last_refused(self) -> float | None:
        """When (``time.monotonic()``) a produce was last refused, for /health."""
        with self._cond:
            return self._refused_at

    def stats(self) -> SealBacklogStats:
        with self._cond:
            return SealBacklogStats(
                pending=self._sum,
                limit=self.total,
                per_topic_limit=self.per_topic,
                waiting_producers=self._waiting,
                refused=self._refused,
                cache_bytes=self._cache,
                cache_limit=self.cache_limit,
            )
