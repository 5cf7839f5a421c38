"""Compacted ledgers on disk: the manifest, and reads by message id against a list model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.checksums import DECODE, FILE_CHECKSUM, MISSING, IntegrityError, file_checksum
from ledger.compacted_store import CompactedLedger, CompactedLedgerError, Manifest
from ledger.entry import Entry, Position
from ledger.manifest_writer import write_manifest
from ledger.schema import ARROW_SCHEMA, entries_to_table
from tests.ledger.compacted_parts import entry, sparse_entries, split, write_parts

# ------------------------------------------------------------------ factories


def make_ledger(directory: Path, parts: list[list[Entry]], *, row_group_size: int = 3) -> CompactedLedger:
    write_parts(directory, parts, row_group_size=row_group_size)
    write_manifest(directory)
    return CompactedLedger(directory)


def model_read(model: list[Entry], start: Position, max_entries: int) -> tuple[list[Entry], Position | None]:
    rest = [e for e in model if e.position >= start]
    page = rest[:max_entries]
    return page, (rest[max_entries].position if len(rest) > max_entries else None)


def candidate_starts(model: list[Entry]) -> list[Position]:
    """Every present id, the ids right before and after each, ids between ledgers, and far ends."""
    starts = {Position(0, 0), Position(1, 5), Position(2**62, 0)}
    for e in model:
        starts |= {e.position, Position(e.ledger_id, e.entry_id + 1), Position(e.ledger_id + 1, 0)}
        if e.entry_id > 0:
            starts.add(Position(e.ledger_id, e.entry_id - 1))
    return sorted(starts)


# ------------------------------------------------------------------ manifest


def test_a_ledger_without_manifest_is_incomplete(tmp_path: Path) -> None:
    write_parts(tmp_path, [sparse_entries()])
    with pytest.raises(CompactedLedgerError, match="incomplete"):
        CompactedLedger(tmp_path)


def test_empty_ledger(tmp_path: Path) -> None:
    ledger = make_ledger(tmp_path, [[]])
    assert ledger.entries == 0
    assert ledger.size_bytes == 0
    assert ledger.first_position is None and ledger.last_position is None
    assert ledger.part_paths() == []
    assert ledger.read(Position(0, 0), 10) == ([], None)


# ------------------------------------------------------------------ reads


@pytest.mark.parametrize("sizes", [[25], [4, 7, 1, 13], [1] * 25])
@pytest.mark.parametrize("row_group_size", [1, 3, 100])
def test_read_from_every_start_equals_the_model(
    tmp_path: Path, sizes: list[int], row_group_size: int
) -> None:
    model = sparse_entries()
    ledger = make_ledger(tmp_path, split(model, sizes), row_group_size=row_group_size)
    assert ledger.entries == len(model)
    for start in candidate_starts(model):
        for max_entries in (0, 1, 2, 5, 1000):
            assert ledger.read(start, max_entries) == model_read(model, start, max_entries), (
                start,
                max_entries,
            )
        assert ledger.seek(start) == model_read(model, start, 0)[1]


@pytest.mark.parametrize("page", [1, 2, 3, 4, 7, 26, 27])
def test_pages_stitch_together(tmp_path: Path, page: int) -> None:
    model = sparse_entries()
    ledger = make_ledger(tmp_path, split(model, [4, 7, 1, 13]))
    got: list[Entry] = []
    start: Position | None = Position(0, 0)
    while start is not None:
        entries, start = ledger.read(start, page)
        assert len(entries) <= page
        got.extend(entries)
    assert got == model


def test_values_properties_and_tombstones_round_trip(tmp_path: Path) -> None:
    rows = [
        entry(1, 0, key="a", value=b""),
        entry(1, 1, key="b", value=None),
        Entry(1, 2, None, b"\x00\xff", {"x": "y", "": ""}, 5, None),
    ]
    ledger = make_ledger(tmp_path, [rows])
    entries, nxt = ledger.read(Position(1, 0), 10)
    assert entries == rows and nxt is None
    assert entries[1].value is None and entries[0].value == b""
    assert entries[2].properties == {"x": "y", "": ""}


def test_reading_from_a_part_start_needs_no_id_columns(tmp_path: Path) -> None:
    model = sparse_entries()
    parts = split(model, [4, 7, 1, 13])
    ledger = make_ledger(tmp_path, parts)
    ledger.read(parts[1][0].position, 3)
    assert len(ledger._ids) == 1  # only the part the page ends in, to name the next id
    ledger.close()
    ledger.read(parts[2][0].position, 1)
    assert len(ledger._ids) == 0


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 30)), min_size=0, max_size=40, unique=True).map(
        sorted
    ),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    row_group_size=st.integers(1, 5),
    start=st.tuples(st.integers(0, 7), st.integers(0, 32)),
    max_entries=st.integers(0, 12),
)
def test_read_matches_model_property(
    ids: list[tuple[int, int]], cuts: list[int], row_group_size: int, start: tuple[int, int], max_entries: int
) -> None:
    model = [entry(lid, eid) for lid, eid in ids]
    bounds = sorted({0, len(model), *(min(c, len(model)) for c in cuts)})
    parts = [model[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [[]]
    with tempfile.TemporaryDirectory() as d:
        ledger = make_ledger(Path(d), parts, row_group_size=row_group_size)
        pos = Position(*start)
        assert ledger.read(pos, max_entries) == model_read(model, pos, max_entries)


def test_negative_page_size_is_refused(tmp_path: Path) -> None:
    ledger = make_ledger(tmp_path, [sparse_entries()])
    with pytest.raises(ValueError):
        ledger.read(Position(0, 0), -1)


def test_spark_style_nullable_schema_reads_the_same(tmp_path: Path) -> None:
    """Spark writes every column nullable; the reader must not care."""
    model = sparse_entries()[:6]
    nullable = pa.schema([f.with_nullable(True) for f in ARROW_SCHEMA])
    tmp_path.mkdir(exist_ok=True)
    pq.write_table(entries_to_table(model).cast(nullable), tmp_path / "part-00000-s-c000.zstd.parquet")
    write_manifest(tmp_path)
    assert CompactedLedger(tmp_path).read(Position(0, 0), 100) == (model, None)


# ------------------------------------------------------------------ layers and deletion vectors


def make_layered(
    root: Path, layers: list[list[list[Entry]]], dead: list[set[int]], *, row_group_size: int = 3
) -> CompactedLedger:
    """A ledger whose layer ``i`` is in ``compacted-{i}`` with parts ``layers[i]`` and the layer
    rows ``dead[i]`` marked dead; the manifest goes in the last layer's directory."""
    from ledger import deletion_vectors
    from ledger.layers import BASE, DELTA, Deletes, Layer

    out = []
    for i, parts in enumerate(layers):
        directory = root / f"compacted-{i + 1:020d}"
        write_parts(directory, parts, row_group_size=row_group_size)
        layer = write_manifest(directory).layers[0] if any(parts) else None
        if layer is None:
            continue
        deletes = None
        if dead[i]:
            vector = deletion_vectors.empty(layer.rows)
            vector[sorted(dead[i])] = True
            name = f"deletes-{i:020d}.npy"
            deletion_vectors.write(directory / name, vector)
            checksum = file_checksum(directory / name)
            deletes = Deletes(dir=directory.name, name=name, count=len(dead[i]), checksum=checksum)
        out.append(Layer(dir=layer.dir, kind=BASE if not out else DELTA, parts=layer.parts, deletes=deletes))
    top = root / f"compacted-{len(layers):020d}"
    Manifest(layers=tuple(out)).write(top)
    return CompactedLedger(top)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=1, max_size=4),
    dead_seed=st.randoms(use_true_random=False),
    row_group_size=st.integers(1, 4),
    start=st.integers(0, 60),
    page=st.integers(1, 9),
)
def test_layered_reads_skip_dead_rows_and_match_the_model(
    sizes: list[list[int]], dead_seed, row_group_size: int, start: int, page: int
) -> None:
    ids = iter(range(0, 1000, 2))  # sparse, increasing across layers as rounds leave them
    layers = [[[entry(7, next(ids)) for _ in range(n)] for n in layer] for layer in sizes]
    dead: list[set[int]] = []
    live: list[Entry] = []
    for layer in layers:
        rows = [e for part in layer for e in part]
        gone = {r for r in range(len(rows)) if dead_seed.random() < 0.4}
        dead.append(gone)
        live.extend(e for r, e in enumerate(rows) if r not in gone)
    with tempfile.TemporaryDirectory() as d:
        ledger = make_layered(Path(d), layers, dead, row_group_size=row_group_size)
        assert ledger.entries == len(live)
        pos = Position(7, start)
        assert ledger.read(pos, page) == model_read(live, pos, page)
        assert ledger.count_from(pos) == len([e for e in live if e.position >= pos])
        got: list[Entry] = []
        at: Position | None = Position(0, 0)
        while at is not None:
            entries, at = ledger.read(at, page)
            got.extend(entries)
        assert got == live
        assert ledger.first_position == (live[0].position if live else None)
        assert ledger.last_position == (live[-1].position if live else None)


