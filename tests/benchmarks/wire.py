"""Pulsar's binary protocol beside REST, on one real ``compactor serve`` (fsync ``always``).

``python -m tests.benchmarks --only wire`` (or ``python -m tests.benchmarks.wire``). What each
row measures (medians of ``runs``, a fresh topic per run, 100-byte values, keyed):

- produce: ``messages`` messages from 1 producer, and from 4 producers at once. Over the wire:
  the official client's ``send_async``, unbatched (4 producers: threads, each its own client),
  and batched (the client's defaults: up to 1,000 messages or 10 ms a batch; 4 producers:
  processes, each its own client, since the Python client spends tens of microseconds of its
  own per ``send_async``); over REST: ``api.client`` ``send_many`` of 1,000 per request.
  Messages/s from the first send to the last receipt.
- consume: a consumer from the earliest message reading those ``messages`` (acknowledging
  each, as an application does), and a readCompacted consumer after a compaction (``keys``
  keys), of a topic produced unbatched and of one produced in batches. Over REST:
  ``batch_receive`` of 1,000 with a cumulative ack per page.
- latency: ``latency_messages`` sends at ``rate`` a second, unbatched, and batched at
  ``batched_rate`` a second, each timed from the send to its delivery to a subscribed
  consumer (publish to receive, the same clock); p50 and p99.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.measure import median, percentile
from tests.benchmarks.report import Table
from tests.server import ServerProcess


@dataclass(frozen=True)
class WireParams:
    messages: int = 100_000
    keys: int = 10_000
    value_bytes: int = 100
    latency_messages: int = 3_000
    rate: int = 1_000
    batched_latency_messages: int = 30_000
    batched_rate: int = 10_000
    runs: int = 3

    @classmethod
    def quick(cls, runs: int = 2) -> WireParams:
        return cls(
            messages=20_000, keys=2_000, latency_messages=1_000, batched_latency_messages=5_000, runs=runs
        )


@dataclass
class WireResult:
    params: WireParams
    figures: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, what: str, protocol: str, value: float) -> None:
        self.figures.setdefault((what, protocol), []).append(value)


def _values(n: int, size: int) -> list[tuple[str, bytes]]:
    blob = os.urandom(size)
    return [(f"key-{i}", blob[: size - 8] + i.to_bytes(8, "big")) for i in range(n)]


class WireBench:
    def __init__(self, work_dir: Path, params: WireParams, log: Callable[[str], None] = print) -> None:
        self.params = params
        self.log = log
        self.server = ServerProcess(Path(work_dir) / "wire" / "data", env={"COMPACTOR_FSYNC": "always"})
        self._n = 0

    def _topic(self, what: str) -> str:
        self._n += 1
        return f"persistent://public/default/{what}-{self._n}"

    def run(self) -> WireResult:
        import pulsar

        result = WireResult(self.params)
        self.server.start()
        try:
            self.client = pulsar.Client(
                self.server.pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
            )
            for i in range(self.params.runs):
                self.log(f"wire: run {i + 1} of {self.params.runs}")
                for producers in (1, 4):
                    result.add(f"produce, {producers} producer(s)", "wire", self.produce_wire(producers))
                    result.add(f"produce, {producers} producer(s)", "REST", self.produce_rest(producers))
                    result.add(
                        f"produce batched, {producers} producer(s)", "wire", self.produce_batched(producers)
                    )
                topic = self._topic("consume")
                self.produce_rest(1, topic=topic)
                result.add("consume", "wire", self.consume_wire(topic, read_compacted=False))
                result.add("consume", "REST", self.consume_rest(topic, read_compacted=False))
                self.compact(topic)
                result.add("consume readCompacted", "wire", self.consume_wire(topic, read_compacted=True))
                result.add("consume readCompacted", "REST", self.consume_rest(topic, read_compacted=True))
                topic = self._topic("consume-batched")
                self.produce_batched(1, topic=topic)
                result.add("consume, batched topic", "wire", self.consume_wire(topic, read_compacted=False))
                result.add("consume, batched topic", "REST", self.consume_rest(topic, read_compacted=False))
                self.compact(topic)
                result.add(
                    "consume readCompacted, batched topic",
                    "wire",
                    self.consume_wire(topic, read_compacted=True),
                )
                p50, p99 = self.latency_wire(batched=False)
                result.add(f"latency p50 ms at {self.params.rate:,} msg/s", "wire", p50)
                result.add(f"latency p99 ms at {self.params.rate:,} msg/s", "wire", p99)
                p50, p99 = self.latency_wire(batched=True)
                result.add(f"latency p50 ms at {self.params.batched_rate:,} msg/s, batched", "wire", p50)
                result.add(f"latency p99 ms at {self.params.batched_rate:,} msg/s, batched", "wire", p99)
            self.client.close()
        finally:
            self.server.stop()
        return result

    # ------------------------------------------------------------------ produce

    def produce_wire(self, producers: int) -> float:
        import pulsar

        topic = self._topic("produce-wire")
        n = self.params.messages // producers
        messages = _values(n, self.params.value_bytes)
        clients = [
            pulsar.Client(self.server.pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            for _ in range(producers)
        ]
        try:
            prods = [
                c.create_producer(topic, batching_enabled=False, block_if_queue_full=True) for c in clients
            ]
            done = threading.Semaphore(0)

            def send_all(p: pulsar.Producer) -> None:
                left = [n]
                lock = threading.Lock()

                def receipt(res: object, _mid: object) -> None:
                    with lock:
                        left[0] -= 1
                        if left[0] == 0:
                            done.release()

                for key, value in messages:
                    p.send_async(value, receipt, partition_key=key)

            start = time.perf_counter()
            threads = [threading.Thread(target=send_all, args=(p,)) for p in prods]
            for t in threads:
                t.start()
            for _ in prods:
                done.acquire()
            elapsed = time.perf_counter() - start
        finally:
            for c in clients:
                c.close()
        return n * producers / elapsed

    def produce_batched(self, producers: int, topic: str | None = None) -> float:
        """Batched sends from ``producers`` processes at once (see the module docstring)."""
        topic = topic or self._topic("produce-batched")
        n = self.params.messages // producers
        ctx = multiprocessing.get_context("spawn")
        url, size = self.server.pulsar_url, self.params.value_bytes
        with ctx.Pool(producers) as pool:
            # All start at one moment, once each has its client and messages ready.
            start_at = time.time() + 5
            runs = [
                pool.apply_async(_send_batched, (url, topic, n, size, start_at)) for _ in range(producers)
            ]
            spans = [r.get(600) for r in runs]
        first = min(start for start, _ in spans)
        last = max(end for _, end in spans)
        return n * producers / (last - first)

    def produce_rest(self, producers: int, topic: str | None = None) -> float:
        from api.client import Client, Conflict, OutgoingMessage

        topic = topic or self._topic("produce-rest")
        n = self.params.messages // producers
        batches = [
            [OutgoingMessage(key=k, value=v) for k, v in _values(n, self.params.value_bytes)[i : i + 1000]]
            for i in range(0, n, 1000)
        ]
        clients = [Client(self.server.url, timeout=120.0) for _ in range(producers)]
        with contextlib.suppress(Conflict):  # REST produces to topics that exist
            clients[0].admin.topics.create(topic.removeprefix("persistent://"))
        try:
            prods = [c.create_producer(topic.removeprefix("persistent://")) for c in clients]

            def send_all(p: object) -> None:
                for b in batches:
                    p.send_many(b)  # type: ignore[attr-defined]

            start = time.perf_counter()
            threads = [threading.Thread(target=send_all, args=(p,)) for p in prods]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - start
        finally:
            for c in clients:
                c.close()
        return n * producers / elapsed

    # ------------------------------------------------------------------ consume

    def expected(self, read_compacted: bool) -> int:
        return min(self.params.keys, self.params.messages) if read_compacted else self.params.messages

    def consume_wire(self, topic: str, *, read_compacted: bool) -> float:
        import pulsar

        want = self.expected(read_compacted)
        start = time.perf_counter()
        consumer = self.client.subscribe(
            topic,
            f"wire-{self._n}-{read_compacted}",
            initial_position=pulsar.InitialPosition.Earliest,
            is_read_compacted=read_compacted,
        )
        self._n += 1
        for _ in range(want):
            consumer.acknowledge(consumer.receive(30_000))
        elapsed = time.perf_counter() - start
        consumer.close()
        return want / elapsed

    def consume_rest(self, topic: str, *, read_compacted: bool) -> float:
        from api.client import Client

        want = self.expected(read_compacted)
        with Client(self.server.url, timeout=120.0) as client:
            start = time.perf_counter()
            consumer = client.subscribe(
                topic.removeprefix("persistent://"),
                f"rest-{self._n}-{read_compacted}",
                initial_position="earliest",
                read_compacted=read_compacted,
                receiver_queue_size=1000,
            )
            self._n += 1
            got = 0
            while got < want:
                batch = consumer.batch_receive(max_messages=1000, timeout_millis=5000)
                got += len(batch)
                consumer.acknowledge_cumulative(batch[-1])
            elapsed = time.perf_counter() - start
            consumer.close()
        return want / elapsed

    def compact(self, topic: str) -> None:
        from api.client import Client

        with Client(self.server.url, timeout=300.0) as client:
            name = topic.removeprefix("persistent://")
            client.admin.topics.compact(name)
            assert client.admin.topics.wait_for_compaction(name, timeout=300).status == "SUCCESS"

    # ------------------------------------------------------------------ latency

    def latency_wire(self, *, batched: bool) -> tuple[float, float]:
        topic = self._topic("latency")
        consumer = self.client.subscribe(topic, "latency")
        producer = self.client.create_producer(
            topic, batching_enabled=batched, batching_max_publish_delay_ms=1, block_if_queue_full=True
        )
        sent: dict[bytes, float] = {}
        lat: list[float] = []
        done = threading.Event()
        n = self.params.batched_latency_messages if batched else self.params.latency_messages

        def receive() -> None:
            for _ in range(n):
                m = consumer.receive(30_000)
                lat.append((time.perf_counter() - sent[m.data()]) * 1000)
                consumer.acknowledge(m)
            done.set()

        t = threading.Thread(target=receive)
        t.start()
        interval = 1 / (self.params.batched_rate if batched else self.params.rate)
        start = time.perf_counter()
        for i in range(n):
            wait = start + i * interval - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            value = i.to_bytes(8, "big") + b"x" * (self.params.value_bytes - 8)
            sent[value] = time.perf_counter()
            producer.send_async(value, None)
        done.wait(60)
        t.join(1)
        producer.flush()
        producer.close()
        consumer.close()
        return percentile(lat, 50), percentile(lat, 99)


def _send_batched(url: str, topic: str, n: int, value_bytes: int, start_at: float) -> tuple[float, float]:
    """In a process of its own: ``n`` batched sends; returns when the first went and the last
    receipt came (``time.time``, comparable across processes)."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=10,
            max_pending_messages=30_000,
            block_if_queue_full=True,
        )
        messages = _values(n, value_bytes)
        left = [n]
        done = threading.Event()
        lock = threading.Lock()

        def receipt(res: object, _mid: object) -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        time.sleep(max(0.0, start_at - time.time()))
        start = time.time()
        for key, value in messages:
            producer.send_async(value, receipt, partition_key=key)
        done.wait(600)
        return start, time.time()
    finally:
        client.close()


