"""Integrity from produce to compacted ledger, on a real server: bytes flipped in every
column's pages of a sealed ledger, a compacted part and a manifest, files truncated and
replaced, the metadata's checksum changed. Each time: the damage is reported (a JSON reason
naming topic, ledger and check; a one-line ``lastError``; stats; the scrubber), the rest of the
topic stays readable, no damaged value is ever returned as data, and the repair the data
allows happens (docs/operations.md, "Integrity and repair")."""

from __future__ import annotations

import base64
import fnmatch
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from api.main import app as cli_app
from ledger.schema import ARROW_SCHEMA
from ledger.storage import StoragePath
from tests.conftest import Server

pytestmark = pytest.mark.e2e

PER_LEDGER = 4
ENV = {
    "COMPACTOR_MAX_ENTRIES_PER_LEDGER": str(PER_LEDGER),
    # The background scrub, often: it must find damage before any reader does.
    "COMPACTOR_SCRUB_INTERVAL_SECONDS": "1",
    "COMPACTOR_SCRUB_BYTES_PER_SECOND": str(50 * 1024 * 1024),
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("integrity") / "data", env=ENV)
    s.start()
    yield s
    s.stop()


def value(key: str, i: int) -> bytes:
    # Incompressible enough that the middle of a value column chunk is page data.
    return (f"{key}-{i}-".encode() * 40)[:200]