def test_a_layered_manifest_names_every_file_it_needs(tmp_path: Path) -> None:
    model = sparse_entries()
    ledger = make_layered(tmp_path, [[model[:10]], [model[10:]]], [{1, 3}, set()])
    files = ledger.manifest.files()
    assert all((tmp_path / f).is_file() for f in files)
    assert f"compacted-{1:020d}/deletes-{0:020d}.npy" in files
    assert ledger.manifest.deltas == 1 and ledger.manifest.dead == 2
    assert [e.position for e in ledger.read(Position(0, 0), 100)[0]] == [
        e.position for i, e in enumerate(model) if i not in (1, 3)
    ]


# ------------------------------------------------------------------ integrity of layered ledgers


def test_a_layered_manifest_carries_the_checksum_of_every_file_it_names(tmp_path: Path) -> None:
    model = sparse_entries()
    ledger = make_layered(tmp_path, [[model[:10]], [model[10:]]], [{1, 3}, set()])
    named = ledger.manifest.checked_files()
    assert {f"{f.dir}/{f.name}" for f in named} == ledger.manifest.files()
    for f in named:
        assert f.checksum == file_checksum(f.path(tmp_path)), f.name


def test_a_damaged_deletion_vector_is_an_integrity_error_never_rows(tmp_path: Path) -> None:
    model = sparse_entries()
    ledger = make_layered(tmp_path, [[model[:10]], [model[10:]]], [{1, 3}, set()])
    deletes = ledger.manifest.layers[0].deletes
    assert deletes is not None
    path = tmp_path / deletes.dir / deletes.name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # bit 8 of the layer's rows: row 8 would come back as dead
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as caught:
        CompactedLedger(ledger.directory).read(Position(0, 0), 100)
    assert caught.value.check == FILE_CHECKSUM and caught.value.path == path
    assert "deletes-" in str(caught.value)
    path.unlink()
    with pytest.raises(IntegrityError) as caught:
        CompactedLedger(ledger.directory).count_from(Position(0, 0))
    assert caught.value.check == MISSING


