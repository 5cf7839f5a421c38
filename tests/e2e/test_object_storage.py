"""A server whose ledgers are in an S3 bucket (``COMPACTOR_STORAGE_URL=s3://...``), started as a
user starts it, against a real S3-compatible server (Ceph's object gateway, from ``.ci/s3``)."""

from __future__ import annotations

import asyncio
import base64
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pyarrow.fs as pafs
import pytest

from api.client import Client, MessageId
from ledger.layers import Manifest
from tests.conftest import local_wal_only
from tests.server import bucket_of, free_port, s3_server_env, s3_settings

pytestmark = [pytest.mark.e2e]

NEEDS_S3 = pytest.mark.skipif(
    s3_settings() is None, reason="no S3-compatible server (COMPACTOR_TEST_S3_SETTINGS; .ci/run sets it)"
)


@NEEDS_S3
@pytest.mark.spark
def test_ledgers_live_in_the_bucket_and_survive_a_crash_and_go_with_their_topic(
    server_factory, tmp_path: Path
) -> None:
    env = s3_server_env("objects")
    server = server_factory(
        Path(os.environ.get("TMPDIR", "/tmp"))
        / f"objects-{os.getpid()}-{random.randrange(1 << 30)}"
        / "data",
        env={**env, "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "100"},
    )
    server.start()
    bucket = bucket_of(env)
    topic = "persistent://public/default/objects"
    rng = random.Random(5)
    latest: dict[str, bytes | None] = {}
    with Client(server.url) as client:
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        for _ in range(5):
            pairs = [
                (f"k{rng.randrange(40)}", None if rng.random() < 0.1 else rng.randbytes(8)) for _ in range(90)
            ]
            producer.send_many(pairs)
            latest.update(pairs)
        client.admin.topics.compact(topic)
        assert client.admin.topics.wait_for_compaction(topic, timeout=180).status == "SUCCESS"

    # The sealed and compacted ledgers are objects under the topic's prefix; the data dir
    # keeps only what is local by nature (write-ahead files, the SQLite metadata) and the
    # local copies of sealed ledgers, each of an object in the bucket, byte for byte.
    stored = [f.key for f in bucket.list("ledgers/public/default/objects")]
    sealed = [k for k in stored if k.endswith(".parquet") and "/compacted-" not in k]
    assert len(sealed) >= 4
    assert any(k.endswith("/_manifest.json") for k in stored)
    copies = server.data_dir / "local-copies"
    local = list(server.data_dir.rglob("*.parquet"))
    assert local and all(f.is_relative_to(copies) for f in local)
    for f in local:
        key = next(k for k in sealed if str(f).endswith("/" + k))
        assert bucket.read(key) == f.read_bytes()

    server.kill()  # kill -9: everything acknowledged is in the bucket or a write-ahead file
    server.start()
    want = {k: v for k, v in latest.items() if v}
    with Client(server.url) as client:
        consumer = client.subscribe(topic, "reader", read_compacted=True, initial_position="earliest")
        got: dict[str, bytes | None] = {}
        while batch := consumer.batch_receive(max_messages=100, timeout_millis=500):
            for m in batch:
                got[m.key()] = m.value()
            consumer.acknowledge_cumulative(batch[-1])
        assert {k: v for k, v in got.items() if v} == want
        full = client.subscribe(topic, "full", initial_position="earliest")
        count = 0
        while batch := full.batch_receive(max_messages=100, timeout_millis=500):
            count += len(batch)
            full.acknowledge_cumulative(batch[-1])
        assert count == 450

        consumer.close()
        full.close()
        client.admin.topics.delete(topic)
    # Nothing at all under the topic's prefix: no object, and no directory marker.
    gone = pafs.FileSelector(
        bucket.at("ledgers/public/default/objects").fs_path, recursive=True, allow_not_found=True
    )
    assert bucket.fs.get_file_info(gone) == []
    assert not list(server.data_dir.rglob("*.parquet"))  # nor any local copy of its ledgers


def _consume(
    client: Client, topic: str, subscription: str, *, read_compacted: bool
) -> list[tuple[MessageId, str | None, bytes | None]]:
    """Every message from the earliest, as (id, key, value), acknowledged as it goes."""
    consumer = client.subscribe(
        topic, subscription, read_compacted=read_compacted, initial_position="earliest"
    )
    out: list[tuple[MessageId, str | None, bytes | None]] = []
    while batch := consumer.batch_receive(max_messages=500, timeout_millis=500):
        out.extend((m.message_id(), m.key(), m.value()) for m in batch)
        consumer.acknowledge_cumulative(batch[-1])
    consumer.close()
    return out


@NEEDS_S3
@pytest.mark.spark
def test_the_next_consumer_of_a_compacted_topic_on_object_storage_reads_from_the_row_group_cache(
    server_factory, tmp_path: Path
) -> None:
    env = s3_server_env("cache")
    server = server_factory(
        Path(os.environ.get("TMPDIR", "/tmp")) / f"cache-{os.getpid()}-{random.randrange(1 << 30)}" / "data",
        env={**env, "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "3000"},
    )
    server.start()
    topic = "persistent://public/default/cached"
    rng = random.Random(9)

    def cache() -> dict[str, int]:
        found: dict[str, int] = httpx.get(f"{server.url}/admin/v2/broker-stats/resources").json()[
            "rowGroupCache"
        ]
        return found

    with Client(server.url) as client:
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        # A base and a delta (two parts, each one row group): a reader moves from one to the other.
        for messages in (9000, 1000):
            producer.send_many([(f"k{rng.randrange(4000)}", rng.randbytes(20)) for _ in range(messages)])
            client.admin.topics.compact(topic)
            assert client.admin.topics.wait_for_compaction(topic, timeout=180).status == "SUCCESS"
        assert cache()["limitBytes"] == 256 << 20  # object storage: on by default

        first = _consume(client, topic, "first", read_compacted=True)
        before = cache()
        assert before["misses"] > 0 and before["entries"] > 0
        again = _consume(client, topic, "again", read_compacted=True)
        after = cache()
        assert again == first and len({key for _, key, _ in first}) == len(first) > 3000
        assert after["misses"] == before["misses"]  # nothing decoded, nothing asked of the bucket
        assert after["hits"] > before["hits"]
        # The full log through the same cache: every message, in order.
        full = _consume(client, topic, "full", read_compacted=False)
        assert len(full) == 10_000 and [m[0] for m in full] == sorted(m[0] for m in full)
        assert _consume(client, topic, "full-again", read_compacted=False) == full


def serve(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``compactor serve`` as a user runs it, with these settings; it is expected to refuse."""
    script = Path(sys.executable).parent / "compactor"
    env = {
        **os.environ,
        "COMPACTOR_DATA_DIR": str(tmp_path / "data"),
        "COMPACTOR_PORT": "0",
        "COMPACTOR_BROKER_SERVICE_PORT": "0",
        **settings,
    }
    return subprocess.run([str(script), "serve"], env=env, capture_output=True, text=True, timeout=120)


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refused start (exit status 2, no traceback)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


def test_a_storage_that_cannot_be_used_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    # Nothing listens on port 1: the endpoint is down.
    down = {
        "COMPACTOR_STORAGE_URL": "s3://ledgers/prefix",
        "COMPACTOR_S3_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
    }
    assert refusal(serve(tmp_path, down)).startswith("error: s3://ledgers/prefix cannot be used:")
    assert not list((tmp_path / "data").rglob("*.wal"))  # nothing was started

    done = serve(tmp_path, {**down, "COMPACTOR_STORAGE_URL": "ftp://ledgers"})
    assert done.returncode == 2 and "storage URL 'ftp://ledgers'" in done.stderr
    assert "Traceback" not in done.stderr


@NEEDS_S3
def test_a_bucket_that_does_not_exist_is_refused_at_start(tmp_path: Path) -> None:
    found = s3_settings()
    assert found is not None
    settings = {k: v for k, v in found.items() if k.startswith(("COMPACTOR_", "AWS_"))}
    done = serve(tmp_path, {**settings, "COMPACTOR_STORAGE_URL": "s3://no-such-bucket-here/prefix"})
    assert refusal(done).startswith("error: s3://no-such-bucket-here/prefix cannot be used:")


class Relay:
    """A TCP relay between a server and the object store, which a test cuts (connections
    dropped, new ones refused: the store is gone, as far as the server can tell) and restores,
    on the same port. The store behind it is the real one."""

    def __init__(self, target: str) -> None:
        parsed = urlsplit(target)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, name="relay", daemon=True).start()
        self.restore()

    def restore(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def cut(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)

    def stop(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()
                self._open.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class RestTopic:
    """A topic produced to and read over REST during an outage: what was acknowledged, by
    message id, and what refused requests sent."""

    def __init__(self, http: httpx.Client, url: str) -> None:
        self.http = http
        self.data = url
        self.acknowledged: dict[str, tuple[str, str]] = {}  # message id -> (key, value)
        self.refused: set[tuple[str, str]] = set()

    def produce(self, n: int, tag: str) -> httpx.Response:
        messages = [
            {"key": f"k{i % 30}", "value": base64.b64encode(f"{tag}-{i}".encode()).decode()} for i in range(n)
        ]
        r = self.http.post(self.data, json={"messages": messages})
        if r.status_code == 200:
            for mid, m in zip(r.json()["messageIds"], messages, strict=True):
                self.acknowledged[mid] = (m["key"], m["value"])
        else:
            self.refused.update((m["key"], m["value"]) for m in messages)
        return r

    def read(self, compacted: bool = False) -> tuple[list[dict], httpx.Response]:  # type: ignore[type-arg]
        """Pages from the earliest message until the end or an error; the messages and the
        last answer."""
        out: list[dict] = []  # type: ignore[type-arg]
        start = "earliest"
        while True:
            r = self.http.get(
                f"{self.data}/messages",
                params={"startMessageId": start, "maxMessages": 100, "readCompacted": str(compacted).lower()},
            )
            if r.status_code != 200 or not r.json()["messages"]:
                return out, r
            out.extend(r.json()["messages"])
            start = r.json()["nextMessageId"]

    def read_all(self) -> dict[str, tuple[str, str]]:
        """Every message, by id (the reads must all succeed)."""
        got, r = self.read()
        assert r.status_code == 200, r.text
        return {m["messageId"]: (m["key"], m["value"]) for m in got}


def wait_until(check: Callable[[], bool], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@NEEDS_S3
@pytest.mark.spark
@local_wal_only("produce going on into the local write-ahead file (the object one has its test below)")
def test_an_object_store_that_goes_away_gives_503s_loses_nothing_and_is_used_again(
    server_factory, tmp_path: Path
) -> None:
    env = s3_server_env("objects")
    relay = Relay(env["COMPACTOR_S3_ENDPOINT_URL"])
    server = server_factory(
        tmp_path / "data",
        env={
            **env,
            "COMPACTOR_S3_ENDPOINT_URL": relay.url,
            "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "100",
            # Produce waits 1 s for room in the seal backlog, then answers 503.
            "COMPACTOR_MAX_PENDING_SEALS_PER_TOPIC": "1",
            "COMPACTOR_SEAL_WAIT_MS": "1000",
            "COMPACTOR_SCRUB_INTERVAL_SECONDS": "0",
        },
    )
    server.start()
    name = "public/default/outage"
    admin = f"{server.url}/admin/v2/persistent/{name}"
    data = f"{server.url}/topics/persistent/{name}"
    http = httpx.Client(timeout=60)
    rest = RestTopic(http, data)

    try:
        assert http.put(admin).status_code == 204
        for i in range(3):
            assert rest.produce(90, f"before{i}").status_code == 200
        assert http.put(f"{admin}/compaction").status_code == 204
        wait_until(lambda: http.get(f"{admin}/compaction").json()["status"] == "SUCCESS")

        relay.cut()
        # Reads of sealed and compacted ledgers: 503 with Retry-After, never a damaged ledger.
        for compacted in (False, True):
            _, r = rest.read(compacted)
            assert r.status_code == 503 and "Retry-After" in r.headers, r.text
            assert "ledger storage does not answer" in r.json()["reason"]
        # Produce goes on into the write-ahead file until sealing falls behind: then 503.
        answers = [rest.produce(90, f"during{i}") for i in range(6)]
        assert answers[0].status_code == 200
        refused = [r for r in answers if r.status_code != 200]
        assert refused and all(r.status_code == 503 and "Retry-After" in r.headers for r in refused)
        # A round meets the outage: it fails, and changes nothing.
        assert http.put(f"{admin}/compaction").status_code == 204
        wait_until(lambda: http.get(f"{admin}/compaction").json()["status"] in ("ERROR", "SUCCESS"))
        assert http.get(f"{admin}/compaction").json()["status"] == "ERROR"
        assert http.get(f"{admin}/stats").json()["damagedLedgers"] == []  # an outage is not damage

        relay.restore()
        # Sealing resumes by itself (its retries back off to at most 30 s).
        wait_until(
            lambda: all(
                lg["state"] == "CLOSED" for lg in http.get(f"{admin}/internalStats").json()["ledgers"][:-1]
            )
        )
        got, r = rest.read()
        assert r.status_code == 200
        assert {m["messageId"]: (m["key"], m["value"]) for m in got} == rest.acknowledged
        assert rest.produce(90, "after").status_code == 200
        assert http.put(f"{admin}/compaction").status_code == 204
        wait_until(lambda: http.get(f"{admin}/compaction").json()["status"] in ("ERROR", "SUCCESS"))
        assert http.get(f"{admin}/compaction").json()["status"] == "SUCCESS"
        latest: dict[str, str] = {}
        for mid in sorted(rest.acknowledged, key=lambda m: tuple(int(x) for x in m.split(":"))):
            key, value = rest.acknowledged[mid]
            latest[key] = value
        got, r = rest.read(compacted=True)
        assert r.status_code == 200 and {m["key"]: m["value"] for m in got} == latest
        # After the next scrub, nothing is left over in the bucket: the compacted ledgers there
        # are the current one and the older layers its manifest names, whatever the failed
        # round had written and could not remove.
        assert http.post(f"{admin}/scrub").json()["status"] == "CLEAN"
        topic = server.ledger_root() / f"ledgers/{name}"
        ledger_id = http.get(f"{admin}/internalStats").json()["compactedLedger"]["ledgerId"]
        manifest = Manifest.load(topic / f"compacted-{ledger_id:020d}")
        named = {f.split("/")[0] for f in manifest.files()} | {f"compacted-{ledger_id:020d}"}
        assert {d.name for d in topic.dirs()} == named
    finally:
        http.close()
        relay.stop()


@NEEDS_S3
@pytest.mark.spark
def test_with_the_write_ahead_log_in_the_store_an_outage_answers_503_and_acknowledged_messages_stay(
    server_factory, tmp_path: Path
) -> None:
    """``COMPACTOR_WAL=object``: nothing is acknowledged while the store is away (503 with
    Retry-After); what a refused request sent may be stored once the store is back (at least
    once), everything acknowledged is, and a kill -9 after the outage reads it all back."""
    env = s3_server_env("objects-wal")
    relay = Relay(env["COMPACTOR_S3_ENDPOINT_URL"])
    server = server_factory(
        tmp_path / "data",
        env={
            **env,
            "COMPACTOR_S3_ENDPOINT_URL": relay.url,
            "COMPACTOR_WAL": "object",
            "COMPACTOR_WAL_FLUSH_MS": "20",
            "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "100",
            "COMPACTOR_SCRUB_INTERVAL_SECONDS": "0",
        },
    )
    server.start()
    name = "public/default/outage-wal"
    admin = f"{server.url}/admin/v2/persistent/{name}"
    data = f"{server.url}/topics/persistent/{name}"
    http = httpx.Client(timeout=60)
    rest = RestTopic(http, data)

    try:
        assert http.put(admin).status_code == 204
        for i in range(3):
            assert rest.produce(60, f"before{i}").status_code == 200
        flushes = [
            line
            for line in http.get(f"{server.url}/metrics").text.splitlines()
            if line.startswith("compactor_wal_flush_seconds_count")
        ]
        assert flushes and float(flushes[0].split()[-1]) >= 3  # one flush at least per request

        relay.cut()
        answers = [rest.produce(30, f"during{i}") for i in range(3)]
        assert all(r.status_code == 503 and "Retry-After" in r.headers for r in answers), [
            (r.status_code, r.text) for r in answers
        ]
        assert "ledger storage does not answer" in answers[0].json()["reason"]

        relay.restore()
        wait_until(lambda: rest.produce(30, "after").status_code == 200)
        stored = rest.read_all()
        lost = {mid: kv for mid, kv in rest.acknowledged.items() if stored.get(mid) != kv}
        assert not lost, f"acknowledged messages lost: {list(lost.items())[:3]}"
        extra = {kv for mid, kv in stored.items() if mid not in rest.acknowledged}
        assert extra <= rest.refused  # stored after all: only what a refused request sent

        assert http.put(f"{admin}/compaction").status_code == 204
        wait_until(lambda: http.get(f"{admin}/compaction").json()["status"] in ("ERROR", "SUCCESS"))
        assert http.get(f"{admin}/compaction").json()["status"] == "SUCCESS"

        server.kill()  # kill -9: the open ledger comes back from the objects
        server.start()
        assert rest.read_all() == stored
        assert http.post(f"{admin}/scrub").json()["status"] == "CLEAN"
    finally:
        http.close()
        relay.stop()
