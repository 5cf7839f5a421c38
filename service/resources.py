"""The process's file descriptors: its limit, how many are open, and what to do when they run out.

At start-up the service raises its soft ``RLIMIT_NOFILE`` to the hard limit (the soft default,
often 1,024, is far below what the service's bounds are sized for) and logs both. The bounded
users of descriptors are sized from the limit: the sealed-ledger file cache takes at most a
quarter of it, so sockets, the metadata database, write-ahead files and Spark keep the rest.

When descriptors run out anyway (another process's load, more topics or connections than the
limit allows) the request that hit it is answered 503 with a reason, and ``/health`` says
``degraded`` for :data:`DEGRADED_FOR_S` seconds after the last time it happened.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from service.errors import DescriptorsExhausted

try:
    import resource
except ImportError:  # not on POSIX: nothing to raise or read
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: How long /health reports a descriptor exhaustion (or a refused produce) after it happened.
DEGRADED_FOR_S = 10.0
#: The share of the descriptor limit the sealed-ledger file cache may hold.
FILE_CACHE_SHARE = 4
_FD_DIRS = ("/proc/self/fd", "/dev/fd")


@dataclass(frozen=True, slots=True)
class DescriptorLimit:
    soft: int  # -1: unlimited
    hard: int


def descriptor_limit() -> DescriptorLimit:
    if resource is None:
        return DescriptorLimit(-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return DescriptorLimit(_n(soft), _n(hard))


def raise_descriptor_limit() -> DescriptorLimit:
    """Raise the soft descriptor limit to the hard one; log and return both (after)."""
    if resource is None:
        return DescriptorLimit(-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:  # e.g. macOS refuses an unlimited soft limit
            log.warning("could not raise the open-file limit from %s to %s: %s", _show(soft), _show(hard), e)
    log.info("open-file limit: soft %s (was %s), hard %s", _show(soft), _show(before), _show(hard))
    return DescriptorLimit(_n(soft), _n(hard))


def open_descriptors() -> int | None:
    """Descriptors the process has open now (None where the OS does not tell)."""
    for d in _FD_DIRS:
        try:
            return len(os.listdir(d)) - 1  # listdir's own descriptor on the directory
        except OSError:
            continue
    return None


def ledger_file_budget(setting: int, limit: DescriptorLimit) -> int:
    """How many sealed-ledger files the cache may keep open: the setting, but never more than
    a quarter of the soft limit (and at least 4)."""
    if limit.soft < 0:
        return setting
    return max(4, min(setting, limit.soft // FILE_CACHE_SHARE))


def _n(v: int) -> int:
    return -1 if resource is not None and v == resource.RLIM_INFINITY else int(v)


def _show(v: int) -> str:
    return "unlimited" if resource is not None and v == resource.RLIM_INFINITY else str(v)


class ExhaustionLog:
    """When and where descriptors last ran out, for ``/health``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: float | None = None
        self._where = ""
        self.count = 0

    def note(self, where: str, exc: BaseException) -> DescriptorsExhausted:
        """Record an exhaustion; returns the domain error to answer with (503)."""
        with self._lock:
            self._at = time.monotonic()
            self._where = where
            self.count += 1
        log.warning("out of file descriptors in %s: %s", where, exc)
        limit = descriptor_limit()
        return DescriptorsExhausted(
            f"the service ran out of file descriptors ({where}; limit {limit.soft}); try again shortly"
        )

    def recent(self) -> str | None:
        """A reason while the last exhaustion is recent, else None."""
        with self._lock:
            if self._at is None or time.monotonic() - self._at > DEGRADED_FOR_S:
                return None
            return f"out of file descriptors {time.monotonic() - self._at:.0f} s ago ({self._where})"
