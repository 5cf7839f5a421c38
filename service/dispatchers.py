"""Delivery to several consumers of one subscription: Pulsar's Shared and Key_Shared dispatchers.

Exclusive and Failover subscriptions deliver to one consumer at a time and keep the simpler
rewinding cursor of ``service.subscriptions.Subscription``; this module is the rest.

The service is pulled, not pushed: a consumer's receive request is its permits (Pulsar's flow
permits), and a message goes to the consumer whose receive reads it. With several consumers
polling, each request takes the next messages nobody holds, which spreads them round robin
over the consumers that ask (Pulsar's ``PersistentDispatcherMultipleConsumers``).

State, on top of the subscription's ``pending`` (delivered, unacknowledged: position -> times
delivered before) and ``redelivered`` (position -> times delivered so far):

- ``owner``: each pending position -> the consumer holding it and its sticky-key hash;
- ``replay``: positions to deliver before anything new -- redelivered ones (a consumer closed,
  timed out, asked, or its ack timeout or negative-ack delay passed) and, for Key_Shared,
  messages read ahead whose key's consumer was not the one asking (Pulsar's replay set);
  a position is in at most one of ``pending`` and ``replay``;
- Key_Shared only: ``held`` (hash -> the consumer that holds pending messages of that hash and
  how many), and the hash ranges of ``HashRangeAutoSplitSelector``;
- Shared only: ``chunks`` (``service.chunked.ChunkAssignor``), so that the chunks of a chunked
  message all go to one consumer, as Pulsar's ``SharedConsumerAssignor`` sends them (Key_Shared
  routes them together by their message's key).

Key_Shared delivers a message of hash ``h`` to consumer ``c`` only if ``h`` falls in ``c``'s
range, no other consumer holds pending messages of ``h`` (after a consumer change the new
owner waits until the old owner's messages of ``h`` are acknowledged or redelivered: Pulsar's
draining hashes), and no earlier message of ``h`` waits in ``replay``; so a key's messages go
out in order, one consumer at a time.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ledger.entry import Entry, Position
from service.chunked import CHUNK_PROPERTY, ChunkAssignor
from service.clock import now_ms
from service.errors import Conflict

if TYPE_CHECKING:
    from service.managed_ledger import ManagedLedger
    from service.subscription_types import SubscriptionState

Key = tuple[int, int]

#: Pulsar's ``StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE``.
RANGE_SIZE = 2 << 15
#: The sticky key of a message without one (Pulsar's ``NONE_KEY``).
NONE_KEY = b"NONE_KEY"
#: Messages a Key_Shared subscription reads ahead and holds for consumers that have not asked
#: (Pulsar's ``keySharedLookAheadMsgInReplayThresholdPerSubscription``); past it, reading stops.
LOOK_AHEAD_LIMIT = 20_000
#: The smallest read a Key_Shared receive makes when it looks ahead.
_KEY_SHARED_READ = 100

_M32 = 0xFFFFFFFF


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 (x86, 32 bit), the hash Pulsar's Key_Shared selectors use."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    h = seed & _M32
    n = len(data)
    end = n - n % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= (k * c2) & _M32
        h = ((h << 13) | (h >> 19)) & _M32
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[end:]
    if tail:
        k = 0
        for j in range(len(tail) - 1, -1, -1):
            k = (k << 8) | tail[j]
        k = (k * c1) & _M32
        k = ((k << 15) | (k >> 17)) & _M32
        h ^= (k * c2) & _M32
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def sticky_hash(key: str | bytes | None) -> int:
    """The slot of a message's sticky key in ``[0, RANGE_SIZE)``, as Pulsar computes it."""
    data = NONE_KEY if key is None else key.encode() if isinstance(key, str) else key
    return (murmur3_32(data) & 0x7FFFFFFF) % RANGE_SIZE


def sticky_key(e: Entry) -> str | bytes | None:
    """What Key_Shared routes a message by: its ordering key where it has one (Pulsar's rule),
    else its key."""
    return e.ordering_key if e.ordering_key is not None else e.key


