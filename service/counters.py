"""Running totals kept on the hot paths (produce, consume) for the metrics to read at scrape time.

A plain ``int`` attribute and ``+=`` would do where a lock is already held; a ``Tally`` is for
places that hold none: ``+=`` on an attribute is a read and a write, and two threads between
them would lose a count.
"""

from __future__ import annotations

import threading


class Tally:
    """A count that only grows, added to by many threads: one uncontended lock per call, so
    call it once per batch or page, never per message."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n
