"""The cache of hot row groups: its bound and eviction alone, then sealed and compacted ledgers
read through it on both storage backends (a local directory, and a real S3-compatible server
when ``COMPACTOR_TEST_S3_SETTINGS`` is given) return what they return without it."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ledger import deletion_vectors
from ledger.checksums import WRITE_OPTIONS, IntegrityError, file_checksum
from ledger.compacted_store import CompactedLedger
from ledger.entry import Entry, Position
from ledger.layers import BASE, DELTA, Deletes, Layer, Manifest
from ledger.manifest_writer import write_manifest
from ledger.parquet_store import SealedLedger, seal
from ledger.row_group_cache import PROTECTED_SHARE, RowGroupCache, RowGroupKey
from ledger.schema import entries_to_table
from ledger.storage import Storage, StoragePath

# The ``storage`` fixture (a local directory, and a prefix of the test bucket) is tests/conftest.py's.

KIB = 1024


def table_of(kib: int, tag: int = 0) -> pa.Table:
    """A table whose ``nbytes`` is ``kib`` KiB."""
    return pa.table({"x": np.full(kib * KIB // 8, tag, dtype=np.int64)})


def key(i: int, file: str = "f") -> RowGroupKey:
    return RowGroupKey(file, 1000, i)


# ------------------------------------------------------------------ the cache alone


def test_it_holds_at_most_its_bound_and_drops_the_least_recently_used_first() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    for i in range(10):
        cache.put(key(i), table_of(20, i))
        assert cache.stats().cached_bytes <= 100 * KIB
    assert len(cache) == 5
    assert [cache.get(key(i)) is not None for i in range(10)] == [False] * 5 + [True] * 5
    st = cache.stats()
    assert (st.entries, st.cached_bytes, st.evictions) == (5, 100 * KIB, 5)
    assert (st.hits, st.misses) == (5, 5)


def test_a_hit_returns_the_table_put() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    t = table_of(10, 7)
    cache.put(key(1), t)
    assert cache.get(key(1)) is t
    assert cache.get(RowGroupKey("f", 999, 1)) is None  # another size: another file
    assert cache.get(RowGroupKey("f", 1000, 1, "entries")) is None  # another view of it


def test_row_groups_read_twice_survive_a_scan_larger_than_the_cache() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    hot = [key(i, "compacted") for i in range(3)]
    for k in hot:
        cache.put(k, table_of(10))
        assert cache.get(k) is not None  # read again: protected
    for i in range(50):  # a consumer of a long log, each row group read once
        cache.put(key(i, "log"), table_of(10))
    assert all(cache.get(k) is not None for k in hot)
    assert cache.stats().cached_bytes <= 100 * KIB


def test_the_protected_segment_keeps_to_its_share() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    for i in range(10):
        cache.put(key(i), table_of(10))
        cache.get(key(i))
    # Everything was read twice, but only PROTECTED_SHARE of the bytes stay protected: the rest
    # went back on probation, and a scan drops those first.
    for i in range(100, 120):
        cache.put(key(i), table_of(10))
    survivors = [i for i in range(10) if cache.get(key(i)) is not None]
    assert survivors == list(range(10 - int(PROTECTED_SHARE * 10), 10))


def test_a_table_too_large_to_share_the_cache_is_not_kept() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    cache.put(key(1), table_of(10))
    cache.put(key(2), table_of(30))  # more than a quarter
    assert cache.get(key(2)) is None and cache.get(key(1)) is not None


def test_off_it_keeps_and_counts_nothing() -> None:
    cache = RowGroupCache()
    assert not cache.enabled
    cache.put(key(1), table_of(1))
    assert cache.get(key(1)) is None
    assert cache.stats() == cache.stats().__class__(0, 0, 0, 0, 0, 0)


def test_resizing_evicts_down_to_the_new_bound_and_zero_empties_it() -> None:
    cache = RowGroupCache(max_bytes=100 * KIB)
    for i in range(10):
        cache.put(key(i), table_of(10))
    cache.resize(50 * KIB)
    assert cache.stats().cached_bytes <= 50 * KIB and len(cache) == 5
    assert cache.get(key(9)) is not None
    cache.resize(0)
    assert len(cache) == 0 and cache.stats().cached_bytes == 0
    with pytest.raises(ValueError, match="max_bytes"):
        cache.resize(-1)


def test_concurrent_readers_keep_the_bound_and_the_counts() -> None:
    cache = RowGroupCache(max_bytes=64 * KIB)
    tables = [table_of(4, i) for i in range(40)]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(2000):
                i = int(rng.integers(0, 40))
                found = cache.get(key(i))
                if found is None:
                    cache.put(key(i), tables[i])
                else:
                    assert found is tables[i]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    st = cache.stats()
    assert st.cached_bytes <= 64 * KIB and st.hits + st.misses == 8000
    assert st.cached_bytes == sum(tables[i].nbytes for i in range(40) if cache.get(key(i)) is not None)


# ------------------------------------------------------------------ sealed ledgers through it, both


def entries(ledger_id: int, n: int) -> list[Entry]:
    return [
        Entry(
            ledger_id=ledger_id,
            entry_id=i,
            key=f"k{i % 37}",
            value=None if i % 11 == 0 else f"value-{i}".encode() * 3,
            properties={"i": str(i)} if i % 5 == 0 else {},
            publish_time=1_000 + i,
            event_time=i if i % 3 == 0 else None,
        )
        for i in range(n)
    ]


def read_all_sealed(reader: SealedLedger, page: int) -> list[Entry]:
    out: list[Entry] = []
    while chunk := reader.read(len(out), page):
        out.extend(chunk)
    return out


@pytest.mark.parametrize("page", [7, 100, 1000])
def test_a_sealed_ledger_reads_the_same_through_the_cache(storage: Storage, page: int) -> None:
    model = entries(4, 700)
    path = storage.at("ledgers/t/n/x/00000000000000000004.parquet")
    seal(model, path, row_group_size=64)
    cache = RowGroupCache(max_bytes=16 << 20)
    without = SealedLedger(path, ledger_id=4, cache=RowGroupCache())
    first = SealedLedger(path, ledger_id=4, cache=cache)
    assert read_all_sealed(without, page) == model
    assert read_all_sealed(first, page) == model
    misses = cache.stats().misses
    assert misses == 11 and len(cache) == 11  # each row group decoded once
    # Another reader of the file (another consumer, a reopened file) decodes nothing.
    again = SealedLedger(path, ledger_id=4, cache=cache)
    assert read_all_sealed(again, page) == model
    assert cache.stats().misses == misses and cache.stats().hits >= 11
    for r in (without, first, again):
        r.close()


def test_the_scrubs_row_group_reads_the_file_not_the_cache(storage: Storage) -> None:
    path = storage.at("ledgers/t/n/x/00000000000000000005.parquet")
    model = entries(5, 300)
    seal(model, path, row_group_size=100)
    cache = RowGroupCache(max_bytes=16 << 20)
    reader = SealedLedger(path, ledger_id=5, cache=cache)
    assert read_all_sealed(reader, 50) == model
    reader.close()
    damage_value_page(path, row_group=1)
    damaged = SealedLedger(path, ledger_id=5, cache=cache)
    assert damaged.read(100, 100) == model[100:200]  # checked when it was decoded, then kept
    with pytest.raises(IntegrityError):
        damaged.row_group(1)
    assert SealedLedger(path, ledger_id=5, cache=RowGroupCache()).read(0, 100) == model[:100]
    with pytest.raises(IntegrityError):
        SealedLedger(path, ledger_id=5, cache=RowGroupCache()).read(100, 100)


def damage_value_page(path: StoragePath, *, row_group: int) -> None:
    """Flip a byte inside the value column's data of ``row_group``: same size, a bad page."""
    data = bytearray(path.read_bytes())
    meta = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(row_group).column(names.index("value"))
    at = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------ compacted ledgers through it, both


