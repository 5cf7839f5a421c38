"""The storage interface's contract, run against both backends: a local directory, and a real
S3-compatible server (Ceph's object gateway, started by ``.ci/s3``; ``.ci/run`` hands its
settings to the tests in ``COMPACTOR_TEST_S3_SETTINGS``, as ``NAME=value`` lines)."""

from __future__ import annotations

import os
import pickle
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from ledger import storage as storage_module
from ledger.storage import S3Settings, Storage, StorageError, check_storage, open_storage
from tests.server import S3_ENV, s3_settings

# The ``storage`` fixture (a local directory, and a prefix of the test bucket) is tests/conftest.py's.


def test_a_file_put_is_read_listed_and_deleted(storage: Storage) -> None:
    storage.put("ledgers/t/n/x/00000000000000000001.parquet", b"sealed")
    storage.put("ledgers/t/n/x/compacted-00000000000000000002/part-0.parquet", b"part")
    storage.put("ledgers/t/n/xy/other", b"sibling")
    assert storage.read("ledgers/t/n/x/00000000000000000001.parquet") == b"sealed"
    assert storage.size("ledgers/t/n/x/00000000000000000001.parquet") == 6
    assert storage.size("ledgers/t/n/x/none") is None and not storage.exists("ledgers/t/n/x/none")
    assert [(f.key, f.size) for f in storage.list("ledgers/t/n/x")] == [
        ("ledgers/t/n/x/00000000000000000001.parquet", 6),
        ("ledgers/t/n/x/compacted-00000000000000000002/part-0.parquet", 4),
    ]
    assert storage.list("ledgers/t/n/none") == []
    storage.delete("ledgers/t/n/x/00000000000000000001.parquet")
    storage.delete("ledgers/t/n/x/00000000000000000001.parquet")  # gone already: no error
    assert not storage.exists("ledgers/t/n/x/00000000000000000001.parquet")
    with pytest.raises(FileNotFoundError):
        storage.read("ledgers/t/n/x/00000000000000000001.parquet")
    # A topic's prefix goes with everything under it, and only that ("x", not "xy").
    storage.delete_prefix("ledgers/t/n/x")
    assert storage.list("ledgers/t/n/x") == []
    assert storage.read("ledgers/t/n/xy/other") == b"sibling"


def test_a_write_that_raises_leaves_nothing(storage: Storage) -> None:
    with pytest.raises(RuntimeError, match="cut off"), storage.writer("a/half") as out:
        out.write(b"x" * 1000)
        raise RuntimeError("cut off")
    assert not storage.exists("a/half")
    assert storage.list("a") == []  # no temporary file or object either


def test_a_large_write_spools_and_is_stored_whole(storage: Storage, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_module, "SPOOL_BYTES", 1024)  # past it, the spool is a file
    data = os.urandom(300_000)
    with storage.writer("big/object") as out:
        for i in range(0, len(data), 4096):
            out.write(data[i : i + 4096])
    assert storage.read("big/object") == data


def test_a_parquet_file_is_written_and_read_by_random_access(storage: Storage) -> None:
    table = pa.table({"key": [f"k{i}" for i in range(5000)], "value": list(range(5000))})
    with storage.writer("p/file.parquet") as out:
        pq.write_table(table, out, row_group_size=1000)
    with pq.ParquetFile(storage.open("p/file.parquet")) as pf:
        assert pf.num_row_groups == 5
        assert pf.read_row_group(3).equals(table.slice(3000, 1000))


def test_keys_are_plain_relative_paths(storage: Storage) -> None:
    for bad in ("", "/", "a//b", "a/../b", "./a"):
        with pytest.raises(ValueError, match="invalid storage key"):
            storage.put(bad, b"x")


def test_a_usable_storage_passes_its_check(storage: Storage) -> None:
    check_storage(storage)
    assert not any(f.key.startswith("probe-") for f in storage.list(""))  # the probe is gone


