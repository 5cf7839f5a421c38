"""Which partition a message goes to when the service routes it (REST produce to a partitioned
topic), as Pulsar's official client routes it by default, so that a key lands in the same
partition whichever client sent it.

The client (its C++ core, inside every non-Java client) hashes a non-empty key with its default
scheme, ``BoostHash``: ``boost::hash<std::string>`` of Boost 1.81 and later on a 64-bit
platform, the bytes read in little-endian words and mixed by 64x64->128-bit multiplication
(:func:`boost_string_hash`), masked to 31 bits, modulo the partition count. A message without a
key (or with an empty one) goes round-robin. ``tests/e2e/test_partitioned_topics.py`` checks
the function against the real client's choices.
"""

from __future__ import annotations

import itertools
import threading

_M64 = (1 << 64) - 1
_Q = 0x9E3779B97F4A7C15
_K = 0xDF442D22CE4859B9  # _Q * _Q


def _mulx(x: int, y: int) -> int:
    r = (x & _M64) * (y & _M64)
    return (r & _M64) ^ (r >> 64)


def boost_string_hash(data: bytes, seed: int = 0) -> int:
    """``boost::hash`` of a string's bytes (Boost's ``hash_range`` for contiguous 8-bit
    characters with a 64-bit ``size_t``)."""
    n = len(data)
    w = _mulx(seed + _Q, _K)
    h = w ^ n
    i = 0
    while n >= 8:
        w = (w + _Q) & _M64
        h ^= _mulx(int.from_bytes(data[i : i + 8], "little") + w, _K)
        i += 8
        n -= 8
    v = 0
    if n >= 4:
        v = int.from_bytes(data[i + n - 4 : i + n], "little") << ((n - 4) * 8) | int.from_bytes(
            data[i : i + 4], "little"
        )
    elif n >= 1:
        x1, x2 = (n - 1) & 2, n >> 1
        v = data[i + x1] << (x1 * 8) | data[i + x2] << (x2 * 8) | data[i]
    w = (w + _Q) & _M64
    h ^= _mulx(v + w, _K)
    return _mulx(h + w, _K)


def key_partition(key: str, partitions: int) -> int:
    """The partition the official client's default router sends a message with ``key`` to."""
    return (boost_string_hash(key.encode()) & 0x7FFFFFFF) % partitions


class RoundRobin:
    """The partitions of keyless messages, in turn (one counter per partitioned topic)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, itertools.count[int]] = {}

    def next(self, topic: str, partitions: int) -> int:
        with self._lock:
            counter = self._next.setdefault(topic, itertools.count())
            return next(counter) % partitions
