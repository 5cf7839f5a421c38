"""Two instances that share nothing but PostgreSQL and a bucket (``COMPACTOR_WAL=object``):
each on a local directory of its own, started as a user starts them. kill -9 of a topic's
owner in the middle of produce and of a compaction round: the other instance takes the topic
over with every acknowledged message (read back from the write-ahead objects, not from a disk
it cannot see), compacts it, and after its next scrub the bucket holds only what the
metadata names."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from api.client import Client, ClientError, MessageId
from tests.conftest import Server
from tests.server import bucket_of, fresh_database_url, s3_server_env, s3_settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    pytest.mark.skipif(
        s3_settings() is None, reason="no S3-compatible server (COMPACTOR_TEST_S3_SETTINGS; .ci/run sets it)"
    ),
]

TOPIC = "public/default/shared-nothing"
KEYS = 40


def _owner(server: Server) -> str:
    r = httpx.get(f"{server.url}/lookup/v2/topic/persistent/{TOPIC}", timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["httpUrl"])


def test_a_survivor_on_its_own_disk_takes_over_every_acknowledged_message_and_compacts(
    tmp_path: Path, postgres_admin: str
) -> None:
    database_url = fresh_database_url("shared_nothing", admin=postgres_admin)
    assert database_url is not None
    env = {
        **s3_server_env(f"shared-nothing-{time.time_ns()}"),
        "COMPACTOR_DATABASE_URL": database_url,
        "COMPACTOR_OWNERSHIP_LEASE_MS": "2000",
        "COMPACTOR_WAL": "object",
        "COMPACTOR_WAL_FLUSH_MS": "20",
        "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "300",
    }
    servers = [Server(tmp_path / name / "data", env=dict(env)) for name in ("a", "b")]
    for s in servers:
        s.start()
    try:
        _run(servers, env, database_url)
    finally:
        for s in servers:
            s.kill()


def _run(servers: list[Server], env: dict[str, str], database_url: str) -> None:
    a, b = servers
    with Client(a.url) as admin:
        admin.admin.topics.create(f"persistent://{TOPIC}")
    owner, survivor = (a, b) if _owner(a) == a.url else (b, a)

    acked: list[tuple[str, str, bytes]] = []
    stop = threading.Event()

    def produce(i: int) -> None:
        # Through both instances: redirected to the owner, then to the survivor once it owns it.
        with Client(f"{survivor.url},{owner.url}", retry_unavailable_s=60) as c:
            producer = c.create_producer(f"persistent://{TOPIC}")
            n = 0
            while not stop.is_set():
                key, value = f"k{(n * 7 + i) % KEYS}", f"{i}-{n}".encode()
                # Not acknowledged (ClientError): it may or may not be stored (at least once).
                with contextlib.suppress(ClientError):
                    acked.append((str(producer.send(value, key=key)), key, value))
                n += 1

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        while len(acked) < 700:  # a few ledgers sealed, an open one with chunks in objects
            time.sleep(0.05)
        r = httpx.put(f"{owner.url}/admin/v2/persistent/{TOPIC}/compaction", timeout=30)
        assert r.status_code == 204, r.text
        owner.kill()  # kill -9 in the middle of produce and of the round
        killed = time.monotonic()
        while _owner(survivor) != survivor.url:
            assert time.monotonic() - killed < 60, "the survivor never took the topic over"
            time.sleep(0.1)
        count = len(acked)
        while len(acked) < count + 300:  # produce goes on through the new owner
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()

    with Client(survivor.url) as c:
        reader = c.create_reader(f"persistent://{TOPIC}", MessageId.earliest, start_message_id_inclusive=True)
        stored = {str(m.message_id()): (m.key(), m.value()) for m in reader}
        reader.close()
        lost = [(mid, k, v) for mid, k, v in acked if stored.get(mid) != (k, v)]
        assert not lost, f"{len(lost)} acknowledged messages lost or changed, e.g. {lost[:3]}"

        c.admin.topics.compact(f"persistent://{TOPIC}")
        assert c.admin.topics.wait_for_compaction(f"persistent://{TOPIC}", timeout=300).status == "SUCCESS"
        latest: dict[str, bytes] = {}
        for mid in sorted(stored, key=lambda m: tuple(int(x) for x in m.split(":")[:2])):
            key, value = stored[mid]
            latest[key] = value
        consumer = c.subscribe(
            f"persistent://{TOPIC}", "compacted", read_compacted=True, initial_position="earliest"
        )
        got: dict[str, bytes] = {}
        while batch := consumer.batch_receive(max_messages=500, timeout_millis=1000):
            got.update((m.key(), m.value()) for m in batch)
            consumer.acknowledge_cumulative(batch[-1])
        consumer.close()
        assert got == latest

        # The dead owner's flush under way and its round's files are orphans: a scrub after its
        # last lease (3 x 2 s) removes them.
        time.sleep(max(0.0, killed + 6.5 - time.monotonic()))
        report = c.admin.topics.scrub(f"persistent://{TOPIC}")
        assert report["status"] == "CLEAN", report
    _assert_bucket_holds_only_what_the_metadata_names(env, database_url)


def _assert_bucket_holds_only_what_the_metadata_names(env: dict[str, str], database_url: str) -> None:
    bucket = bucket_of(env)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            originals = conn.execute(
                text("SELECT id, sealed_epoch FROM ledgers WHERE kind = 'ORIGINAL' AND state = 'CLOSED'")
            ).all()
            live = "SELECT id FROM ledgers WHERE kind = 'COMPACTED' AND state <> 'DELETED'"
            compacted = {int(i) for (i,) in conn.execute(text(live))}
            chunks = {str(k) for (k,) in conn.execute(text("SELECT DISTINCT object_key FROM wal_chunks"))}
    finally:
        engine.dispose()
    sealed = {f"{i:020d}.e{e}.parquet" if e else f"{i:020d}.parquet" for i, e in originals}
    found = [f.key for f in bucket.list("")]
    assert {k for k in found if k.startswith("wal/")} == chunks
    topic_dir = f"ledgers/{TOPIC}/"
    for key in found:
        if key.startswith("wal/"):
            continue
        assert key.startswith(topic_dir), key
        name = key[len(topic_dir) :]
        if name.startswith("compacted-"):
            assert int(name.split("/")[0][len("compacted-") :]) in compacted, key
        else:
            assert name in sealed, key
