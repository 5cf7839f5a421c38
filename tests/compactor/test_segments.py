"""Reading segments (``compactor.segments``): the properties read as Arrow dictionaries where
every chunk of them is dictionary-encoded, and files opened ahead of the reader on object storage."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactor.segments import Segment, _chunks, _dictionary_properties, _opened_ahead, bound
from ledger.parquet_store import SEAL_WRITER_OPTIONS
from ledger.schema import ARROW_SCHEMA
from ledger.storage import Storage, as_storage_path

# ---------------------------------------------------------------- properties as dictionaries


def _ledger_table(ledger_id: int, properties: list[list[tuple[str, str]]], keys: str = "k") -> pa.Table:
    """A sealed ledger's rows, entry ``e`` with key ``{keys}{e % 7}``, value ``v{e}`` and the
    given properties."""
    n = len(properties)
    nulls: list[None] = [None] * n
    return pa.table(
        {
            "ledger_id": [ledger_id] * n,
            "entry_id": list(range(n)),
            "key": [f"{keys}{e % 7}" for e in range(n)],
            "value": [f"v{e}".encode() for e in range(n)],
            "is_tombstone": [False] * n,
            "properties": properties,
            "publish_time": [1_000 + e for e in range(n)],
            "event_time": nulls,
            "batch_index": nulls,
            "batch_size": nulls,
            "producer_name": nulls,
            "sequence_id": nulls,
            "deliver_at_time": nulls,
            "ordering_key": nulls,
            "schema_version": nulls,
        },
        schema=ARROW_SCHEMA,
    )


def _repeating(n: int) -> list[list[tuple[str, str]]]:
    """Four properties on every message, from a handful of values (dictionary pages)."""
    return [
        [("source", f"svc-{e % 3}"), ("schema", f"v{e % 2}"), ("n", str(e)), ("p", "x")] for e in range(n)
    ]


def _overflowing(n: int) -> list[list[tuple[str, str]]]:
    """Two long distinct properties on every message: the dictionary outgrows pyarrow's limit
    and the rest of each chunk is written in plain pages."""
    return [[("trace", f"{e:08d}" + "t" * 300), ("span", f"{e:08d}" + "s" * 300)] for e in range(n)]


def _write_ledger(path: Path, table: pa.Table, row_group_size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size, **SEAL_WRITER_OPTIONS)  # type: ignore[arg-type]
    return path


def test_properties_are_read_as_dictionaries_only_where_every_chunk_is_dictionary_encoded(
    tmp_path: Path,
) -> None:
    def decided(properties: list[list[tuple[str, str]]]) -> list[str] | None:
        path = _write_ledger(
            tmp_path / f"{len(properties)}-{id(properties)}.parquet", _ledger_table(1, properties), 4_000
        )
        return _dictionary_properties(pq.read_metadata(path))

    leaves = ["properties.key_value.key", "properties.key_value.value"]
    assert decided(_repeating(10_000)) == leaves
    # Plain pages after an outgrown dictionary would be hashed into one, at twice the cost.
    assert decided(_overflowing(10_000)) is None
    # No properties, or one per message: not worth a read per row group.
    assert decided([[] for _ in range(10_000)]) is None
    assert decided([[("n", str(e % 5))] for e in range(10_000)]) is None


@pytest.mark.parametrize("chunk_rows", [3, 5, 7, 1_000])
def test_properties_read_as_dictionaries_stay_with_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int
) -> None:
    # Row groups of 5 rows, each with a dictionary of its own, read in chunks that end inside
    # a row group, at its end, or span several.
    monkeypatch.setattr("compactor.segments._CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr("compactor.segments._MIN_CHUNK_ROWS", chunk_rows)
    properties = _repeating(23)
    path = _write_ledger(tmp_path / "l.parquet", _ledger_table(4, properties), 5)
    segment = Segment(as_storage_path(path), bound(4, -1), bound(4, 22), size=path.stat().st_size)
    columns = [c for c in ARROW_SCHEMA.names if c != "key"]
    got: dict[int, list[tuple[str, str]]] = {}
    for table, ids in _chunks(segment, columns, dictionaries=True):
        kind = table.schema.field("properties").type
        assert pa.types.is_dictionary(kind.key_type) and pa.types.is_dictionary(kind.item_type)
        assert table.column_names == columns
        for entry, props in zip(
            table.column("entry_id").to_pylist(), table.column("properties").to_pylist(), strict=True
        ):
            got[entry] = props
        assert list(ids) == [bound(4, e) for e in table.column("entry_id").to_pylist()]
    assert got == dict(enumerate(properties))


# ---------------------------------------------------------------- opening ahead


@pytest.mark.parametrize(("ahead", "ahead_bytes", "most"), [(8, 64 << 20, 9), (8, 250, 3), (0, 1, 1)])
def test_a_reader_opens_files_ahead_within_its_bounds(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, ahead: int, ahead_bytes: int, most: int
) -> None:
    # On object storage the files after the one being decoded are fetched meanwhile: at most
    # ``ahead`` of them, of at most ``ahead_bytes`` in all, and always the one to read next.
    if storage.at().local is not None:
        pytest.skip("on a local disk the page cache reads ahead")
    segments = [Segment(storage.at(f"t/{i:02d}.parquet"), 0, 1, size=100) for i in range(12)]
    opened: list[str] = []

    def record(
        segment: Segment, columns: list[str], only: object = None, *, dictionaries: bool = False
    ) -> None:
        opened.append(segment.path.name)

    monkeypatch.setattr("compactor.segments._OPEN_AHEAD", ahead)
    monkeypatch.setattr("compactor.segments._OPEN_AHEAD_BYTES", ahead_bytes)
    monkeypatch.setattr("compactor.segments._open", record)
    seen: list[str] = []
    in_flight: list[int] = []
    for segment, _ in _opened_ahead(segments, ["key"]):
        seen.append(segment.path.name)
        assert opened[: len(seen)] == seen  # opened in order, this one among them
        in_flight.append(len(opened) - len(seen) + 1)
    assert seen == opened == [s.path.name for s in segments]
    # As many in flight as the bounds allow, counting the one being read (fewer at the end).
    assert in_flight[0] == most and max(in_flight) == most
