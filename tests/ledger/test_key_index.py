"""Key indexes read by a delta round's probe: kept per process on object storage, by the
checksum the manifest records, so that a name written again with other bytes is read again."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ledger import key_index
from ledger.checksums import IntegrityError, file_checksum
from ledger.storage import Storage, StoragePath


def put_index(storage: Storage, path: StoragePath, keys: list[str | None]) -> str:
    table = key_index.build(pa.array(keys, pa.string()), np.zeros(len(keys), bool), np.arange(len(keys)))
    staged = path.staging()
    key_index.write(staged, table)
    path.publish(staged)
    return file_checksum(path)


def keys_of(path: StoragePath, checksum: str | None, rows: int = 3) -> list[str | None]:
    return key_index.read_cached(path, rows=rows, checksum=checksum).column(key_index.KEY).to_pylist()


def test_an_index_is_read_again_when_its_checksum_changes(storage: Storage) -> None:
    path = storage.at("compacted-00000000000000000007/part-00000.keys.arrow")
    first = put_index(storage, path, ["a", "b", None])
    assert keys_of(path, first) == ["a", "b", None]
    second = put_index(storage, path, ["c", "d", "e"])  # the same name, other bytes
    assert second != first
    assert keys_of(path, second) == ["c", "d", "e"]
    # Without a checksum (an older manifest) nothing is kept: the file as it is now.
    assert keys_of(path, None) == ["c", "d", "e"]


def test_on_object_storage_a_probe_reads_an_index_once_per_process(storage: Storage) -> None:
    path = storage.at("compacted-00000000000000000009/part-00000.keys.arrow")
    checksum = put_index(storage, path, ["a", "b", "c"])
    assert keys_of(path, checksum) == ["a", "b", "c"]
    path.unlink()
    if path.local is not None:  # memory-mapped from the page cache, not kept
        with pytest.raises(IntegrityError, match="gone"):
            keys_of(path, checksum)
    else:  # kept: the next round's probe asks the store nothing
        assert keys_of(path, checksum) == ["a", "b", "c"]


def test_an_index_of_other_rows_than_its_part_is_refused(storage: Storage) -> None:
    path = storage.at("compacted-00000000000000000008/part-00000.keys.arrow")
    checksum = put_index(storage, path, ["a", "b"])
    with pytest.raises(IntegrityError, match="holds 2 rows"):
        key_index.read_cached(path, rows=3, checksum=checksum)
