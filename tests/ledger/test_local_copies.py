"""The local copies of uploaded sealed ledgers: bounded by bytes, least recently used out
first, never one a round holds, forgotten with their objects, and not trusted across runs."""

from __future__ import annotations

import os
from pathlib import Path

from ledger.local_copies import LocalCopies
from ledger.storage import S3Settings, StoragePath, open_storage

# Names only: nothing here talks to the bucket.
BUCKET = open_storage(
    "s3://copies-test/prefix", S3Settings(endpoint_url="http://127.0.0.1:9", region="us-east-1")
)


def staged(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / f"{name}.staged"
    path.write_bytes(os.urandom(size))
    return path


def obj(key: str) -> StoragePath:
    return BUCKET.at(key)


def test_a_kept_file_is_the_object_s_copy_until_it_is_dropped(tmp_path: Path) -> None:
    copies = LocalCopies(tmp_path / "copies", max_bytes=1000)
    file = staged(tmp_path, "a", 100)
    data = file.read_bytes()
    assert copies.keep(obj("t/ns/x/1.parquet"), file)
    assert not file.exists()  # moved, not copied
    copy = copies.lease(obj("t/ns/x/1.parquet"))
    assert copy is not None and copy.local is not None and copy.local.read_bytes() == data
    assert copies.holds(copy) and copies.holds(copy.local)
    copies.release(copy)
    assert copies.lease(obj("t/ns/x/2.parquet")) is None
    copies.drop(obj("t/ns/x/1.parquet"))
    assert copies.lease(obj("t/ns/x/1.parquet")) is None and not copy.local.exists()
    assert copies.total_bytes == 0


def test_the_least_recently_used_leave_first_but_never_a_leased_one(tmp_path: Path) -> None:
    copies = LocalCopies(tmp_path / "copies", max_bytes=250)
    for name in ("1", "2"):
        assert copies.keep(obj(name), staged(tmp_path, name, 100))
    held = copies.lease(obj("1"))  # now the most recently used, and held
    assert held is not None
    assert copies.keep(obj("3"), staged(tmp_path, "3", 100))
    assert copies.lease(obj("2")) is None  # the least recently used went
    assert copies.total_bytes == 200
    assert copies.keep(obj("4"), staged(tmp_path, "4", 100))
    # Over the bound only while "1" is held; it goes once let go ("3" went meanwhile).
    assert copies.lease(obj("3")) is None
    assert held.local is not None and held.local.exists()
    copies.release(held)
    copies.keep(obj("5"), staged(tmp_path, "5", 100))
    assert copies.lease(obj("1")) is None and not held.local.exists()
    assert copies.total_bytes <= 250


def test_what_does_not_fit_or_is_not_an_object_is_not_kept(tmp_path: Path) -> None:
    copies = LocalCopies(tmp_path / "copies", max_bytes=50)
    big = staged(tmp_path, "big", 100)
    assert not copies.keep(obj("big"), big)
    assert big.exists()  # the caller removes it
    local = open_storage(str(tmp_path / "root")).at("x.parquet")
    assert not copies.keep(local, staged(tmp_path, "small", 10))
    assert copies.total_bytes == 0


def test_a_deleted_topic_s_copies_go(tmp_path: Path) -> None:
    copies = LocalCopies(tmp_path / "copies", max_bytes=1000)
    copies.keep(obj("ledgers/t/ns/a/1.parquet"), staged(tmp_path, "1", 10))
    copies.keep(obj("ledgers/t/ns/ab/2.parquet"), staged(tmp_path, "2", 10))
    copies.drop_tree(obj("ledgers/t/ns/a"))
    assert copies.lease(obj("ledgers/t/ns/a/1.parquet")) is None
    assert copies.lease(obj("ledgers/t/ns/ab/2.parquet")) is not None  # a name that only starts alike


def test_copies_of_an_earlier_run_are_not_trusted(tmp_path: Path) -> None:
    base = tmp_path / "copies"
    left = base / "999999999" / "copies-test" / "prefix" / "1.parquet"  # no such process runs
    left.parent.mkdir(parents=True)
    left.write_bytes(b"half a file")
    copies = LocalCopies(base, max_bytes=1000)
    assert not (base / "999999999").exists()
    assert copies.lease(obj("1.parquet")) is None