class Topic:
    def __init__(self, srv: Server, name: str) -> None:
        self.srv = srv
        self.name = name
        self.admin = f"{srv.url}/admin/v2/persistent/public/default/{name}"
        self.data = f"{srv.url}/topics/persistent/public/default/{name}"
        self.full = f"persistent://public/default/{name}"
        # The server's files, wherever its ledger storage is (a directory or a bucket).
        self.root = srv.ledger_root() / f"ledgers/public/default/{name}"
        self.sent: dict[str, bytes] = {}  # message id -> value

    def create(self, messages: int = 3 * PER_LEDGER) -> Topic:
        assert httpx.put(self.admin).status_code == 204
        batch = [
            {"key": f"k{i % 5}", "value": base64.b64encode(value(f"k{i % 5}", i)).decode()}
            for i in range(messages)
        ]
        for m in batch:  # one at a time: ledgers roll over every PER_LEDGER entries
            r = httpx.post(self.data, json={"messages": [m]})
            assert r.status_code == 200, r.text
            self.sent[r.json()["messageIds"][0]] = base64.b64decode(m["value"])
        self.wait_sealed()
        return self

    def internal(self) -> dict[str, Any]:
        return httpx.get(f"{self.admin}/internalStats").json()

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.admin}/stats").json()

    def ledgers(self) -> list[dict[str, Any]]:
        return [lg for lg in self.internal()["ledgers"] if lg["state"] == "CLOSED"]

    def wait_sealed(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ledgers = self.internal()["ledgers"]
            if all(lg["state"] in ("CLOSED", "OPEN") for lg in ledgers) and len(ledgers) > 1:
                return
            time.sleep(0.1)
        raise AssertionError(f"ledgers not sealed: {self.internal()['ledgers']}")

    def sealed(self, ledger_id: int) -> StoragePath:
        """The ledger's sealed file: ``{id}.parquet``, or ``{id}.e{epoch}.parquet`` when an
        owner of that epoch sealed it (several instances, on PostgreSQL)."""
        head = f"{ledger_id:020d}."
        found = [f for f in self.root.files() if f.name.startswith(head) and f.name.endswith(".parquet")]
        assert len(found) == 1, [f.name for f in found]
        return found[0]

    def read(self, start: str = "earliest", compacted: bool = False, page: int = 3) -> httpx.Response:
        return httpx.get(
            f"{self.data}/messages",
            params={"startMessageId": start, "maxMessages": page, "readCompacted": str(compacted).lower()},
            timeout=30,
        )

    def read_all(
        self, start: str = "earliest", compacted: bool = False
    ) -> tuple[list[dict[str, Any]], httpx.Response]:
        """Pages until the end or an error; the messages and the last answer."""
        out: list[dict[str, Any]] = []
        while True:
            r = self.read(start, compacted)
            if r.status_code != 200:
                return out, r
            body = r.json()
            out.extend(body["messages"])
            if not body["messages"]:
                return out, r
            start = body["nextMessageId"]

    def assert_values_intact(self, messages: list[dict[str, Any]]) -> None:
        """No damaged value returned as data: every value is the one produced under its id."""
        for m in messages:
            assert base64.b64decode(m["value"]) == self.sent[m["messageId"]], m["messageId"]

    def compact(self, timeout: float = 180) -> dict[str, Any]:
        assert httpx.put(f"{self.admin}/compaction").status_code == 204
        return self.wait_compaction(timeout)

    def wait_compaction(self, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = httpx.get(f"{self.admin}/compaction").json()
            if st["status"] not in ("RUNNING", "NOT_RUN"):
                return st
            time.sleep(0.2)
        raise AssertionError("compaction did not finish")

    def scrub(self) -> dict[str, Any]:
        r = httpx.post(f"{self.admin}/scrub", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


def flip(path: StoragePath, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def metadata(path: StoragePath) -> pq.FileMetaData:
    with path.open() as f:
        return pq.read_metadata(f)


def column_data(path: StoragePath, column: int) -> int:
    """An offset in column ``column``'s page data in row group 0: the chunk's last bytes (its
    first are page headers, whose statistics no read uses: damage there is found by the
    whole-file checksum, as the scrub and compaction assertions below show)."""
    chunk = metadata(path).row_group(0).column(column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    return start + chunk.total_compressed_size - 4


def assert_damage_reason(r: httpx.Response, topic: Topic, ledger_id: int, status: int = 500) -> str:
    assert r.status_code == status, r.text
    reason = r.json()["reason"]
    assert topic.full in reason and f"ledger {ledger_id}" in reason and "failed" in reason, reason
    return reason


# ---------------------------------------------------------------------------- sealed ledgers


COLUMNS = ARROW_SCHEMA.names


def test_a_flipped_byte_in_any_column_of_a_sealed_ledger_is_reported_never_served(srv: Server) -> None:
    # One ledger per column, each with a byte flipped in the middle of that column's pages,
    # between intact ledgers: ledgers 0, 2, 4, ... intact; 1, 3, 5, ... damaged.
    topic = Topic(srv, "columns").create(PER_LEDGER * (2 * len(COLUMNS) + 1))
    ids = [lg["ledgerId"] for lg in topic.ledgers()]
    intact, damaged = ids[0::2], ids[1::2][: len(COLUMNS)]
    for column, ledger_id in enumerate(damaged):
        flip(topic.sealed(ledger_id), column_data(topic.sealed(ledger_id), column))

    # A read meeting the damage says where; none returns a damaged value.
    for ledger_id in damaged:
        for compacted in (False, True):  # readCompacted before any compaction reads the log
            r = topic.read(f"{ledger_id}:0", compacted=compacted, page=PER_LEDGER)
            assert_damage_reason(r, topic, ledger_id)
    # The other ranges of the topic stay readable.
    for ledger_id in intact:
        r = topic.read(f"{ledger_id}:0", page=PER_LEDGER)
        assert r.status_code == 200 and len(r.json()["messages"]) == PER_LEDGER, r.text
        topic.assert_values_intact(r.json()["messages"])

    # A compaction checks every input byte, even rows it would not decode: ERROR, one line.
    st = topic.compact()
    assert st["status"] == "ERROR", st
    error = st["lastError"]
    assert "\n" not in error and "Traceback" not in error, error
    assert f"ledger {damaged[0]} of {topic.full} is damaged" in error and "skip-damaged" in error, error

    # A scrub names every damaged ledger; stats and internalStats show them.
    report = topic.scrub()
    assert report["status"] == "DAMAGED" and len(report["findings"]) == len(damaged), report
    for ledger_id, finding in zip(damaged, report["findings"], strict=True):
        assert f"ledger {ledger_id} of {topic.full} is damaged" in finding
    assert [d["ledgerId"] for d in topic.stats()["damagedLedgers"]] == damaged
    marked = {lg["ledgerId"]: lg for lg in topic.internal()["ledgers"]}
    assert all(marked[i]["damaged"] and not marked[i]["damageAccepted"] for i in damaged)
    assert all(marked[i]["damaged"] is None and marked[i]["checksum"].startswith("crc32c:") for i in intact)

    # Accepting each loss explicitly lets compaction go on; nothing damaged is compacted.
    lost = 0
    for ledger_id in damaged:
        r = httpx.post(f"{topic.admin}/ledgers/{ledger_id}/skip-damaged")
        assert r.status_code == 200, r.text
        assert r.json()["lostCount"] + r.json()["keptEntries"] == PER_LEDGER
        lost += r.json()["lostCount"]
    assert topic.compact()["status"] == "SUCCESS"
    got, answer = topic.read_all(compacted=True)
    assert answer.status_code == 200
    topic.assert_values_intact(got)
    assert {m["key"] for m in got} == {f"k{i}" for i in range(5)}
    # Reads of the full log skip the accepted loss, as Pulsar's autoSkipNonRecoverableData.
    got, answer = topic.read_all()
    assert answer.status_code == 200
    topic.assert_values_intact(got)
    assert len(got) == len(topic.sent) - lost
    # An accepted loss is settled: the next scrub verifies the intact rows' copies and is clean.
    assert topic.scrub()["status"] == "CLEAN"


def test_truncated_and_replaced_sealed_files_are_named_and_the_background_scrub_finds_them_first(
    srv: Server,
) -> None:
    topic = Topic(srv, "swap").create()
    a, b, c = (lg["ledgerId"] for lg in topic.ledgers()[:3])
    topic.sealed(b).write_bytes(topic.sealed(a).read_bytes())  # another ledger's file in its place
    data = topic.sealed(c).read_bytes()
    topic.sealed(c).write_bytes(data[: len(data) // 2])  # truncated

    # The background scrub finds both before anyone reads: stats, the run history, metrics.
    deadline = time.monotonic() + 30
    while {d["ledgerId"] for d in topic.stats()["damagedLedgers"]} != {b, c}:
        assert time.monotonic() < deadline, topic.stats()["damagedLedgers"]
        time.sleep(0.2)
    runs = httpx.get(f"{topic.admin}/scrubRuns").json()
    assert any(r["trigger"] == "background" and r["status"] == "DAMAGED" for r in runs), runs
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert 'compactor_damage_found_total{check="file checksum",kind="original"}' in metrics

    assert_damage_reason(topic.read(f"{b}:0"), topic, b)
    assert_damage_reason(topic.read(f"{c}:0"), topic, c)
    r = topic.read(f"{a}:0", page=PER_LEDGER)
    assert r.status_code == 200
    topic.assert_values_intact(r.json()["messages"])

    # The CLI's scrub exits 1 on damage, with the findings.
    result = CliRunner().invoke(cli_app, ["topics", "--url", srv.url, "scrub", "public/default/swap"])
    assert result.exit_code == 1 and "DAMAGED" in result.output


# ---------------------------------------------------------------------------- compacted ledgers


def compacted_dir(topic: Topic) -> StoragePath:
    ledger_id = topic.internal()["compactedLedger"]["ledgerId"]
    return topic.root / f"compacted-{ledger_id:020d}"


def latest_values(topic: Topic) -> dict[str, bytes]:
    got, answer = topic.read_all()
    assert answer.status_code == 200
    return {m["key"]: base64.b64decode(m["value"]) for m in got}


def wait_rebuilt(topic: Topic, old: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if topic.internal()["compactedLedger"]["ledgerId"] not in (-1, old):
            return
        time.sleep(0.2)
    raise AssertionError(f"not rebuilt: {topic.internal()}")


def test_a_damaged_compacted_part_is_dropped_and_rebuilt_from_the_originals(srv: Server) -> None:
    topic = Topic(srv, "part").create()
    assert topic.compact()["status"] == "SUCCESS"
    directory = compacted_dir(topic)
    old = topic.internal()["compactedLedger"]["ledgerId"]
    manifest = (directory / "_manifest.json").read_bytes().decode()
    assert '"checksum": "crc32c:' in manifest  # manifests carry their parts' checksums
    part = next(f for f in directory.files() if fnmatch.fnmatch(f.name, "part-*.parquet"))
    flip(part, column_data(part, ARROW_SCHEMA.names.index("value")))

    r = topic.read(compacted=True, page=100)
    if r.status_code == 200:  # the background scrub found it first: already rebuilt
        topic.assert_values_intact(r.json()["messages"])
    else:
        assert r.status_code in (500, 503), r.text  # never the damaged value
        reason = r.json()["reason"]
        assert f"compacted ledger {old} of {topic.full}" in reason and "failed" in reason, reason
    wait_rebuilt(topic, old)
    assert topic.wait_compaction()["status"] == "SUCCESS"
    runs = httpx.get(f"{topic.admin}/compactionRuns").json()
    assert runs[0]["trigger"] == "repair"
    got, answer = topic.read_all(compacted=True)
    assert answer.status_code == 200
    topic.assert_values_intact(got)
    assert {m["key"]: base64.b64decode(m["value"]) for m in got} == latest_values(topic)


def test_a_damaged_manifest_is_found_by_the_scrubber_and_rebuilt(srv: Server) -> None:
    topic = Topic(srv, "manifest").create()
    assert topic.compact()["status"] == "SUCCESS"
    old = topic.internal()["compactedLedger"]["ledgerId"]
    path = compacted_dir(topic) / "_manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"rows": ', b'"rows": 1', 1))
    report = topic.scrub()
    if report["status"] == "CLEAN":  # the background scrub got there first and it is rebuilt
        assert httpx.get(f"{topic.admin}/compactionRuns").json()[0]["trigger"] == "repair"
    else:
        assert report["status"] == "DAMAGED"
        assert f"compacted ledger {old} of {topic.full}" in report["findings"][0]
        assert "manifest checksum failed" in report["findings"][0]
    wait_rebuilt(topic, old)
    assert topic.wait_compaction()["status"] == "SUCCESS"
    got, answer = topic.read_all(compacted=True)
    assert answer.status_code == 200
    topic.assert_values_intact(got)


# ---------------------------------------------------------------------------- the metadata's checksum


def test_a_changed_recorded_checksum_is_reported_and_files_without_checksums_get_one(
    server_factory: type[Server], tmp_path: Path
) -> None:
    s = server_factory(tmp_path / "data", env={**ENV, "COMPACTOR_SCRUB_INTERVAL_SECONDS": "0"})
    s.start()
    topic = Topic(s, "meta").create()
    a, b = (lg["ledgerId"] for lg in topic.ledgers()[:2])
    s.stop()
    engine = create_engine(s.database_url())
    with engine.begin() as conn:
        conn.execute(text("UPDATE ledgers SET checksum = 'crc32c:00000000' WHERE id = :id"), {"id": a})
        conn.execute(text("UPDATE ledgers SET checksum = NULL WHERE id = :id"), {"id": b})
    engine.dispose()
    # Ledger b as written before page checksums existed: still readable.
    with topic.sealed(b).open() as f:
        table = pq.read_table(f)
    rewritten = pa.BufferOutputStream()
    pq.write_table(table, rewritten, write_page_checksum=False)
    topic.sealed(b).write_bytes(rewritten.getvalue().to_pybytes())
    s.start()

    r = topic.read(f"{b}:0", page=PER_LEDGER)
    assert r.status_code == 200
    topic.assert_values_intact(r.json()["messages"])
    report = topic.scrub()
    assert report["status"] == "DAMAGED" and report["checksumsRecorded"] == 1, report
    (finding,) = report["findings"]
    assert f"ledger {a} of {topic.full}" in finding and "recorded checksum itself" in finding
    ledgers = {lg["ledgerId"]: lg for lg in topic.internal()["ledgers"]}
    assert ledgers[b]["checksum"].startswith("crc32c:") and ledgers[b]["damaged"] is None
    # The operator accepts: nothing is lost (every row group checks out); the log reads whole.
    r = httpx.post(f"{topic.admin}/ledgers/{a}/skip-damaged")
    assert r.status_code == 200 and r.json()["lostCount"] == 0, r.text
    got, answer = topic.read_all()
    assert answer.status_code == 200 and len(got) == len(topic.sent)
    topic.assert_values_intact(got)


def test_skip_damaged_refuses_an_intact_or_unknown_ledger(srv: Server) -> None:
    topic = Topic(srv, "intact").create(PER_LEDGER + 1)
    ledger_id = topic.ledgers()[0]["ledgerId"]
    r = httpx.post(f"{topic.admin}/ledgers/{ledger_id}/skip-damaged")
    assert r.status_code == 409 and "not known to be damaged" in r.json()["reason"]
    r = httpx.post(f"{topic.admin}/ledgers/999999/skip-damaged")
    assert r.status_code == 404 and "ledger 999999" in r.json()["reason"]
    r = httpx.post(f"{topic.admin}/ledgers/-1/skip-damaged")
    assert r.status_code == 422
