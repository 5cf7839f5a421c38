"""Several instances on one PostgreSQL database and one storage root (docs/operations.md, "Running several
instances"): produce throughput through one instance and through two, and the time from a
kill -9 of a topic's owner until another instance acknowledges a produce of that topic.

Throughput: ``topics`` topics, ``producers`` threads each sending batches of ``batch`` messages
of ``value_bytes`` for ``seconds``, round-robin over the topics, each producer through one of
the instances (the client follows the redirect to the topic's owner and stays there). The one-
and two-instance runs use PostgreSQL alike, so the difference is the second instance.

Takeover: a producer keeps the topic busy through the survivor; the owner is killed with
SIGKILL, and a produce is tried at the survivor every 20 ms until it is acknowledged.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from api.client import Client, ClientError
from tests.benchmarks.report import Table
from tests.server import POSTGRES_ENV, ServerProcess, fresh_database_url

REPO_ROOT = Path(__file__).resolve().parents[2]
NS = "public/default"


@dataclass(frozen=True)
class InstancesParams:
    topics: int = 8
    producers: int = 8
    batch: int = 100
    value_bytes: int = 100
    seconds: float = 10.0
    runs: int = 3
    leases_ms: tuple[int, ...] = (2_000, 10_000)

    @classmethod
    def quick(cls) -> InstancesParams:
        return cls(seconds=4.0, runs=2, leases_ms=(2_000,))


@dataclass
class InstancesResult:
    one: list[float] = field(default_factory=list)  # messages/s through one instance, per run
    two: list[float] = field(default_factory=list)
    takeover_s: dict[int, list[float]] = field(default_factory=dict)  # by lease (ms)
    params: InstancesParams = field(default_factory=InstancesParams)


def postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        return url
    out = subprocess.run([str(REPO_ROOT / ".ci" / "postgres")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


class InstancesBench:
    def __init__(self, work_dir: Path, params: InstancesParams, log: Callable[[str], None]) -> None:
        self.work_dir = work_dir
        self.params = params
        self.log = log
        self.admin = postgres_admin_url()
        self._n = 0

    def _cluster(self, n: int, lease_ms: int = 10_000) -> list[ServerProcess]:
        self._n += 1
        url = fresh_database_url(f"bench_instances_{self._n}", admin=self.admin)
        env = {
            "COMPACTOR_DATABASE_URL": url or "",
            "COMPACTOR_OWNERSHIP_LEASE_MS": str(lease_ms),
            "COMPACTOR_SPARK_WARMUP": "false",
            "COMPACTOR_FSYNC": "always",
        }
        data = self.work_dir / f"instances-{self._n}" / "data"
        servers = []
        for _ in range(n):
            s = ServerProcess(data, env=dict(env))
            s.start()
            servers.append(s)
        return servers

    def run(self) -> InstancesResult:
        result = InstancesResult(params=self.params)
        for run in range(self.params.runs):
            for n, into in ((1, result.one), (2, result.two)):
                servers = self._cluster(n)
                try:
                    rate = self._throughput(servers)
                finally:
                    for s in servers:
                        s.kill()
                self.log(f"instances: run {run + 1}, {n} instance(s): {rate:,.0f} msg/s")
                into.append(rate)
        for lease_ms in self.params.leases_ms:
            for run in range(self.params.runs):
                servers = self._cluster(2, lease_ms)
                try:
                    took = self._takeover(servers)
                finally:
                    for s in servers:
                        s.kill()
                self.log(f"instances: takeover with a {lease_ms} ms lease, run {run + 1}: {took:.2f} s")
                result.takeover_s.setdefault(lease_ms, []).append(took)
        return result

    def _throughput(self, servers: list[ServerProcess]) -> float:
        p = self.params
        servers[0].create_namespaces(NS)
        topics = [f"{NS}/bench-{i}" for i in range(p.topics)]
        with Client(servers[0].url) as c:
            for t in topics:
                c.admin.topics.create(t)
        value = b"x" * p.value_bytes
        counts = [0] * p.producers
        start = threading.Barrier(p.producers + 1)
        deadline: list[float] = [0.0]

        def produce(i: int) -> None:
            with Client(servers[i % len(servers)].url) as c:
                producers = [c.create_producer(t) for t in topics]
                batch = [(f"k{j}", value) for j in range(p.batch)]
                for pr in producers:  # learn each topic's owner before the clock starts
                    pr.send_many(batch[:1])
                start.wait()
                k = i
                while time.monotonic() < deadline[0]:
                    producers[k % len(producers)].send_many(batch)
                    counts[i] += p.batch
                    k += 1

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(p.producers)]
        for t in threads:
            t.start()
        deadline[0] = time.monotonic() + 3600
        start.wait()
        began = time.monotonic()
        deadline[0] = began + p.seconds
        for t in threads:
            t.join()
        return sum(counts) / (time.monotonic() - began)

    def _takeover(self, servers: list[ServerProcess]) -> float:
        a, b = servers
        a.create_namespaces(NS)
        topic = f"{NS}/takeover"
        with Client(a.url) as c:
            c.admin.topics.create(topic)
            owner_url = c.admin.topics.lookup(topic)
        owner, survivor = (a, b) if owner_url == a.url else (b, a)
        stop = threading.Event()

        def produce() -> None:
            with Client(survivor.url, retry_unavailable_s=120) as c:
                producer = c.create_producer(topic)
                while not stop.is_set():
                    with contextlib.suppress(ClientError):
                        producer.send(b"v", key="k")

        thread = threading.Thread(target=produce)
        thread.start()
        time.sleep(1.0)
        owner.kill()
        killed = time.monotonic()
        body = {"messages": [{"key": "probe", "value": "cA=="}]}
        seen: dict[int, int] = {}
        try:
            while True:
                r = httpx.post(f"{survivor.url}/topics/persistent/{topic}", json=body, timeout=60)
                if r.status_code == 200:
                    return time.monotonic() - killed
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                if time.monotonic() - killed > 120:
                    raise RuntimeError(
                        f"the survivor never took the topic over; answers {seen}, last {r.text[:300]}; "
                        f"its log: {survivor.log}"
                    )
                time.sleep(0.02)
        finally:
            stop.set()
            thread.join()


def instances_table(r: InstancesResult) -> Table:
    p = r.params
    t = Table(
        "Several instances on one PostgreSQL: produce throughput and takeover after kill -9",
        ["measure", "median", "min", "max"],
    )
    for label, rates in (("produce, 1 instance (msg/s)", r.one), ("produce, 2 instances (msg/s)", r.two)):
        if rates:
            t.add(label, f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}", f"{max(rates):,.0f}")
    if r.one and r.two:
        t.add("2 instances / 1", f"{statistics.median(r.two) / statistics.median(r.one):.2f}x", "", "")
    for lease_ms, times in sorted(r.takeover_s.items()):
        t.add(
            f"takeover after kill -9, lease {lease_ms / 1000:g} s (s)",
            f"{statistics.median(times):.2f}",
            f"{min(times):.2f}",
            f"{max(times):.2f}",
        )
    t.notes.append(
        f"{p.producers} producer threads, batches of {p.batch} x {p.value_bytes} B over {p.topics} topics "
        f"for {p.seconds:g} s, fsync always, {p.runs} runs; takeover: kill -9 of the owner to the first "
        "produce the survivor acknowledges (polled every 20 ms)"
    )
    return t