def test_urls_that_name_no_storage_are_refused() -> None:
    for url in ("ftp://host/x", "s3://", "s3:///prefix"):
        with pytest.raises(StorageError):
            open_storage(url)
    with pytest.raises(StorageError, match="endpoint"):
        open_storage("s3://bucket", S3Settings(endpoint_url="127.0.0.1:9000"))


def test_a_local_storage_url_may_be_a_path_or_a_file_url(tmp_path: Path) -> None:
    a = open_storage(str(tmp_path / "r"))
    b = open_storage(f"file://{tmp_path / 'r'}")
    a.put("k", b"v")
    assert b.read("k") == b"v" and a.local and b.local


@pytest.mark.skipif(s3_settings() is None, reason=f"no S3-compatible server ({S3_ENV})")
def test_a_bucket_that_does_not_exist_or_refuses_the_credentials_fails_its_check_in_one_line() -> None:
    found = s3_settings()
    assert found is not None
    endpoint = found["COMPACTOR_S3_ENDPOINT_URL"]
    missing = open_storage(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", S3Settings(endpoint_url=endpoint))
    with pytest.raises(StorageError) as e:
        check_storage(missing)
    assert "\n" not in str(e.value)
    refused = open_storage(
        found["COMPACTOR_STORAGE_URL"],
        S3Settings(endpoint_url=endpoint, access_key="nobody", secret_key="wrong"),
    )
    with pytest.raises(StorageError) as e:
        check_storage(refused)
    assert "\n" not in str(e.value)


def test_a_storage_path_names_reads_stages_and_publishes(storage: Storage) -> None:
    topic = storage.at("ledgers/t/n/x")
    sealed = topic / "00000000000000000001.parquet"
    assert (sealed.name, sealed.parent, sealed.with_name("other").key) == (
        "00000000000000000001.parquet",
        topic,
        "ledgers/t/n/x/other",
    )
    assert not sealed.exists() and topic.files() == []
    staged = sealed.staging()
    staged.write_bytes(b"rows")
    sealed.publish(staged)
    assert not staged.exists()  # published: the staged copy is gone
    assert (sealed.read_bytes(), sealed.size(), sealed.is_file()) == (b"rows", 4, True)
    (topic / "compacted-00000000000000000002" / "part-0.parquet").write_bytes(b"part")
    assert topic.files() == [sealed]
    assert [d.name for d in topic.dirs()] == ["compacted-00000000000000000002"]
    assert (topic / "compacted-00000000000000000002").is_dir()
    # Spark's tasks get their files pickled: the same storage, opened again from its settings.
    again = pickle.loads(pickle.dumps(sealed))
    assert again == sealed and again.read_bytes() == b"rows"
    assert "secret" not in repr(storage.s3)
    topic.delete_tree()
    assert not topic.exists() and not sealed.exists()


def test_a_staged_file_that_is_not_published_leaves_nothing(storage: Storage) -> None:
    target = storage.at("a/file")
    staged = target.staging()
    staged.write_bytes(b"half")
    storage_module.unstage(staged)
    assert not staged.exists() and not target.exists()


def test_deleting_leaves_no_empty_directory_behind(storage: Storage) -> None:
    # pyarrow emulates directories on S3 with zero-byte markers, and keeps one for a directory
    # whose last file it deletes: a compacted ledger released file by file, then its directory.
    part = storage.at("t/compacted-00000000000000000005/part-0.parquet")
    part.write_bytes(b"part")
    storage.at("t/compacted-00000000000000000009/part-0.parquet").write_bytes(b"part")
    part.unlink()
    part.parent.rmdir()
    assert [d.name for d in storage.at("t").dirs()] == ["compacted-00000000000000000009"]
    storage.at("t").delete_tree()
    selector = pafs.FileSelector(storage.at("t").fs_path, recursive=True, allow_not_found=True)
    assert storage.fs.get_file_info(selector) == []  # no object at all, markers included