class HashRangeAutoSplitSelector:
    """Pulsar's ``HashRangeAutoSplitStickyKeyConsumerSelector``: consumers own contiguous
    ranges of ``[0, RANGE_SIZE]``; a new consumer takes half of the biggest range (the first
    of the biggest, in range order); a consumer that leaves hands its range to the next one
    up (the top range to the one below it)."""

    def __init__(self) -> None:
        self.ends: list[int] = []  # the inclusive upper bound of each range, ascending
        self.owners: list[str] = []  # the consumer of each range

    def add(self, consumer_id: str) -> None:
        if not self.ends:
            self.ends, self.owners = [RANGE_SIZE], [consumer_id]
            return
        best, size, lower = 0, -1, 0
        for i, end in enumerate(self.ends):
            if end - lower > size:
                best, size = i, end - lower
            lower = end
        end = self.ends[best]
        lower = self.ends[best - 1] if best else 0
        if end - lower <= 1:
            raise Conflict(
                f"No more range can be assigned to a new consumer, assigned consumers {len(self.ends)}"
            )
        self.ends.insert(best, end - ((end - lower) >> 1))
        self.owners.insert(best, consumer_id)

    def remove(self, consumer_id: str) -> None:
        if consumer_id not in self.owners:
            return
        i = self.owners.index(consumer_id)
        if i == len(self.ends) - 1 and i > 0:  # the top range goes to the consumer below it
            self.owners[i] = self.owners[i - 1]
            del self.ends[i - 1], self.owners[i - 1]
        else:
            del self.ends[i], self.owners[i]

    def select(self, slot: int) -> str | None:
        if not self.ends:
            return None
        return self.owners[bisect_left(self.ends, slot)]

    def ranges(self, consumer_id: str) -> list[tuple[int, int]]:
        """The consumer's ranges as Pulsar's stats show them, ``(start, end)`` inclusive."""
        out = []
        for i, (end, owner) in enumerate(zip(self.ends, self.owners, strict=True)):
            if owner == consumer_id:
                out.append((self.ends[i - 1] + 1 if i else 0, end))
        return out


def rest_of_batch(e: Entry) -> int:
    """How many members of ``e``'s Pulsar batch are stored after it (0 for a message sent
    alone): see ``ledger.entry.message_id``."""
    if e.batch_index is None or e.batch_size is None:
        return 0
    return e.batch_size - 1 - e.batch_index


def read_positions(ledger: ManagedLedger, wanted: list[Key]) -> dict[Key, Entry]:
    """The entries at ``wanted`` (ascending), read in runs; positions no longer in the log
    (deleted by retention) are left out."""
    out: dict[Key, Entry] = {}
    i = 0
    while i < len(wanted):
        lid, eid = wanted[i]
        j = i
        while j + 1 < len(wanted) and wanted[j + 1][0] == lid and wanted[j + 1][1] - eid < 1000:
            j += 1
        want = set(wanted[i : j + 1])
        entries, _ = ledger.read(Position(lid, eid), wanted[j][1] - eid + 1)
        for e in entries:
            pos = (e[0], e[1])
            if pos in want:
                out[pos] = e
        i = j + 1
    return out


