"""The LRU of open readers: bounded by count and bytes, never closes a reader in use."""

from __future__ import annotations

import threading
import time

import pytest

from ledger.file_cache import FileCache


class FakeReader:
    """A reader that records its closing (the cache's contract is only close/cached_bytes)."""

    def __init__(self, name: str, weight: int = 0) -> None:
        self.name = name
        self.weight = weight
        self.closed = 0

    def cached_bytes(self) -> int:
        return self.weight

    def close(self) -> None:
        self.closed += 1


def opener(made: list[FakeReader], name: str, weight: int = 0):
    def make() -> FakeReader:
        r = FakeReader(name, weight)
        made.append(r)
        return r

    return make


def test_least_recently_used_reader_is_closed_beyond_max_open() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=2, max_bytes=1 << 30)
    made: list[FakeReader] = []
    for key in ["a", "b", "a", "c"]:
        with cache.use(key, opener(made, key)):
            pass
    assert [r.name for r in made] == ["a", "b", "c"]  # "a" was a hit
    assert [r.closed for r in made] == [0, 1, 0]  # "b" was least recently used
    st = cache.stats()
    assert (st.open, st.hits, st.misses, st.evictions) == (2, 1, 3, 1)


def test_decoded_bytes_bound_evicts_too() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=10, max_bytes=100)
    made: list[FakeReader] = []
    for key in "abc":
        with cache.use(key, opener(made, key, weight=40)):
            pass
    assert [r.closed for r in made] == [1, 0, 0]
    assert cache.stats().cached_bytes == 80


def test_a_reader_in_use_is_not_closed_until_its_read_ends() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=1, max_bytes=1 << 30)
    made: list[FakeReader] = []
    with cache.use("a", opener(made, "a")) as a:
        with cache.use("b", opener(made, "b")):
            assert a.closed == 0  # over the bound while both are in use
            assert len(cache) == 2
        assert a.closed == 0
    assert len(cache) == 1 and sum(r.closed for r in made) == 1


def test_discard_closes_matching_readers_once_free() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=8, max_bytes=1 << 30)
    made: list[FakeReader] = []
    with cache.use("x/1", opener(made, "x/1")) as held:
        with cache.use("y/1", opener(made, "y/1")):
            pass
        assert cache.discard(lambda k: k.startswith("x/")) == 1
        assert held.closed == 0
    assert held.closed == 1 and made[1].closed == 0
    cache.clear()
    assert all(r.closed == 1 for r in made) and len(cache) == 0


def test_concurrent_misses_on_one_key_keep_one_reader() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=4, max_bytes=1 << 30)
    made: list[FakeReader] = []
    barrier = threading.Barrier(8)

    def slow() -> FakeReader:
        r = FakeReader("k")
        made.append(r)
        return r

    def go() -> None:
        barrier.wait()
        with cache.use("k", slow):
            pass

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) == 1
    assert sum(1 for r in made if r.closed == 0) == 1  # the spares were closed


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        FileCache(max_open=0, max_bytes=1)


def test_readers_idle_for_long_are_closed() -> None:
    cache: FileCache[str, FakeReader] = FileCache(max_open=8, max_bytes=1 << 30, idle_s=0.05)
    made: list[FakeReader] = []
    with cache.use("old", opener(made, "old")):
        pass
    time.sleep(0.1)
    with cache.use("new", opener(made, "new")):
        assert cache.close_idle() == 1
    assert [r.closed for r in made] == [1, 0]
    assert cache.close_idle() == 0 and len(cache) == 1
