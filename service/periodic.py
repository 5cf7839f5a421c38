"""A background thread that calls ``tick()`` every ``interval_s`` until stopped: the compaction
scheduler's and the backlog quota check's loop, written once."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Periodic:
    """Subclasses implement ``tick``; ``_stop`` is set once stopping, for a long tick to end early.
    The first tick comes one interval after ``start``; a tick that raises is logged and the
    next one still comes (one bad pass must not end the work for good)."""

    thread_name = "periodic"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> object:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:
                log.exception("%s: a pass failed", self.thread_name)
