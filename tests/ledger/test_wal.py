"""The open ledger's write-ahead file: what a producer's acknowledgement and a restart promise."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest

from ledger import format as fmt
from ledger import wal as wal_module
from ledger.entry import Record, record_size
from ledger.files import TMP_SUFFIX
from ledger.open_log import LedgerClosedError
from ledger.paths import wal_path
from ledger.wal import CorruptRecordError, WalFailedError, WriteAheadLog
from tests.ledger.wal_records import LEDGER, as_entry, quarantine_files, rec


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return wal_path(tmp_path, LEDGER)


# ---------------------------------------------------------------------- round trips


def test_new_log_is_empty(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.recovery.created
        assert (wal.entries, wal.written_entries, wal.size_bytes) == (0, 0, 0)
        assert wal.file_bytes == fmt.HEADER_SIZE == path.stat().st_size
        assert wal.read(0, 10) == []
        assert wal.first_publish_time is None and wal.last_publish_time is None
    assert not path.with_name(path.name + TMP_SUFFIX).exists()


def test_append_read_round_trip(path: Path) -> None:
    records = [
        rec(0),
        rec(1, value=None),  # tombstone
        rec(2, key=None),  # keyless
        rec(3, properties={"a": "b", "ключ": "значение"}),
        rec(4, event_time=None),
        rec(5, key="", value=b""),
    ]
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.append_and_sync(records[:2]) == 0
        assert wal.append_and_sync(records[2:]) == 2
        expected = [as_entry(i, r) for i, r in enumerate(records)]
        assert wal.read_all() == expected
        assert wal.read(1, 1)[0].is_tombstone
        assert wal.read(2, 3) == expected[2:5]
        assert wal.read(4, 100) == expected[4:]
        assert wal.read(6, 1) == [] and wal.read(100, 1) == [] and wal.read(0, 0) == []
        assert wal.entries == wal.written_entries == 6
        assert wal.size_bytes == sum(record_size(r.key, r.value, r.properties) for r in records)
        assert wal.file_bytes == path.stat().st_size
        assert wal.first_publish_time == records[0].publish_time
        assert wal.last_publish_time == records[-1].publish_time


def test_reopen_after_close_sees_everything(path: Path) -> None:
    records = [rec(i) for i in range(20)]
    with WriteAheadLog.open(path, LEDGER) as wal:
        for i in range(0, 20, 5):
            wal.append_and_sync(records[i : i + 5])
        size = wal.size_bytes
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert not wal.recovery.created and wal.recovery.truncated_bytes == 0
        assert wal.recovery.entries == wal.entries == 20
        assert wal.read_all() == [as_entry(i, r) for i, r in enumerate(records)]
        assert wal.size_bytes == size
        assert wal.append_and_sync([rec(20)]) == 20
    assert quarantine_files(path) == []


def test_read_rejects_negative_ranges(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal, pytest.raises(ValueError):
        wal.read(-1, 5)


def test_unencodable_record_writes_nothing(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal:
        with pytest.raises(ValueError):
            wal.append([rec(0), rec(1, publish_time=2**63)])
        assert wal.written_entries == 0 and wal.file_bytes == fmt.HEADER_SIZE
        assert wal.append_and_sync([rec(0)]) == 0


def test_empty_append_is_a_no_op(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal:
        wal.append_and_sync([rec(0)])
        first, token = wal.append([])
        assert (first, token) == (1, wal.file_bytes)
        wal.sync(token)
        assert wal.entries == 1


# ---------------------------------------------------------------------- visibility and policies


def test_always_entry_readable_only_once_synced(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        first, token = wal.append([rec(0), rec(1)])
        assert first == 0
        assert wal.written_entries == 2
        assert wal.entries == 0 and wal.read(0, 10) == [] and wal.size_bytes == 0
        wal.sync(token)
        assert wal.entries == 2 and len(wal.read(0, 10)) == 2
        wal.sync(token)  # already covered: returns at once
        assert wal.fsync_count == 1


def test_sync_rejects_a_token_from_the_future(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal, pytest.raises(ValueError):
        wal.sync(wal.file_bytes + 1)


@pytest.mark.parametrize("policy", ["interval", "never"])
def test_lax_policies_are_readable_immediately(path: Path, policy: str) -> None:
    with WriteAheadLog.open(path, LEDGER, fsync=policy, fsync_interval_ms=10) as wal:
        first, token = wal.append([rec(0), rec(1)])
        assert wal.entries == 2
        assert wal.read_all() == [as_entry(0, rec(0)), as_entry(1, rec(1))]
        wal.sync(token)  # does not wait for anything
    with WriteAheadLog.open(path, LEDGER) as wal:
        assert wal.entries == 2


def test_interval_policy_fsyncs_in_the_background(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER, fsync="interval", fsync_interval_ms=5) as wal:
        wal.append([rec(0)])
        deadline = time.monotonic() + 5
        while wal.fsync_count == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert wal.fsync_count >= 1
        idle = wal.fsync_count
        time.sleep(0.05)
        assert wal.fsync_count == idle  # nothing new written, nothing to fsync


def test_unknown_policy_is_refused(path: Path) -> None:
    with pytest.raises(ValueError):
        WriteAheadLog.open(path, LEDGER, fsync="sometimes")


# ---------------------------------------------------------------------- close


def test_append_after_close_raises(path: Path) -> None:
    wal = WriteAheadLog.open(path, LEDGER)
    wal.append_and_sync([rec(0)])
    wal.close()
    wal.close()  # idempotent
    assert wal.closed
    with pytest.raises(LedgerClosedError, match="closed"):
        wal.append([rec(1)])
    assert wal.read_all() == [as_entry(0, rec(0))]  # reads still work


def test_close_makes_unsynced_appends_durable_and_readable(path: Path) -> None:
    wal = WriteAheadLog.open(path, LEDGER, fsync="always")
    _, token = wal.append([rec(0), rec(1)])
    assert wal.entries == 0
    wal.close()
    assert wal.entries == 2
    wal.sync(token)  # covered by close's fsync
    with WriteAheadLog.open(path, LEDGER) as again:
        assert again.entries == 2


def test_close_releases_waiting_syncers(path: Path) -> None:
    wal = WriteAheadLog.open(path, LEDGER, fsync="always")
    tokens = [wal.append([rec(i)])[1] for i in range(4)]
    done: list[int] = []

    def waiter(token: int) -> None:
        wal.sync(token)
        done.append(token)

    threads = [threading.Thread(target=waiter, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    wal.close()
    for t in threads:
        t.join(timeout=5)
    assert sorted(done) == tokens


# ---------------------------------------------------------------------- group commit


def test_group_commit_shares_fsyncs(path: Path) -> None:
    n_threads, per_thread = 8, 50
    wal = WriteAheadLog.open(path, LEDGER, fsync="always")
    barrier = threading.Barrier(n_threads)
    acked: dict[int, Record] = {}
    errors: list[BaseException] = []

    def producer(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                r = rec(t * 1000 + i)
                entry_id = wal.append_and_sync([r])
                # Acknowledged means readable, right now, as written.
                assert wal.read(entry_id, 1) == [as_entry(entry_id, r)]
                acked[entry_id] = r
        except BaseException as e:  # surfaced below; a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = n_threads * per_thread
    assert sorted(acked) == list(range(total))
    assert wal.fsync_count < total
    wal.close()

    with WriteAheadLog.open(path, LEDGER) as again:
        assert again.read_all() == [as_entry(i, acked[i]) for i in range(total)]


def test_appends_proceed_during_an_fsync_and_one_fsync_serves_all_waiters(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    in_fsync = threading.Event()
    real = wal_module._datasync

    def slow_datasync(fd: int) -> None:
        in_fsync.set()
        assert release.wait(5)
        real(fd)

    monkeypatch.setattr(wal_module, "_datasync", slow_datasync)
    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        leader = threading.Thread(target=wal.append_and_sync, args=([rec(0)],))
        leader.start()
        assert in_fsync.wait(5)
        # The first fsync is stuck; appends still go through, and their syncs queue up.
        followers = [threading.Thread(target=wal.append_and_sync, args=([rec(i)],)) for i in (1, 2, 3)]
        for t in followers:
            t.start()
        deadline = time.monotonic() + 5
        while wal.written_entries < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert wal.written_entries == 4
        assert wal.entries == 0
        release.set()
        for t in [leader, *followers]:
            t.join(5)
        assert wal.entries == 4
        assert wal.fsync_count == 2  # the stuck one, then one for all three followers


def test_failed_fsync_stops_the_log(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    with WriteAheadLog.open(path, LEDGER, fsync="always") as wal:
        wal.append_and_sync([rec(0)])
        monkeypatch.setattr(wal_module, "_datasync", broken)
        with pytest.raises(WalFailedError):
            wal.append_and_sync([rec(1)])
        assert wal.entries == 1  # never acknowledged, never readable
        with pytest.raises(WalFailedError):
            wal.append([rec(2)])
        with pytest.raises(LedgerClosedError):  # WalFailedError is a LedgerClosedError
            wal.append([rec(2)])


def test_readers_see_a_consistent_prefix_while_appending(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER, fsync="never") as wal:
        stop = threading.Event()
        seen: list[int] = []
        problems: list[BaseException] = []

        def reader() -> None:
            try:
                while not stop.is_set():
                    got = wal.read_all()
                    assert [e.entry_id for e in got] == list(range(len(got)))
                    seen.append(len(got))
                    time.sleep(0)  # let the appender have the GIL
            except BaseException as e:
                problems.append(e)

        t = threading.Thread(target=reader)
        t.start()
        for i in range(0, 300, 3):
            wal.append([rec(i), rec(i + 1), rec(i + 2)])
        stop.set()
        t.join()
        assert problems == []
        assert seen == sorted(seen)


# ---------------------------------------------------------------------- reads


def test_damage_after_open_is_reported_by_read(path: Path) -> None:
    with WriteAheadLog.open(path, LEDGER) as wal:
        wal.append_and_sync([rec(0), rec(1)])
        start = wal.file_bytes - 3
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(b"XYZ")
        assert wal.read(0, 1) == [as_entry(0, rec(0))]
        with pytest.raises(CorruptRecordError, match=str(path)):
            wal.read(0, 2)