class Dispatcher:
    """The delivery state of a Shared or Key_Shared subscription. Called with the
    subscription's lock held."""

    def __init__(self, *, key_shared: bool) -> None:
        self.key_shared = key_shared
        self.selector = HashRangeAutoSplitSelector() if key_shared else None
        self.owner: dict[Key, tuple[str, int]] = {}
        self.outstanding: dict[str, dict[Key, None]] = {}  # consumer -> its pending positions
        self.replay: dict[Key, int] = {}  # position -> sticky hash
        self.replay_hashes: Counter[int] = Counter()
        self.held: dict[int, tuple[str, int]] = {}
        # Pulsar's delayed delivery: messages read before their time, by position (with their
        # sticky hash), and a heap of (deliver-at ms, position). Due ones move to ``replay``.
        self.delayed: dict[Key, int] = {}
        self.delayed_due: list[tuple[int, Key]] = []
        # Pages delivered under an ack timeout, per consumer, oldest first.
        self.timeouts: dict[str, deque[tuple[float, list[Key]]]] = {}
        self.chunks = ChunkAssignor()
        # The consumers' priority levels (how many at each), and the highest (lowest number):
        # a Shared consumer below it takes messages only when no consumer above it can.
        self.levels: Counter[int] = Counter()
        self.top_level = 0

    # ------------------------------------------------------------ consumers

    def add_consumer(self, consumer_id: str, priority_level: int = 0) -> None:
        if self.selector is not None:
            self.selector.add(consumer_id)
        self.outstanding[consumer_id] = {}
        self.timeouts[consumer_id] = deque()
        self.levels[priority_level] += 1
        self.top_level = min(self.levels)

    def remove_consumer(self, state: SubscriptionState, consumer_id: str, priority_level: int = 0) -> None:
        """Its pending messages go back to be delivered to the others."""
        self.redeliver(state, consumer_id)
        if self.selector is not None:
            self.selector.remove(consumer_id)
        self.outstanding.pop(consumer_id, None)
        self.timeouts.pop(consumer_id, None)
        self.chunks.remove_consumer(consumer_id)
        if self.levels[priority_level] > 0:
            self.levels[priority_level] -= 1
            if not self.levels[priority_level]:
                del self.levels[priority_level]
        self.top_level = min(self.levels, default=0)

    def unacked(self, consumer_id: str) -> int:
        return len(self.outstanding.get(consumer_id, ()))

    def ranges(self, consumer_id: str) -> list[tuple[int, int]]:
        return self.selector.ranges(consumer_id) if self.selector is not None else []

    # ------------------------------------------------------------ bookkeeping

    def _take(self, state: SubscriptionState, consumer_id: str, pos: Key, h: int, count: int) -> None:
        state.pending[pos] = count
        self.owner[pos] = (consumer_id, h)
        self.outstanding[consumer_id][pos] = None
        if self.key_shared:
            _, n = self.held.get(h, (consumer_id, 0))
            self.held[h] = (consumer_id, n + 1)

    def _release(self, pos: Key) -> str | None:
        """Forget who holds ``pos``; the consumer that did, if any."""
        got = self.owner.pop(pos, None)
        if got is None:
            return None
        consumer_id, h = got
        mine = self.outstanding.get(consumer_id)
        if mine is not None:
            mine.pop(pos, None)
        if self.key_shared:
            holder, n = self.held[h]
            if n <= 1:
                del self.held[h]
            else:
                self.held[h] = (holder, n - 1)
        return consumer_id

    def _to_replay(self, pos: Key, h: int) -> None:
        self.replay[pos] = h
        if self.key_shared:
            self.replay_hashes[h] += 1

    def _from_replay(self, pos: Key) -> None:
        h = self.replay.pop(pos)
        if self.key_shared:
            left = self.replay_hashes[h] - 1
            if left:
                self.replay_hashes[h] = left
            else:
                del self.replay_hashes[h]

    def acknowledged(self, state: SubscriptionState, pos: Key) -> None:
        state.pending.pop(pos, None)
        self._release(pos)
        if pos in self.replay:
            self._from_replay(pos)
        if self.chunks:
            self.chunks.forget(pos)

    def redeliver(
        self, state: SubscriptionState, consumer_id: str, positions: Iterable[Key] | None = None
    ) -> int:
        """Put the consumer's pending messages (all, or those of ``positions`` it holds) back to
        be delivered again; how many."""
        mine = self.outstanding.get(consumer_id)
        if not mine:
            return 0
        chosen = list(mine) if positions is None else [p for p in positions if p in mine]
        for pos in chosen:
            h = self.owner[pos][1]
            self._release(pos)
            state.redelivered[pos] = state.pending.pop(pos) + 1
            self._to_replay(pos, h)
        return len(chosen)

    def floor(self, state: SubscriptionState) -> Key:
        """The smallest position not known consumed: the mark-delete position may reach just below."""
        low: Key = state.read_pos
        if state.pending:
            low = min(low, min(state.pending))
        if self.replay:
            low = min(low, min(self.replay))
        if self.delayed:
            low = min(low, min(self.delayed))
        return low

    def reset(self) -> None:
        """Forget every delivery (a seek): what consumers hold is no longer pending."""
        self.owner.clear()
        for mine in self.outstanding.values():
            mine.clear()
        for pages in self.timeouts.values():
            pages.clear()
        self.replay.clear()
        self.replay_hashes.clear()
        self.held.clear()
        self.delayed.clear()
        self.delayed_due.clear()
        self.chunks.clear()

    def expire_ack_timeouts(self, state: SubscriptionState, now: float) -> None:
        for consumer_id, pages in self.timeouts.items():
            while pages and pages[0][0] <= now:
                _, positions = pages.popleft()
                self.redeliver(state, consumer_id, positions)

    def next_ack_deadline(self) -> float | None:
        """When (``time.monotonic``) a message next becomes due: an ack timeout, or a delayed
        message's time."""
        firsts = [pages[0][0] for pages in self.timeouts.values() if pages]
        if self.delayed_due:
            firsts.append(time.monotonic() + max(0, self.delayed_due[0][0] - now_ms()) / 1000)
        return min(firsts) if firsts else None

    def _release_due(self) -> None:
        """Delayed messages whose time has come go to ``replay``, to be delivered first."""
        now = now_ms()
        while self.delayed_due and self.delayed_due[0][0] <= now:
            _, pos = heapq.heappop(self.delayed_due)
            h = self.delayed.pop(pos, None)
            if h is not None:
                self._to_replay(pos, h)

    def over_redelivered(self, state: SubscriptionState, max_redeliver_count: int, limit: int) -> list[Key]:
        """Positions waiting in ``replay`` that were delivered more than ``max_redeliver_count``
        times after the first (the dead letter policy's), smallest first."""
        counts = state.redelivered
        over = [p for p in self.replay if counts.get(p, 0) > max_redeliver_count]
        return heapq.nsmallest(limit, over)

    # ------------------------------------------------------------ delivery

    def _may_take(self, h: int, consumer_id: str) -> bool:
        assert self.selector is not None
        if self.selector.select(h) != consumer_id:
            return False
        holder = self.held.get(h)
        return holder is None or holder[0] == consumer_id

    def deliver(
        self, state: SubscriptionState, consumer_id: str, limit: int
    ) -> tuple[list[Entry], list[int]]:
        """Up to ``limit`` messages for ``consumer_id``: those waiting in ``replay`` first, in id
        order, then new ones from the read position; with their redelivery counts."""
        out: list[Entry] = []
        counts: list[int] = []
        ledger = state.topic.ledger
        redelivered = state.redelivered
        if self.delayed_due:
            self._release_due()
        now = now_ms()
        if self.replay:
            chosen: list[Key] = []
            if self.key_shared:
                blocked: set[int] = set()
                for pos in sorted(self.replay):
                    if len(chosen) >= limit:
                        break
                    h = self.replay[pos]
                    if h in blocked or not self._may_take(h, consumer_id):
                        blocked.add(h)  # later messages of the key wait behind this one
                        continue
                    chosen.append(pos)
            elif self.chunks:
                # Chunks of a message another consumer has begun wait for that consumer.
                chunks = self.chunks
                chosen = heapq.nsmallest(limit, (p for p in self.replay if chunks.free(p, consumer_id)))
            else:
                chosen = heapq.nsmallest(limit, self.replay)
            if chosen:
                got = read_positions(ledger, chosen)
                for pos in chosen:
                    h = self.replay[pos]
                    self._from_replay(pos)
                    e = got.get(pos)
                    if e is None or pos <= state.mark_delete or pos in state.acked:
                        continue  # gone from the log, or consumed meanwhile
                    n = redelivered.get(pos, 0)
                    self._take(state, consumer_id, pos, h, n)
                    if self.chunks:
                        self.chunks.take(pos, consumer_id)
                    out.append(e)
                    counts.append(n)
        while True:
            # A Pulsar batch is one entry to its client, which acknowledges it only once it has
            # every member: never stop inside one (the limit yields by less than a batch).
            rest = rest_of_batch(out[-1]) if out else 0
            if len(out) >= limit and not rest:
                break
            if self.key_shared and len(self.replay) >= LOOK_AHEAD_LIMIT:
                break
            want = max(limit - len(out), rest)
            if self.key_shared:
                want = max(want, _KEY_SHARED_READ)
            entries, nxt = ledger.read(state.read_pos, want)
            if not entries:
                break
            md, acked = state.mark_delete, state.acked
            for e in entries:
                pos = (e[0], e[1])
                if pos <= md or pos in acked:
                    continue
                h = sticky_hash(sticky_key(e)) if self.key_shared else 0
                if e.deliver_at_time is not None and e.deliver_at_time > now:
                    # Pulsar's delayed delivery: held until its time, then delivered first.
                    self.delayed[pos] = h
                    heapq.heappush(self.delayed_due, (e.deliver_at_time, pos))
                    continue
                if self.key_shared and (
                    len(out) >= limit or self.replay_hashes.get(h) or not self._may_take(h, consumer_id)
                ):
                    self._to_replay(pos, h)
                    continue
                if not self.key_shared and e.properties and CHUNK_PROPERTY in e.properties:
                    chunks = self.chunks
                    if chunks.note(pos, e):
                        if not chunks.free(pos, consumer_id):
                            self._to_replay(pos, h)  # for the consumer that has its message's chunk 0
                            continue
                        chunks.take(pos, consumer_id)
                n = redelivered.get(pos, 0) if redelivered else 0
                self._take(state, consumer_id, pos, h, n)
                out.append(e)
                counts.append(n)
            state.read_pos = nxt
        return out, counts
