"""Produce on each write-ahead mode: ``COMPACTOR_WAL=local`` (a file on the local disk,
fsynced per request, group-committed) on local storage and on the bucket, and
``COMPACTOR_WAL=object`` (every instance's appends stored as one object every
``COMPACTOR_WAL_FLUSH_MS``) on the bucket, each a real ``compactor serve`` on its defaults.

Measured per configuration (medians over ``runs``; a fresh topic each):

- throughput: ``threads`` producers (each its own ``Client``), ``Producer.send_many`` of
  ``batches`` x 1,000 messages in all (100-byte values, keyed), one request per 1,000;
- acknowledgement latency of one request of 1,000 messages, one producer, in sequence: p50
  and p99 of ``latency_requests`` requests.

The servers run one after the other, a run of each in turn, so other load on the machine falls
on all of them alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.benchmarks.measure import median, percentile
from tests.benchmarks.serving import BATCH, _messages
from tests.server import ServerProcess

TOPIC_BASE = "public/default/wal-mode"


@dataclass(frozen=True)
class WalParams:
    batches: int = 200
    threads: int = 8
    latency_requests: int = 200
    value_bytes: int = 100
    runs: int = 3

    @classmethod
    def quick(cls) -> WalParams:
        return cls(batches=40, latency_requests=50, runs=2)


@dataclass
class WalResult:
    label: str
    throughput: list[float] = field(default_factory=list)  # messages/s
    latencies_ms: list[list[float]] = field(default_factory=list)  # per run, per request of 1,000

    @property
    def p50_ms(self) -> float:
        return median([percentile(r, 50) for r in self.latencies_ms])

    @property
    def p99_ms(self) -> float:
        return median([percentile(r, 99) for r in self.latencies_ms])


class WalModesBench:
    """One server per configuration (``configs``: label -> its ``COMPACTOR_*`` settings)."""

    def __init__(
        self,
        work_dir: Path,
        configs: dict[str, dict[str, str]],
        params: WalParams,
        log: Callable[[str], None] = print,
    ) -> None:
        self.params = params
        self.log = log
        self.servers = {
            label: ServerProcess(work_dir / f"wal-{i}" / "data", env={"COMPACTOR_FSYNC": "always", **env})
            for i, (label, env) in enumerate(configs.items())
        }
        self._topics = 0

    def run(self) -> list[WalResult]:
        results = {label: WalResult(label) for label in self.servers}
        for s in self.servers.values():
            s.start()
        try:
            for s in self.servers.values():
                _wait_warm(s)
            for i in range(self.params.runs):
                for label, server in self.servers.items():
                    r = results[label]
                    r.throughput.append(self._throughput(server))
                    r.latencies_ms.append(self._latency(server))
                    self.log(
                        f"produce run {i + 1} ({label}): {r.throughput[-1]:,.0f} msg/s, "
                        f"p50 {percentile(r.latencies_ms[-1], 50):.1f} ms, "
                        f"p99 {percentile(r.latencies_ms[-1], 99):.1f} ms per 1,000"
                    )
        finally:
            for s in self.servers.values():
                s.stop()
        return list(results.values())

    def _topic(self, server: ServerProcess, client: object) -> str:
        self._topics += 1
        topic = f"persistent://{TOPIC_BASE}-{self._topics}"
        client.admin.topics.create(topic)  # type: ignore[attr-defined]
        return topic

    def _throughput(self, server: ServerProcess) -> float:
        from api.client import Client

        p = self.params
        per_thread = max(1, p.batches // p.threads)
        rng = np.random.default_rng(self._topics)
        work = [_messages(rng, per_thread * BATCH, 100_000, p.value_bytes) for _ in range(p.threads)]
        with Client(server.url, timeout=120.0) as admin:
            topic = self._topic(server, admin)
        clients = [Client(server.url, timeout=120.0) for _ in range(p.threads)]
        producers = [c.create_producer(topic) for c in clients]
        errors: list[BaseException] = []
        start = threading.Barrier(p.threads + 1)

        def send(i: int) -> None:
            try:
                start.wait()
                producers[i].send_many(work[i])
            except BaseException as e:  # reported below
                errors.append(e)

        pool = [threading.Thread(target=send, args=(i,)) for i in range(p.threads)]
        for t in pool:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - t0
        for c in clients:
            c.close()
        if errors:
            raise errors[0]
        return p.threads * per_thread * BATCH / seconds

    def _latency(self, server: ServerProcess) -> list[float]:
        from api.client import Client

        p = self.params
        rng = np.random.default_rng(7)
        out: list[float] = []
        with Client(server.url, timeout=120.0) as client:
            producer = client.create_producer(self._topic(server, client))
            for i in range(p.latency_requests + 5):
                batch = _messages(rng, BATCH, 100_000, p.value_bytes)
                t0 = time.perf_counter()
                producer.send_many(batch)
                if i >= 5:  # the first ones warm the connection
                    out.append((time.perf_counter() - t0) * 1000)
        return out


def rows(results: list[WalResult]) -> list[list[str]]:
    """The table's rows: configuration, throughput, p50 and p99 of a request of 1,000."""
    return [[r.label, f"{median(r.throughput):,.0f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}"] for r in results]


def _wait_warm(server: ServerProcess, timeout: float = 600.0) -> None:
    """Until the server's start-up warm-up (a Spark job) is over: it would share the cores."""
    import httpx

    deadline = time.monotonic() + timeout
    while httpx.get(f"{server.url}/health", timeout=10).json().get("warmingUp"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.url}: the warm-up did not end in {timeout:g} s")
        time.sleep(0.2)
