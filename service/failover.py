"""Which consumer of a Failover subscription is the active one, as Pulsar's broker chooses it
(``AbstractDispatcherSingleActiveConsumer.pickAndScheduleActiveConsumer``, Pulsar 4.0).

The consumers are ordered by priority level (lower first), then by name (then by the order they
attached, where Pulsar's stable sort keeps it). Only those of the highest level are candidates:

- on a partition of a partitioned topic, candidate ``partition % candidates`` (so a client's
  consumers share the partitions evenly);
- on any other topic, the candidate a consistent hash ring gives the topic's name: each
  candidate's name, suffixed 0..99, hashed with Murmur3 (32 bit, the sign bit cleared) into the
  ring; the topic's name hashed the same way takes the first point at or after it (the ring's
  first when none). So the choice does not depend on the order of attaching, and a consumer
  that joins moves few topics of a pattern or multi-topic subscription.

Pulsar's ``activeConsumerFailoverConsistentHashing`` (off by default) would use the ring for
partitions as well; the service keeps Pulsar's default.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import lru_cache

from service.dispatchers import murmur3_32

#: Points each consumer has on the ring (Pulsar's ``CONSUMER_CONSISTENT_HASH_REPLICAS``).
REPLICAS = 100


def _hash(text: str) -> int:
    return murmur3_32(text.encode()) & 0x7FFFFFFF


@lru_cache(maxsize=4096)
def _points(name: str) -> tuple[int, ...]:
    """A consumer's points on the ring, ascending."""
    return tuple(sorted(_hash(f"{name}{j}") for j in range(REPLICAS)))


def ring_index(topic: str, names: Sequence[str]) -> int:
    """The index in ``names`` (the candidates, in order) that the hash ring gives ``topic``: the
    owner of the first point at or after the topic's hash, else of the ring's first point. A
    point two names share belongs to the later one, as Pulsar's map keeps the last put. Each
    candidate's points are searched apart (no ring is built): a subscription of hundreds of
    consumers chooses in a few milliseconds."""
    h = _hash(topic)
    after: tuple[int, int] | None = None  # (point, -index) of the first point >= h
    first: tuple[int, int] | None = None  # (point, -index) of the ring's first point
    for i, name in enumerate(names):
        points = _points(name)
        at = bisect_left(points, h)
        if at < len(points) and (after is None or (points[at], -i) < after):
            after = (points[at], -i)
        if first is None or (points[0], -i) < first:
            first = (points[0], -i)
    chosen = after if after is not None else first
    assert chosen is not None, "no candidates"
    return -chosen[1]


def active_index(topic: str, partition: int, levels: Sequence[int], names: Sequence[str]) -> int:
    """The index of the active consumer among consumers already in Failover's order (their
    priority ``levels`` and ``names``, at least one); ``partition`` is -1 unless the topic is a
    partition of a partitioned topic."""
    top = levels[0]
    candidates = next((i for i, level in enumerate(levels) if level != top), len(levels))
    if partition >= 0:
        return partition % candidates
    return ring_index(topic, names[:candidates])
