"""The hashes that choose a keyed message's partition, against the values Pulsar's clients
pin in their own tests (the C++ client's ``HashTest``, "same as the Java client"): a key must
land in the partition every other client would send it to."""

from __future__ import annotations

import pytest

from api.client.routing import java_string_hash, key_partition, murmur3_32_hash
from service.partition_routing import RoundRobin


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("keykeykeykeykey1", 434058482),  # overflows 32 bits
        ("keykeykey2", 42978643),  # negative as Java's signed int
    ],
)
def test_java_string_hash_is_the_java_clients(key: str, expected: int) -> None:
    assert java_string_hash(key.encode()) & 0x7FFFFFFF == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("k1", 2110152746),
        ("k2", 1479966664),
        ("key1", 462881061),
        ("key2", 1936800180),
        ("key01", 39696932),
        ("key02", 751761803),
    ],
)
def test_murmur3_32_hash_is_the_java_clients(key: str, expected: int) -> None:
    assert murmur3_32_hash(key.encode()) & 0x7FFFFFFF == expected


def test_murmur3_32_hash_is_murmurhash3_x86_32() -> None:
    # MurmurHash3's published values for seed 0, covering every tail length.
    assert murmur3_32_hash(b"") == 0
    assert murmur3_32_hash(b"hello") == 0x248BFA47
    assert murmur3_32_hash(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723


def test_a_key_partition_is_within_the_count_and_by_scheme() -> None:
    for scheme in ("BoostHash", "JavaStringHash", "Murmur3_32Hash"):
        chosen = {key_partition(f"k{i}", 5, scheme) for i in range(200)}
        assert chosen == set(range(5))
    assert key_partition("key1", 1000, "Murmur3_32Hash") == 462881061 % 1000
    with pytest.raises(KeyError):
        key_partition("k", 3, "Md5")


def test_keyless_messages_go_round_robin_per_topic() -> None:
    rr = RoundRobin()
    assert [rr.next("a", 3) for _ in range(4)] == [0, 1, 2, 0]
    assert rr.next("b", 3) == 0  # each partitioned topic keeps its own turn