def test_deletion_vectors_and_key_indexes_that_do_not_decode_are_integrity_errors(tmp_path: Path) -> None:
    from ledger import deletion_vectors, key_index

    vector = tmp_path / "deletes.npy"
    deletion_vectors.write(vector, deletion_vectors.empty(20))
    with pytest.raises(IntegrityError) as caught:
        deletion_vectors.read(vector, 30)  # a vector of another layer's size
    assert caught.value.check == DECODE
    vector.write_bytes(vector.read_bytes()[:20])
    with pytest.raises(IntegrityError) as caught:
        deletion_vectors.read(vector, 20)
    assert caught.value.check == DECODE

    index = tmp_path / "part-00000.keys.arrow"
    keys = pa.array(["a", "b", None])
    key_index.write(index, key_index.build(keys, np.zeros(3, dtype=bool), np.zeros(3, dtype=np.int64)))
    assert key_index.read(index, rows=3).column(key_index.KEY).to_pylist() == ["a", "b", None]
    with pytest.raises(IntegrityError) as caught:
        key_index.read(index, rows=4)  # the part has a row the index does not
    assert caught.value.check == DECODE
    index.write_bytes(index.read_bytes()[:-40])
    with pytest.raises(IntegrityError) as caught:
        key_index.read(index, rows=3)
    assert caught.value.check == DECODE
