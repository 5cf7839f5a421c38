"""A real ``compactor serve`` under a low open-file limit: a fast producer on small ledgers and
readers over hundreds of sealed ledgers never see a 500, lose nothing acknowledged, and the
process stays under its descriptor limit (issue 15).

The server's soft and hard ``RLIMIT_NOFILE`` are 128 (set between fork and exec), ledgers
roll over every 100 entries, and the seal backlog is small with a short wait, so producers are
held back and some of their requests are refused with 503 (the client retries them). No
compaction runs: Spark's JVM would be a child with its own descriptors, and is not what this
test is about.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from api.client import Client, MessageId

pytestmark = pytest.mark.e2e

LIMIT = 128
TOPICS = 4
BATCHES = 20  # per topic
BATCH = 300  # messages per produce request: 3 ledgers each
ENTRIES_PER_LEDGER = 100


def value(topic: int, seq: int) -> bytes:
    return f"t{topic}-{seq:08d}".encode() * 4


def read_all(client: Client, topic: str, page: int) -> list[tuple[MessageId, bytes | None]]:
    with client.create_reader(topic, MessageId.earliest, receiver_queue_size=page) as reader:
        return [(m.message_id(), m.value()) for m in reader]


def test_low_descriptor_limit_many_ledgers_no_500_nothing_lost(tmp_path: Path, server_factory) -> None:
    server = server_factory(
        tmp_path / "data",
        env={
            "COMPACTOR_MAX_ENTRIES_PER_LEDGER": str(ENTRIES_PER_LEDGER),
            "COMPACTOR_MAX_PENDING_SEALS_PER_TOPIC": "3",
            "COMPACTOR_MAX_PENDING_SEALS": "6",
            "COMPACTOR_SEAL_WAIT_MS": "100",
            "COMPACTOR_FSYNC": "always",
        },
        max_open_files=LIMIT,
    )
    server.start()
    server.create_namespaces("fd/limits")
    topics = [f"fd/limits/t{i}" for i in range(TOPICS)]
    acked: dict[int, list[tuple[MessageId, bytes]]] = {i: [] for i in range(TOPICS)}
    errors: list[BaseException] = []
    peak = [server.open_descriptors()]
    health: set[str] = set()
    producing = threading.Event()
    producing.set()
    stop = threading.Event()

    with Client(server.url, timeout=60) as admin:
        for t in topics:
            admin.admin.topics.create(t)

    def produce(i: int) -> None:
        try:
            with Client(server.url, timeout=60) as client:
                producer = client.create_producer(topics[i])
                for b in range(BATCHES):
                    values = [value(i, b * BATCH + j) for j in range(BATCH)]
                    ids = producer.send_many([(f"k{j % 50}", v) for j, v in enumerate(values)])
                    acked[i].extend(zip(ids, values, strict=True))
        except BaseException as e:
            errors.append(e)

    def read(r: int) -> None:
        # Readers go over every topic again and again while it grows: sealed ledgers, ledgers
        # waiting to be sealed and the open one, through the server's LRU of open files.
        try:
            with Client(server.url, timeout=60) as client:
                n = 0
                while producing.is_set() and not stop.is_set():
                    topic = (r + n) % TOPICS
                    n += 1
                    got = read_all(client, topics[topic], page=37 + 50 * r)
                    ids = [m for m, _ in got]
                    assert ids == sorted(ids) and len(set(ids)) == len(ids), "out of order"
                    assert all(v is not None and v.startswith(f"t{topic}-".encode()) for _, v in got)
        except BaseException as e:
            errors.append(e)

    def watch() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not stop.is_set():
                peak[0] = max(peak[0], server.open_descriptors())
                r = http.get("/health")
                assert r.status_code == 200, r.text
                health.add(r.json()["status"])
                time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(TOPICS)]
    readers = [threading.Thread(target=read, args=(r,)) for r in range(3)]
    for t in producers + readers:
        t.start()
    for t in producers:
        t.join(120)
    producing.clear()
    for t in readers:
        t.join(60)

    try:
        assert not errors, errors[0]
        with Client(server.url, timeout=60) as client:
            for i, topic in enumerate(topics):
                assert len(acked[i]) == BATCHES * BATCH
                assert read_all(client, topic, page=1000) == acked[i]  # every acknowledged one, in order
                stats = client.admin.topics.internal_stats(topic)
                assert len(stats["ledgers"]) >= BATCHES * BATCH // ENTRIES_PER_LEDGER
            resources = httpx.get(f"{server.url}/admin/v2/broker-stats/resources").json()
    finally:
        stop.set()
        watcher.join(10)

    log = server.log.read_text()
    assert "Exception in ASGI application" not in log  # no 500 was answered
    assert "Too many open files" not in log
    assert peak[0] < LIMIT, f"peak of {peak[0]} descriptors"
    assert resources["descriptorLimit"] == {"soft": LIMIT, "hard": LIMIT}
    assert resources["ledgerFileCache"]["limit"] == LIMIT // 4
    assert resources["ledgerFileCache"]["open"] <= LIMIT // 4
    assert resources["ledgerFileCache"]["evictions"] > 0  # hundreds of ledgers went through it
    assert resources["sealBacklog"]["failingSeals"] == 0
    assert health <= {"ok", "degraded"}
    print(f"peak descriptors {peak[0]} of {LIMIT}; health seen {sorted(health)}; resources {resources}")
