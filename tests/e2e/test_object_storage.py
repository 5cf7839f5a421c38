"""A server whose ledgers are in an S3 bucket (``COMPACTOR_STORAGE_URL=s3://...``), started as a
user starts it, against a real S3-compatible server (Ceph's object gateway, from ``.ci/s3``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from api.client import Client
from ledger.storage import S3Settings, open_storage
from tests.server import fresh_storage_env, s3_settings

pytestmark = [pytest.mark.e2e]

NEEDS_S3 = pytest.mark.skipif(
    s3_settings() is None, reason="no S3-compatible server (COMPACTOR_TEST_S3_SETTINGS; .ci/run sets it)"
)


def _bucket(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The server's storage as the test sees it: its files, listed and read directly."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REQUEST_CHECKSUM_CALCULATION"):
        os.environ.setdefault(name, env[name])
    return open_storage(
        env["COMPACTOR_STORAGE_URL"],
        S3Settings(endpoint_url=env["COMPACTOR_S3_ENDPOINT_URL"], region=env.get("COMPACTOR_S3_REGION")),
    )


def _s3_env() -> dict[str, str]:
    os.environ.setdefault("COMPACTOR_TEST_STORAGE", "local")
    saved = os.environ["COMPACTOR_TEST_STORAGE"]
    os.environ["COMPACTOR_TEST_STORAGE"] = "s3"
    try:
        return fresh_storage_env("objects")
    finally:
        os.environ["COMPACTOR_TEST_STORAGE"] = saved


@NEEDS_S3
@pytest.mark.spark
def test_ledgers_live_in_the_bucket_and_survive_a_crash_and_go_with_their_topic(
    server_factory, tmp_path: Path
) -> None:
    env = _s3_env()
    server = server_factory(
        Path(os.environ.get("TMPDIR", "/tmp"))
        / f"objects-{os.getpid()}-{random.randrange(1 << 30)}"
        / "data",
        env={**env, "COMPACTOR_MAX_ENTRIES_PER_LEDGER": "100"},
    )
    server.start()
    bucket = _bucket(env)
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
    # keeps only what is local by nature (write-ahead files, the SQLite metadata).
    stored = [f.key for f in bucket.list("ledgers/public/default/objects")]
    assert sum(k.endswith(".parquet") and "/compacted-" not in k for k in stored) >= 4
    assert any(k.endswith("/_manifest.json") for k in stored)
    assert not list(server.data_dir.rglob("*.parquet"))

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
    assert bucket.list("ledgers/public/default/objects") == []


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
