"""Serving benchmarks against a real ``compactor serve`` process, through ``api.client``.

The server runs on 127.0.0.1 with its own temporary data directory and SQLite database,
``COMPACTOR_FSYNC=always`` (every produce request is fsynced before its reply,
group-committed), and otherwise the service's defaults. Before anything is measured it
compacts a small topic once, so its background Spark start-up is over and does not steal
CPU from the measurements. Client and server share the machine's cores.

What is measured (each a median over ``runs``; a fresh topic or subscription per run):

- produce throughput: ``Producer.send_many`` of ``batches`` x 1,000 messages (keyed,
  ``value_bytes`` random bytes), one request per 1,000; from one client, and from 4 client
  threads (each its own ``Client``) sending ``batches / 4`` each at once. Messages are built
  before the clock starts; base64/JSON encoding is the client's and is timed.
- single-message latency: ``Producer.send`` of one message, ``latency_requests`` times in
  sequence, each timed; p50 and p99.
- consume and latest-state load: a topic of ``state_keys`` keys x ``versions`` versions,
  compacted through ``PUT .../compaction`` (waited for). A consumer subscribes from the
  earliest message with ``read_compacted`` false (full replay) or true, receives in batches
  of ``page`` (``batch_receive``), acknowledges each batch cumulatively and builds the
  key -> latest value map, until it has every message it should get, then closes (which
  sends the last acknowledgement: the client groups them every 100 ms, as Pulsar's does).
  Reported: messages/s of each, and the time from subscribing to the closed consumer for
  each; the two maps are checked equal, and the server's backlog checked empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tests.benchmarks.measure import median, percentile
from tests.server import ServerProcess as _ServerProcess

if TYPE_CHECKING:  # imported when used: the compaction benchmarks do not need the client
    from api.client import Client, OutgoingMessage

BATCH = 1000


@dataclass(frozen=True)
class ServingParams:
    batches: int = 200
    threads: int = 4
    latency_requests: int = 2000
    state_keys: int = 20_000
    versions: int = 10
    value_bytes: int = 100
    page: int = 1000
    runs: int = 3

    @classmethod
    def quick(cls, runs: int = 2) -> ServingParams:
        return cls(batches=50, latency_requests=500, state_keys=5000, runs=runs)


@dataclass
class ServingResult:
    params: ServingParams
    produce_one: list[float] = field(default_factory=list)  # messages/s
    produce_threads: list[float] = field(default_factory=list)  # messages/s
    latencies_ms: list[list[float]] = field(default_factory=list)  # per run
    consume_full: list[float] = field(default_factory=list)  # messages/s
    consume_compacted: list[float] = field(default_factory=list)  # messages/s
    load_full_s: list[float] = field(default_factory=list)
    load_compacted_s: list[float] = field(default_factory=list)
    compacted_messages: int = 0
    full_messages: int = 0
    compaction_s: float = 0.0
    client: str = "api.client"

    @property
    def p50_ms(self) -> float:
        return median([percentile(r, 50) for r in self.latencies_ms])

    @property
    def p99_ms(self) -> float:
        return median([percentile(r, 99) for r in self.latencies_ms])

    @property
    def load_speedup(self) -> float:
        return median(self.load_full_s) / median(self.load_compacted_s)


class ServerProcess(_ServerProcess):
    """The service on its defaults (``local[*]`` Spark, warm-up), fsync ``always``."""

    defaults = {"COMPACTOR_FSYNC": "always"}


def _messages(rng: np.random.Generator, n: int, keys: int, value_bytes: int) -> list[OutgoingMessage]:
    from api.client import OutgoingMessage

    data = rng.bytes(n * value_bytes)
    ks = rng.integers(0, keys, size=n)
    return [
        OutgoingMessage(data[i * value_bytes : (i + 1) * value_bytes], f"key-{int(k)}")
        for i, k in enumerate(ks)
    ]


class ServingBench:
    """Runs the serving benchmarks against one server it starts and stops."""

    def __init__(self, work_dir: Path, params: ServingParams, log: Callable[[str], None] = print) -> None:
        self.work_dir = Path(work_dir)
        self.params = params
        self.log = log
        self.server = ServerProcess(self.work_dir / "serving" / "data")
        self._topics = 0

    def _topic(self, what: str) -> str:
        self._topics += 1
        return f"bench/serving/{what}-{self._topics}"

    def run(self) -> ServingResult:
        from api.client import Client

        result = ServingResult(self.params)
        self.server.start()
        try:
            with Client(self.server.url, timeout=120.0) as client:
                self._warm_up(client)
                for i in range(self.params.runs):
                    result.produce_one.append(self._produce(client, threads=1))
                    result.produce_threads.append(self._produce(client, threads=self.params.threads))
                    result.latencies_ms.append(self._latency(client))
                    self.log(
                        f"serving run {i + 1}: produce {result.produce_one[-1]:,.0f}/s (1 client), "
                        f"{result.produce_threads[-1]:,.0f}/s ({self.params.threads} threads), "
                        f"p50 {percentile(result.latencies_ms[-1], 50):.2f} ms"
                    )
                self._state(client, result)
        finally:
            self.server.stop()
        return result

    # ------------------------------------------------------------------ steps

    def _warm_up(self, client: Client) -> None:
        """A tiny compaction: the server's Spark is started and warm before anything is timed."""

        topic = self._topic("warmup")
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        rng = np.random.default_rng(1)
        producer.send_many(_messages(rng, 2000, 100, self.params.value_bytes))
        client.admin.topics.compact(topic)
        status = client.admin.topics.wait_for_compaction(topic, timeout=600)
        if status.status != "SUCCESS":
            raise RuntimeError(f"warm-up compaction failed: {status}")

    def _produce(self, client: Client, *, threads: int) -> float:
        from api.client import Client

        p = self.params
        topic = self._topic(f"produce{threads}")
        client.admin.topics.create(topic)
        per_thread = max(1, p.batches // threads)
        rng = np.random.default_rng(threads)
        work = [_messages(rng, per_thread * BATCH, 100_000, p.value_bytes) for _ in range(threads)]
        clients = [Client(self.server.url, timeout=120.0) for _ in range(threads)]
        producers = [c.create_producer(topic) for c in clients]
        errors: list[BaseException] = []
        start = threading.Barrier(threads + 1)

        def send(i: int) -> None:
            try:
                start.wait()
                producers[i].send_many(work[i])  # requests of BATCH messages each
            except BaseException as e:  # reported below
                errors.append(e)

        pool = [threading.Thread(target=send, args=(i,)) for i in range(threads)]
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
        return threads * per_thread * BATCH / seconds

    def _latency(self, client: Client) -> list[float]:

        p = self.params
        topic = self._topic("latency")
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        msgs = _messages(np.random.default_rng(7), p.latency_requests + 50, 100_000, p.value_bytes)
        out: list[float] = []
        for i, m in enumerate(msgs):
            t0 = time.perf_counter()
            producer.send(m.value, key=m.key)
            if i >= 50:  # the first 50 warm the connection
                out.append((time.perf_counter() - t0) * 1000)
        return out

    def _state(self, client: Client, result: ServingResult) -> None:
        from api.client import OutgoingMessage

        p = self.params
        topic = self._topic("state")
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        rng = np.random.default_rng(11)
        keys = np.arange(p.state_keys)
        for _ in range(p.versions):  # every key once per version, in a fresh random order
            order = rng.permutation(keys)
            data = rng.bytes(len(order) * p.value_bytes)
            producer.send_many(
                OutgoingMessage(data[i * p.value_bytes : (i + 1) * p.value_bytes], f"key-{int(k)}")
                for i, k in enumerate(order)
            )
        t0 = time.perf_counter()
        client.admin.topics.compact(topic)
        status = client.admin.topics.wait_for_compaction(topic, timeout=1800, poll_interval=0.1)
        result.compaction_s = time.perf_counter() - t0
        if status.status != "SUCCESS":
            raise RuntimeError(f"compaction of {topic} failed: {status}")
        result.full_messages = p.state_keys * p.versions
        result.compacted_messages = p.state_keys
        for i in range(p.runs):
            full_s, full_state = self._load(client, topic, f"full-{i}", False, result.full_messages)
            comp_s, comp_state = self._load(client, topic, f"compacted-{i}", True, result.compacted_messages)
            if comp_state != full_state:
                raise AssertionError("readCompacted state differs from the full replay's")
            if len(full_state) != p.state_keys:
                raise AssertionError(f"replay found {len(full_state)} keys, expected {p.state_keys}")
            result.load_full_s.append(full_s)
            result.load_compacted_s.append(comp_s)
            result.consume_full.append(result.full_messages / full_s)
            result.consume_compacted.append(result.compacted_messages / comp_s)
            self.log(
                f"serving state run {i + 1}: full replay {full_s:.2f} s, readCompacted {comp_s:.2f} s "
                f"({full_s / comp_s:.1f}x)"
            )

    def _load(
        self, client: Client, topic: str, sub: str, read_compacted: bool, expected: int
    ) -> tuple[float, dict[str, bytes]]:
        """Subscribe from the earliest message and build key -> latest value from ``expected``
        messages; the seconds from subscribing to the complete map."""

        state: dict[str, bytes] = {}
        got = 0
        t0 = time.perf_counter()
        consumer = client.subscribe(topic, sub, read_compacted=read_compacted, initial_position="earliest")
        while got < expected:
            msgs = consumer.batch_receive(max_messages=self.params.page, timeout_millis=10_000)
            if not msgs:
                raise RuntimeError(f"{sub}: stalled after {got} of {expected} messages")
            for m in msgs:
                value = m.value()
                if value is None:
                    state.pop(m.key(), None)  # type: ignore[arg-type]
                else:
                    state[m.key()] = value  # type: ignore[index]
            got += len(msgs)
            consumer.acknowledge_cumulative(msgs[-1])
        consumer.close()  # sends the last (grouped) acknowledgement
        seconds = time.perf_counter() - t0
        if got != expected:
            raise AssertionError(f"{sub}: received {got} messages, expected {expected}")
        backlog = client.admin.topics.stats(topic)["subscriptions"][sub]["msgBacklog"]
        if backlog:
            raise AssertionError(f"{sub}: {backlog} messages left unacknowledged on the server")
        client.admin.topics.delete_subscription(topic, sub)
        return seconds, state
