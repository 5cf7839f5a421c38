"""TLS's cost: the same produce, consume and latency over the plain ports and the TLS ports of
one real ``compactor serve`` (fsync ``always``; the binary protocol's
``COMPACTOR_BROKER_SERVICE_PORT_TLS`` and HTTPS's ``COMPACTOR_WEB_SERVICE_PORT_TLS``, a
throw-away CA's ECDSA P-256 certificate from ``tests.certificates``; no client certificate).

``python -m tests.benchmarks --only tls`` (or ``python -m tests.benchmarks.wire_tls [--quick]``).
Each run measures plain then TLS, a fresh topic each, 100-byte keyed values:

- wire produce: ``messages`` from 1 producer of the official client, unbatched (``send_async``)
  and batched (up to 1,000 messages or 10 ms a batch); from the first send to the last receipt.
- wire consume: a consumer from the earliest of those ``messages``, acknowledging each.
- wire latency: ``latency_messages`` unbatched sends at ``rate`` a second, send to delivery,
  p50 and p99.
- REST produce and consume: ``api.client`` ``send_many`` of 1,000 per request, and
  ``batch_receive`` of 1,000 with a cumulative ack per page, over HTTP and HTTPS.
- server CPU: the server process's user + system time over the unbatched wire produce and its
  consume, and over the REST produce and consume, per message moved (each message counted once
  produced and once consumed): TLS's cost less disturbed by other work on the machine than
  throughput is.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks.measure import median, percentile
from tests.benchmarks.report import Table
from tests.certificates import TlsFiles, make_tls_files
from tests.server import ServerProcess, free_port

WIRE_CPU = "server CPU µs a message, wire unbatched produce + consume"
REST_CPU = "server CPU µs a message, REST produce + consume"


@dataclass(frozen=True)
class TlsParams:
    messages: int = 100_000
    value_bytes: int = 100
    latency_messages: int = 3_000
    rate: int = 1_000
    runs: int = 3

    @classmethod
    def quick(cls, runs: int = 2) -> TlsParams:
        return cls(messages=20_000, latency_messages=1_000, runs=runs)


@dataclass
class TlsResult:
    params: TlsParams
    figures: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, what: str, transport: str, value: float) -> None:
        self.figures.setdefault((what, transport), []).append(value)


@dataclass(frozen=True)
class Endpoints:
    """One transport's URLs and the client options it needs."""

    name: str  # "plain" or "TLS"
    broker_url: str
    rest_url: str
    trust: str | None  # the CA file, for TLS


def _values(n: int, size: int) -> list[tuple[str, bytes]]:
    blob = b"v" * (size - 8)
    return [(f"key-{i}", blob + i.to_bytes(8, "big")) for i in range(n)]


