"""Timing and memory measurement.

- :class:`RssSampler` samples, every 50 ms in a background thread, the resident set size of
  this process and (optionally) of its child processes -- for Spark, the driver JVM that
  PySpark launches (local mode runs the executors inside it). It keeps the peaks: of this
  process, of the children, and of their sum at one instant; and the CPU time (user +
  system) the same processes used meanwhile (a child that exits before the end is missed),
  a figure less disturbed than wall time when other work shares the machine.
- :func:`release_memory` hands freed memory back to the OS before a measurement (a garbage
  collection and glibc's ``malloc_trim``), so that an RSS delta measures the run, not what an
  earlier run left in the allocator.
- :func:`median`, :func:`percentile`: the statistics every table uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import psutil

SAMPLE_INTERVAL_S = 0.05
_CHILDREN_REFRESH_S = 1.0


@dataclass(frozen=True)
class MemoryPeak:
    """Peak resident memory during a measurement, in bytes."""

    baseline_self: int  # this process, just before
    peak_self: int  # this process
    peak_children: int  # all child processes together (0 when not sampled)
    peak_total: int  # this process + children, at one sampling instant
    cpu_seconds: float = 0.0  # user + system CPU time of this process (+ children when sampled)

    @property
    def delta_self(self) -> int:
        """How much this process grew: its peak minus its RSS just before."""
        return max(0, self.peak_self - self.baseline_self)


class RssSampler:
    """Context manager: samples RSS every ``interval`` seconds until it exits; ``.peak`` then.

    ``children=True`` also samples every descendant process (refreshing the list once a
    second), e.g. the Spark driver JVM.
    """

    def __init__(self, *, children: bool = False, interval: float = SAMPLE_INTERVAL_S) -> None:
        self._proc = psutil.Process()
        self._children_wanted = children
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kids: list[psutil.Process] = []
        self._kids_at = 0.0
        self._baseline = 0
        self._peak_self = 0
        self._peak_kids = 0
        self._peak_total = 0
        self._cpu0: dict[int, float] = {}
        self.peak: MemoryPeak | None = None

    def _cpu_now(self) -> dict[int, float]:
        """CPU seconds (user + system) so far of this process and of each sampled child, by pid."""
        t = self._proc.cpu_times()
        out = {self._proc.pid: t.user + t.system}
        if self._children_wanted:
            self._kids = self._proc.children(recursive=True)
            self._kids_at = time.monotonic()
            for kid in self._kids:
                try:
                    k = kid.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                out[kid.pid] = k.user + k.system
        return out

    def _children_rss(self) -> int:
        now = time.monotonic()
        if now - self._kids_at > _CHILDREN_REFRESH_S:
            self._kids = self._proc.children(recursive=True)
            self._kids_at = now
        total = 0
        for kid in self._kids:
            try:
                total += kid.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._kids_at = 0.0
        return total

    def _sample(self) -> None:
        own = self._proc.memory_info().rss
        kids = self._children_rss() if self._children_wanted else 0
        self._peak_self = max(self._peak_self, own)
        self._peak_kids = max(self._peak_kids, kids)
        self._peak_total = max(self._peak_total, own + kids)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> RssSampler:
        self._baseline = self._proc.memory_info().rss
        self._sample()
        self._cpu0 = self._cpu_now()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self.peak = MemoryPeak(
            baseline_self=self._baseline,
            peak_self=self._peak_self,
            peak_children=self._peak_kids,
            peak_total=self._peak_total,
            cpu_seconds=sum(t - self._cpu0.get(pid, 0.0) for pid, t in self._cpu_now().items()),
        )


def release_memory() -> None:
    """Collect garbage and return free heap pages to the OS (glibc only; a no-op elsewhere)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` (wall clock, ``perf_counter``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
