"""Whole stored batches a subscription delivered and its consumer has not acknowledged yet.

A Pulsar batch delivered whole (``ledger.entry.BatchEntry``) is one key in the subscription's
``pending`` (its first member's position, see ``service.subscriptions``), not one key per member:
delivering a batch of a thousand members and acknowledging it whole then cost what one message
does. This keeps what the key stands for: how many members follow it, and how many of them
were acknowledged one by one.

Invariants: runs never overlap; every run's first position is a key of the subscription's
``pending``; ``extra`` is the sum of ``length - 1`` over the runs (so that the members pending
are ``len(pending) + extra``); ``acked[first]`` counts the members of that run in the
subscription's ``acked``, and is below its length.
"""

from __future__ import annotations

from bisect import bisect_right, insort

from ledger.entry import Position

Key = tuple[int, int]


def members_of(first: Key, n: int) -> list[Position]:
    """The positions of the ``n`` members of the batch whose first member is at ``first``."""
    lid, eid = first
    return [Position(lid, eid + i) for i in range(n)]


class Runs:
    """The pending runs of one subscription. Not thread-safe: the subscription's lock guards it."""

    __slots__ = ("lengths", "acked", "extra", "_starts")

    def __init__(self) -> None:
        self.lengths: dict[Key, int] = {}
        self.acked: dict[Key, int] = {}
        self.extra = 0
        # Every run's first position, ascending; may still hold ones dropped since (``of``
        # skips them), pruned once they outnumber the live ones.
        self._starts: list[Key] = []

    def __bool__(self) -> bool:
        return bool(self.lengths)

    def add(self, first: Key, n: int) -> None:
        self.lengths[first] = n
        self.extra += n - 1
        starts = self._starts
        if starts and starts[-1] >= first:
            insort(starts, first)  # a run split from the front (a cumulative ack inside it)
        else:
            starts.append(first)

    def drop(self, first: Key) -> int:
        """Forget the run at ``first``; returns its length."""
        n = self.lengths.pop(first)
        self.acked.pop(first, None)
        self.extra -= n - 1
        if len(self._starts) > 2 * len(self.lengths) + 64:
            self._starts = [s for s in self._starts if s in self.lengths]
        return n

    def clear(self) -> None:
        self.lengths.clear()
        self.acked.clear()
        self.extra = 0
        self._starts.clear()

    def of(self, pos: Key) -> Key | None:
        """The first position of the run that holds ``pos``, if one does."""
        lengths = self.lengths
        if not lengths:
            return None
        starts = self._starts
        i = bisect_right(starts, pos) - 1
        while i >= 0:
            first = starts[i]
            n = lengths.get(first)
            if n is not None:  # the nearest live run at or before ``pos``: runs never overlap
                return first if first[0] == pos[0] and pos[1] < first[1] + n else None
            i -= 1
        return None

    def end(self, first: Key) -> Key:
        """The last member of the run at ``first`` (``first`` itself for a single message)."""
        n = self.lengths.get(first, 1)
        return (first[0], first[1] + n - 1)

    def members(self, first: Key) -> list[Position]:
        return members_of(first, self.lengths.get(first, 1))