class TlsBench:
    def __init__(self, work_dir: Path, params: TlsParams, log: Callable[[str], None] = print) -> None:
        self.params = params
        self.log = log
        self.files: TlsFiles = make_tls_files(Path(work_dir) / "wire-tls" / "certs")
        self.server = ServerProcess(
            Path(work_dir) / "wire-tls" / "data",
            env={
                "COMPACTOR_FSYNC": "always",
                "COMPACTOR_TLS_CERT_FILE": str(self.files.server_cert),
                "COMPACTOR_TLS_KEY_FILE": str(self.files.server_key),
                "COMPACTOR_BROKER_SERVICE_PORT_TLS": str(free_port()),
                "COMPACTOR_WEB_SERVICE_PORT_TLS": str(free_port()),
            },
        )
        self._n = 0

    def _topic(self, what: str) -> str:
        self._n += 1
        return f"persistent://public/default/{what}-{self._n}"

    def run(self) -> TlsResult:
        result = TlsResult(self.params)
        self.server.start()
        try:
            health = httpx.get(f"{self.server.url}/health", timeout=10).json()
            transports = [
                Endpoints("plain", self.server.pulsar_url, self.server.url, None),
                Endpoints(
                    "TLS", health["brokerServiceUrlTls"], health["webServiceUrlTls"], str(self.files.ca)
                ),
            ]
            for i in range(self.params.runs):
                self.log(f"tls: run {i + 1} of {self.params.runs}")
                for ends in transports:
                    topic = self._topic("unbatched")
                    cpu = self._server_cpu()
                    result.add("wire produce, unbatched", ends.name, self.produce_wire(ends, topic, False))
                    result.add("wire consume", ends.name, self.consume_wire(ends, topic))
                    result.add(WIRE_CPU, ends.name, self._cpu_per_message(cpu, 2 * self.params.messages))
                    result.add("wire produce, batched", ends.name, self.produce_wire(ends, None, True))
                    p50, p99 = self.latency_wire(ends)
                    result.add(f"wire latency p50 ms at {self.params.rate:,} msg/s", ends.name, p50)
                    result.add(f"wire latency p99 ms at {self.params.rate:,} msg/s", ends.name, p99)
                    topic = self._topic("rest")
                    cpu = self._server_cpu()
                    result.add("REST produce", ends.name, self.produce_rest(ends, topic))
                    result.add("REST consume", ends.name, self.consume_rest(ends, topic))
                    result.add(REST_CPU, ends.name, self._cpu_per_message(cpu, 2 * self.params.messages))
        finally:
            self.server.stop()
        return result

    def _server_cpu(self) -> float:
        """CPU seconds (user + system) the server's process has used so far."""
        import psutil

        assert self.server.proc is not None
        times = psutil.Process(self.server.proc.pid).cpu_times()
        return float(times.user + times.system)

    def _cpu_per_message(self, since: float, messages: int) -> float:
        return (self._server_cpu() - since) / messages * 1e6

    def _client(self, ends: Endpoints) -> Any:
        import pulsar

        return pulsar.Client(
            ends.broker_url,
            tls_trust_certs_file_path=ends.trust,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )

    # ------------------------------------------------------------------ the wire

    def produce_wire(self, ends: Endpoints, topic: str | None, batched: bool) -> float:
        n = self.params.messages
        messages = _values(n, self.params.value_bytes)
        client = self._client(ends)
        try:
            producer = client.create_producer(
                topic or self._topic("batched"),
                batching_enabled=batched,
                batching_max_messages=1000,
                batching_max_publish_delay_ms=10,
                max_pending_messages=30_000,
                block_if_queue_full=True,
            )
            left = [n]
            done = threading.Event()
            lock = threading.Lock()

            def receipt(res: object, _mid: object) -> None:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

            start = time.perf_counter()
            for key, value in messages:
                producer.send_async(value, receipt, partition_key=key)
            done.wait(600)
            elapsed = time.perf_counter() - start
        finally:
            client.close()
        return n / elapsed

    def consume_wire(self, ends: Endpoints, topic: str) -> float:
        import pulsar

        client = self._client(ends)
        try:
            start = time.perf_counter()
            consumer = client.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest)
            for _ in range(self.params.messages):
                consumer.acknowledge(consumer.receive(30_000))
            elapsed = time.perf_counter() - start
        finally:
            client.close()
        return self.params.messages / elapsed

    def latency_wire(self, ends: Endpoints) -> tuple[float, float]:
        client = self._client(ends)
        topic = self._topic("latency")
        try:
            consumer = client.subscribe(topic, "latency")
            producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            n, interval = self.params.latency_messages, 1 / self.params.rate
            sent: dict[bytes, float] = {}
            lat: list[float] = []

            def receive() -> None:
                for _ in range(n):
                    m = consumer.receive(30_000)
                    lat.append((time.perf_counter() - sent[m.data()]) * 1000)
                    consumer.acknowledge(m)

            t = threading.Thread(target=receive)
            t.start()
            start = time.perf_counter()
            for i in range(n):
                wait = start + i * interval - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                value = i.to_bytes(8, "big") + b"x" * (self.params.value_bytes - 8)
                sent[value] = time.perf_counter()
                producer.send_async(value, None)
            t.join(60)
        finally:
            client.close()
        return percentile(lat, 50), percentile(lat, 99)

    # ------------------------------------------------------------------ REST

    def _rest(self, ends: Endpoints) -> Any:
        from api.client import Client

        return Client(ends.rest_url, timeout=120.0, tls_trust_certs_file_path=ends.trust)

    def produce_rest(self, ends: Endpoints, topic: str) -> float:
        from api.client import Conflict, OutgoingMessage

        name = topic.removeprefix("persistent://")
        n = self.params.messages
        values = _values(n, self.params.value_bytes)
        batches = [
            [OutgoingMessage(key=k, value=v) for k, v in values[i : i + 1000]] for i in range(0, n, 1000)
        ]
        with self._rest(ends) as client:
            with contextlib.suppress(Conflict):
                client.admin.topics.create(name)
            producer = client.create_producer(name)
            start = time.perf_counter()
            for batch in batches:
                producer.send_many(batch)
            elapsed = time.perf_counter() - start
        return n / elapsed

    def consume_rest(self, ends: Endpoints, topic: str) -> float:
        with self._rest(ends) as client:
            start = time.perf_counter()
            consumer = client.subscribe(
                topic.removeprefix("persistent://"),
                "bench",
                initial_position="earliest",
                receiver_queue_size=1000,
            )
            got = 0
            while got < self.params.messages:
                batch = consumer.batch_receive(max_messages=1000, timeout_millis=5000)
                got += len(batch)
                consumer.acknowledge_cumulative(batch[-1])
            elapsed = time.perf_counter() - start
            consumer.close()
        return got / elapsed


def tls_table(result: TlsResult) -> Table:
    p = result.params
    table = Table(
        f"TLS's cost: the plain ports beside the TLS ports of one server ({p.messages:,} messages of "
        f"{p.value_bytes} bytes; medians of {p.runs})",
        ["measure", "plain", "TLS", "TLS / plain"],
    )
    whats: list[str] = []
    for what, _ in result.figures:
        if what not in whats:
            whats.append(what)
    for what in whats:
        plain, tls = (median(result.figures[(what, t)]) for t in ("plain", "TLS"))
        if "latency" in what or "CPU" in what:
            table.add(what, f"{plain:.2f}", f"{tls:.2f}", f"{tls / plain:.2f}x")
        else:
            table.add(what, f"{plain:,.0f} msg/s", f"{tls:,.0f} msg/s", f"{tls / plain:.2f}x")
    table.notes.append(
        "TLS: pulsar+ssl:// and https:// with the server's ECDSA P-256 certificate, no client "
        "certificate; wire from one official client (unbatched, or batched up to 1,000 messages or "
        "10 ms); REST through api.client, 1,000 messages a request or a page"
    )
    return table


if __name__ == "__main__":
    import sys

    params = TlsParams.quick() if "--quick" in sys.argv else TlsParams()
    with tempfile.TemporaryDirectory(prefix="tls-bench-") as d:
        print(tls_table(TlsBench(Path(d), params).run()).text())
