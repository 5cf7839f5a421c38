"""How a producer of a partitioned topic chooses each message's partition: Pulsar's routing
modes and hashing schemes (``pulsar.PartitionsRoutingMode``, ``pulsar.HashingScheme``).

The hashes are the clients' own (their C++ core, inside every non-Java client): a non-empty key
is hashed with the producer's scheme, masked to 31 bits, modulo the partition count. The
default, ``BoostHash``, is ``boost::hash<std::string>`` of Boost 1.81 and later on a 64-bit
platform: the bytes read in little-endian words and mixed by 64x64->128-bit multiplication
(:func:`boost_string_hash`). The service routes REST produce with :func:`key_partition` too
(handed to it by the app), so a key lands in the same partition whichever client sent it;
``tests/e2e/test_partitioned_topics.py`` checks it against the official client's choices.

A keyed message goes to the hash of its key modulo the partition count in every mode but
``CustomPartition``, so a key stays in one partition. A keyless one goes round-robin
(``RoundRobinDistribution``, the default), to one partition chosen when the producer is made
(``UseSinglePartition``), or where ``message_router(message, partitions)`` says
(``CustomPartition``, keyed messages too). With the default mode and scheme the producer sends
to the partitioned topic and the service routes each message the same way (one request);
otherwise the producer routes, and sends each partition its share.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from api.client.message import OutgoingMessage

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


def java_string_hash(data: bytes) -> int:
    """The client's ``JavaStringHash``: Java's ``String.hashCode`` loop over the key's bytes,
    each read as a signed ``char`` (as the C++ core does), in 32 bits."""
    h = 0
    for b in data:
        h = (31 * h + (b - 256 if b > 127 else b)) & 0xFFFFFFFF
    return h


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _mix_k1(k: int) -> int:
    k = (k * 0xCC9E2D51) & 0xFFFFFFFF
    return (_rotl32(k, 15) * 0x1B873593) & 0xFFFFFFFF


def murmur3_32_hash(data: bytes, seed: int = 0) -> int:
    """MurmurHash3's 32-bit hash (x86), the client's ``Murmur3_32Hash`` (seed 0)."""
    n = len(data)
    h = seed
    blocks = n // 4
    for i in range(blocks):
        h ^= _mix_k1(int.from_bytes(data[4 * i : 4 * i + 4], "little"))
        h = (_rotl32(h, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    tail = data[4 * blocks :]
    for j in reversed(range(len(tail))):
        k ^= tail[j] << (8 * j)
    h ^= _mix_k1(k)
    h ^= n & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


# The official client's hashing schemes, by the names its producer configuration uses.
HASHING_SCHEMES: dict[str, Callable[[bytes], int]] = {
    "BoostHash": boost_string_hash,
    "JavaStringHash": java_string_hash,
    "Murmur3_32Hash": murmur3_32_hash,
}


def key_partition(key: str, partitions: int, scheme: str = "BoostHash") -> int:
    """The partition the official client's routers send a message with ``key`` to, hashed
    with ``scheme`` (its default, ``BoostHash``, unless named)."""
    return (HASHING_SCHEMES[scheme](key.encode()) & 0x7FFFFFFF) % partitions


class PartitionsRoutingMode:
    """Pulsar's routing modes for messages without a key (``pulsar.PartitionsRoutingMode``)."""

    RoundRobinDistribution = "RoundRobinDistribution"
    UseSinglePartition = "UseSinglePartition"
    CustomPartition = "CustomPartition"


class HashingScheme:
    """Pulsar's hashing schemes for keys (``pulsar.HashingScheme``); ``BoostHash`` is the
    default of the official Python and C++ clients."""

    BoostHash = "BoostHash"
    JavaStringHash = "JavaStringHash"
    Murmur3_32Hash = "Murmur3_32Hash"


#: ``message_router(message, partitions)``: the partition of a message, 0..partitions-1.
MessageRouter = Callable[[OutgoingMessage, int], int]

_MODES = (
    PartitionsRoutingMode.RoundRobinDistribution,
    PartitionsRoutingMode.UseSinglePartition,
    PartitionsRoutingMode.CustomPartition,
)


class Router:
    """One producer's choice of partitions; checks its settings when made (``ValueError``)."""

    def __init__(
        self,
        mode: str = PartitionsRoutingMode.RoundRobinDistribution,
        hashing_scheme: str = HashingScheme.BoostHash,
        message_router: MessageRouter | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"unknown routing mode {mode!r}; one of {', '.join(_MODES)}")
        if hashing_scheme not in HASHING_SCHEMES:
            known = ", ".join(HASHING_SCHEMES)
            raise ValueError(f"unknown hashing scheme {hashing_scheme!r}; one of {known}")
        if (mode == PartitionsRoutingMode.CustomPartition) != (message_router is not None):
            raise ValueError("a message_router is given with the CustomPartition routing mode, and only then")
        self.mode = mode
        self.hashing_scheme = hashing_scheme
        self._router = message_router
        # As the official client: round-robin from a random partition, a random single one.
        self._cursor = random.randrange(1 << 31)
        self._single = random.randrange(1 << 31)

    @property
    def by_service(self) -> bool:
        """The service routes as this router would (the default mode and scheme)."""
        return (
            self.mode == PartitionsRoutingMode.RoundRobinDistribution
            and self.hashing_scheme == HashingScheme.BoostHash
        )

    def partition(self, message: OutgoingMessage, partitions: int) -> int:
        if self._router is not None:
            chosen = self._router(message, partitions)
            if not isinstance(chosen, int) or isinstance(chosen, bool) or not 0 <= chosen < partitions:
                raise ValueError(f"message_router chose {chosen!r}; a partition is 0..{partitions - 1}")
            return chosen
        if message.key:
            return key_partition(message.key, partitions, self.hashing_scheme)
        if self.mode == PartitionsRoutingMode.UseSinglePartition:
            return self._single % partitions
        self._cursor += 1
        return self._cursor % partitions