def wire_table(result: WireResult) -> Table:
    p = result.params
    table = Table(
        f"Pulsar's binary protocol beside REST ({p.messages:,} messages of {p.value_bytes} bytes; "
        f"medians of {p.runs})",
        ["measure", "wire (pulsar-client)", "REST (api.client)"],
    )
    whats = []
    for what, _ in result.figures:
        if what not in whats:
            whats.append(what)
    for what in whats:
        cells = []
        for proto in ("wire", "REST"):
            values = result.figures.get((what, proto))
            if not values:
                cells.append("-")
            elif "latency" in what:
                cells.append(f"{median(values):.2f}")
            else:
                cells.append(f"{median(values):,.0f} msg/s")
        table.add(what, *cells)
    table.notes.append(
        "wire produce: unbatched, or batched (up to 1,000 messages or 10 ms a batch; 4 producers are "
        f"processes); latency send to delivery, {p.latency_messages:,} messages unbatched, "
        f"{p.batched_latency_messages:,} batched (1 ms batches)"
    )
    return table


if __name__ == "__main__":
    import sys
    import tempfile

    quick = "--quick" in sys.argv
    params = WireParams.quick() if quick else WireParams()
    with tempfile.TemporaryDirectory(prefix="wire-bench-") as d:
        print(wire_table(WireBench(Path(d), params).run()).text())
