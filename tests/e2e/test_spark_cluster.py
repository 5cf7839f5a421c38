"""The service on a Spark standalone cluster: a Master and two Workers started from the pyspark
wheel's ``bin/spark-class`` as separate processes, whose executors run an interpreter with
only pyarrow, numpy and pandas (nothing of this project: the service ships its code)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.client import Client
from tests.cluster import SparkCluster, can_hide_directories, executor_archive, executor_python
from tests.conftest import Server
from tests.server import POSTGRES_ENV, s3_settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    # The cluster has nothing to do with the metadata store: once per CI run is enough.
    pytest.mark.skipif(bool(os.environ.get(POSTGRES_ENV)), reason="run in the SQLite pass only"),
]

TOPIC = "public/default/cluster"


@pytest.fixture(scope="session")
def executor_py() -> Path:
    python = executor_python()
    # What the executors run really lacks the project (and has what the tasks need).
    assert subprocess.run([python, "-c", "import compactor"], capture_output=True, cwd="/").returncode != 0
    subprocess.run([python, "-c", "import pyarrow, numpy, pandas"], check=True, cwd="/")
    return python


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory, executor_py: Path) -> Iterator[SparkCluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    hidden = root / "not-shared" if can_hide_directories() else None
    c = SparkCluster(root / "cluster", workers=2, cores=1, memory="1g", hidden=hidden)
    c.start()
    yield c
    c.stop()


def cluster_env(cluster: SparkCluster, python: Path | str, **extra: str) -> dict[str, str]:
    conf = {
        # The driver is reached by the executors at the address it advertises.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        # Jobs wait for both executors, so tasks spread over both Workers.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    }
    return {
        "COMPACTOR_SPARK_MASTER": cluster.master_url,
        "COMPACTOR_SPARK_PYTHON": str(python),
        "COMPACTOR_SPARK_CONF": json.dumps(conf),
        "COMPACTOR_SPARK_DRIVER_MEMORY": "1g",
        "COMPACTOR_SPARK_WARMUP": "true",
        # A few of the JIT warm-up's empty jobs: they run on the cluster too, but each costs
        # the test's time.
        "COMPACTOR_SPARK_WARMUP_JOBS": "3",
        **extra,
    }


def wait_for_compaction_state(url: str, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = str(httpx.get(f"{url}/health", timeout=5).json()["compaction"])
        if state != "starting" or time.monotonic() > deadline:
            return state
        time.sleep(0.25)


def python_daemons(cluster: SparkCluster, python: Path) -> dict[int, set[str]]:
    """Per Worker, the executor directories in which a PySpark daemon of ``python`` runs."""
    found: dict[int, set[str]] = {i: set() for i in range(cluster.workers)}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if argv[0].decode() != str(python) or b"pyspark.daemon" not in argv:
            continue
        for i in range(cluster.workers):
            if cwd.startswith(str(cluster.worker_dir(i)) + "/"):
                found[i].add(str(Path(cwd).relative_to(cluster.worker_dir(i))))
    return found


def compact_twice_and_check(srv: Server) -> None:
    """A full round, then one that merges with the first, through the cluster; the compacted
    view against a model."""
    rng = random.Random(11)
    # The model: each live key's latest value, in the order of its latest write (a compacted
    # read is in message-id order).
    model: dict[str, bytes] = {}
    with Client(srv.url) as client:
        client.admin.topics.create(TOPIC)
        producer = client.create_producer(TOPIC)
        for round_ in range(2):
            for _ in range(4):
                batch: list[tuple[str, bytes | None]] = []
                for _ in range(250):
                    key = f"k{rng.randrange(300)}"
                    value = None if rng.random() < 0.1 else f"v{round_}-{rng.randrange(10**6)}".encode()
                    batch.append((key, value))
                    model.pop(key, None)
                    if value is not None:
                        model[key] = value
                producer.send_many(batch)  # (key, None): a tombstone
            client.admin.topics.compact(TOPIC)
            status = client.admin.topics.wait_for_compaction(TOPIC, timeout=180)
            assert (status.status, status.last_error) == ("SUCCESS", None), srv.log.read_text()[-3000:]
        reader = client.create_reader(TOPIC, "earliest", read_compacted=True)
        assert [(m.key(), m.value()) for m in reader] == list(model.items())
        runs = httpx.get(f"{srv.url}/admin/v2/persistent/{TOPIC}/compactionRuns").json()
        assert [r["status"] for r in runs] == ["SUCCESS", "SUCCESS"]
        assert runs[0]["entriesRead"] > 0 and runs[0]["recordsKept"] == len(model)


def test_compaction_on_a_standalone_cluster(cluster: SparkCluster, executor_py: Path, server_factory) -> None:
    srv = server_factory(Path(cluster.work_dir).parent / "data", env=cluster_env(cluster, executor_py))
    srv.start()
    assert wait_for_compaction_state(srv.url) == "available", srv.log.read_text()[-3000:]
    compact_twice_and_check(srv)

    # The tasks ran in the Workers' executors, in Python daemons of the executor interpreter.
    daemons = python_daemons(cluster, executor_py)
    assert all(daemons.values()), daemons
    apps = {d.split("/")[0] for dirs in daemons.values() for d in dirs}
    assert len(apps) == 1, daemons  # one application: this service's
    srv.stop()


@pytest.mark.skipif(s3_settings() is None, reason="no S3-compatible server (COMPACTOR_TEST_S3_SETTINGS)")
def test_compaction_on_a_cluster_that_shares_no_directory_with_the_service(
    cluster: SparkCluster, executor_py: Path, server_factory
) -> None:
    if cluster.hidden is None:
        pytest.skip("needs a mount namespace for the Workers (unshare, as root)")
    # The service's data dir is where the Workers see an empty tmpfs: its ledgers are in the
    # bucket, which the executors open themselves (the probe checks the bucket from them).
    found = s3_settings()
    assert found is not None
    storage = {k: v for k, v in found.items() if k.startswith(("COMPACTOR_", "AWS_"))}
    storage["COMPACTOR_STORAGE_URL"] = f"{storage['COMPACTOR_STORAGE_URL'].rstrip('/')}/cluster-{os.getpid()}"
    srv = server_factory(
        cluster.hidden / "objects" / "data", env={**cluster_env(cluster, executor_py), **storage}
    )
    srv.start()
    assert wait_for_compaction_state(srv.url) == "available", srv.log.read_text()[-3000:]
    compact_twice_and_check(srv)
    assert not list((cluster.hidden / "objects").rglob("*.parquet"))  # nothing on the shared-nothing disk
    srv.stop()


def test_a_storage_root_the_executors_cannot_read_is_refused_at_start_up(
    cluster: SparkCluster, executor_py: Path, server_factory
) -> None:
    if cluster.hidden is None:
        pytest.skip("needs a mount namespace for the Workers (unshare, as root)")
    # The driver's disk has this directory; the Workers see an empty tmpfs in its place. The
    # executors' interpreter arrives this time as an archive Spark unpacks beside each of them.
    env = cluster_env(
        cluster, "./environment/bin/python", COMPACTOR_SPARK_ARCHIVES=f"{executor_archive()}#environment"
    )
    # One executor is enough to be refused: spare the machine the second one.
    conf = json.loads(env["COMPACTOR_SPARK_CONF"])
    env["COMPACTOR_SPARK_CONF"] = json.dumps({**conf, "spark.cores.max": "1"})
    # A storage root on the driver's disk, whatever storage the other tests' servers use.
    env["COMPACTOR_STORAGE_URL"] = str(cluster.hidden / "data")
    srv = server_factory(cluster.hidden / "data", env=env)
    srv.start()
    state = wait_for_compaction_state(srv.url)
    assert state.startswith("unavailable: "), state
    reason = state.removeprefix("unavailable: ")
    root = (cluster.hidden / "data").resolve()
    assert f"the storage root {root} is not readable at the same path on the executors" in reason
    assert f"mount it at {root} on every worker" in reason and "\n" not in reason
    # The probe's tasks did import pyarrow, numpy and pandas from the unpacked archive.
    assert "FileNotFoundError: No such file or directory" in reason

    with Client(srv.url) as client:
        client.admin.topics.create(TOPIC)
        client.create_producer(TOPIC).send_many([("a", b"1"), ("a", b"2")])
        client.admin.topics.compact(TOPIC)
        status = client.admin.topics.wait_for_compaction(TOPIC, timeout=180)
    assert status.status == "ERROR"
    assert status.last_error == f"compaction unavailable: {reason}"
    srv.stop()