def compacted_entry(ledger_id: int, entry_id: int, key: int, value: bytes) -> Entry:
    return Entry(
        ledger_id=ledger_id,
        entry_id=entry_id,
        key=f"k{key}",
        value=value + str(key).encode(),
        properties={},
        publish_time=1_000 + entry_id,
        event_time=None,
    )


def write_part(path: StoragePath, rows: list[Entry], row_group_size: int) -> None:
    with path.writer() as out:
        pq.write_table(entries_to_table(rows), out, row_group_size=row_group_size, **WRITE_OPTIONS)  # type: ignore[arg-type]


def read_all_compacted(ledger: CompactedLedger, page: int) -> list[Entry]:
    out: list[Entry] = []
    at: Position | None = Position(0, 0)
    while at is not None:
        chunk, at = ledger.read(at, page)
        out.extend(chunk)
    return out


def test_compacted_ledgers_sharing_a_part_read_their_own_live_rows_through_one_cache(
    storage: Storage,
) -> None:
    """Two manifests name one base part with different deletion vectors (a round and the next):
    the cache holds the part's rows, each reader drops its own dead ones."""
    topic = storage.at("ledgers/t/n/x")
    base_rows = [compacted_entry(7, 2 * i, i, b"v") for i in range(500)]
    delta_rows = [compacted_entry(9, i, i, b"w") for i in range(0, 200, 3)]
    base_dir, delta_dir = topic / "compacted-00000000000000000008", topic / "compacted-00000000000000000010"
    for i, rows in enumerate((base_rows[:300], base_rows[300:])):
        write_part(base_dir / f"part-{i:05d}.parquet", rows, row_group_size=40)
    first = write_manifest(base_dir)
    write_part(delta_dir / "part-00000.parquet", delta_rows, row_group_size=40)
    delta = write_manifest(delta_dir).layers[0]
    dead = deletion_vectors.empty(first.rows)
    superseded = {int(e.key[1:]) for e in delta_rows}  # type: ignore[index]
    dead[sorted(superseded)] = True
    vector = delta_dir / "deletes-00000000000000000008.npy"
    deletion_vectors.write(vector, dead)
    deletes = Deletes(
        dir=delta_dir.name, name=vector.name, count=len(superseded), checksum=file_checksum(vector)
    )
    (base,) = first.layers
    layered = Manifest(
        layers=(
            Layer(dir=base.dir, kind=BASE, parts=base.parts, deletes=deletes),
            Layer(dir=delta.dir, kind=DELTA, parts=delta.parts),
        )
    )
    layered.write(delta_dir)
    live = [e for i, e in enumerate(base_rows) if i not in superseded] + delta_rows

    cache = RowGroupCache(max_bytes=16 << 20)
    for page in (1, 33, 1000):
        assert read_all_compacted(CompactedLedger(base_dir, cache=RowGroupCache()), page) == base_rows
        assert read_all_compacted(CompactedLedger(base_dir, cache=cache), page) == base_rows
        assert read_all_compacted(CompactedLedger(delta_dir, cache=RowGroupCache()), page) == live
        assert read_all_compacted(CompactedLedger(delta_dir, cache=cache), page) == live
    st = cache.stats()
    assert st.misses == len(cache) == 13 + 2  # every row group decoded once: 8 + 5 base, 2 delta
    assert st.hits > 0
    # A page from any start, through the warm cache, equals the model too.
    ledger = CompactedLedger(delta_dir, cache=cache)
    for start in (Position(7, 0), Position(7, 301), Position(7, 998), Position(9, 0), Position(9, 100)):
        rest = [e for e in live if e.position >= start]
        got, nxt = ledger.read(start, 25)
        assert got == rest[:25] and nxt == (rest[25].position if len(rest) > 25 else None)
    assert cache.stats().misses == st.misses
