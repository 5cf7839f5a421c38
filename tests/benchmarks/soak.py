"""A soak of a real ``compactor serve``: do descriptors and memory stay flat? (issue 15)

Spark is started and warmed up first with one compaction of a scratch topic (as the serving
benchmark does), so that its start-up is not taken for growth. Then for ``seconds`` (default
240; quick 90) against one topic on small ledgers
(``entries_per_ledger``, so hundreds of ledgers are sealed and read):

- a producer sends batches of ``batch`` keyed messages (``keys`` keys, 100-byte values) at
  about ``rate`` messages/s;
- a consumer with ``read_compacted=false`` and one with ``read_compacted=true``, each on its
  own durable subscription, receive pages of 1,000 and acknowledge them cumulatively;
- a compaction is started every ``compact_every_s`` seconds (waited for).

Every second the server process's open descriptors and RSS are sampled (from ``/proc``; the
Spark JVM is a child process with its own, reported apart). The report gives them at start,
at the end of the warm-up (the first ``warm_up_share`` of the run: Spark starts, caches fill)
and at the end, and the largest value after the warm-up; "flat" means the end is within a
few descriptors and a few percent of RSS of the warm-up figure.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from tests.benchmarks.report import Table, f_int
from tests.server import ServerProcess


@dataclass(frozen=True)
class SoakParams:
    seconds: float = 240.0
    rate: int = 5000
    batch: int = 500
    keys: int = 10_000
    entries_per_ledger: int = 1000
    compact_every_s: float = 5.0
    # A third: sealed-ledger files stay open for a minute after their last read
    # (COMPACTOR_LEDGER_FILE_IDLE_MS), and the JVM's heap grows, before the steady state.
    warm_up_share: float = 1 / 3

    @classmethod
    def quick(cls) -> SoakParams:
        return cls(seconds=90.0)


@dataclass
class Sample:
    at: float  # seconds since the start
    fds: int
    rss: int
    jvm_rss: int


@dataclass
class SoakResult:
    params: SoakParams
    samples: list[Sample] = field(default_factory=list)
    produced: int = 0
    consumed_full: int = 0
    consumed_compacted: int = 0
    compactions: int = 0
    ledgers: int = 0
    refused: int = 0
    file_cache: dict[str, int] = field(default_factory=dict)

    def at(self, t: float) -> Sample:
        return min(self.samples, key=lambda s: abs(s.at - t))

    @property
    def warm(self) -> Sample:
        return self.at(self.params.seconds * self.params.warm_up_share)

    @property
    def after_warm_up(self) -> list[Sample]:
        return [s for s in self.samples if s.at >= self.warm.at]


class SoakServer(ServerProcess):
    defaults = {"COMPACTOR_FSYNC": "always"}


class SoakBench:
    def __init__(self, work_dir: Path, params: SoakParams, log: Callable[[str], None] = print) -> None:
        self.params = params
        self.log = log
        self.server = SoakServer(
            Path(work_dir) / "soak" / "data",
            env={"COMPACTOR_MAX_ENTRIES_PER_LEDGER": str(params.entries_per_ledger)},
        )

    def run(self) -> SoakResult:
        from api.client import Client

        p = self.params
        result = SoakResult(p)
        topic = "bench/soak/events"
        self.server.start()
        assert self.server.proc is not None
        proc = psutil.Process(self.server.proc.pid)
        stop = threading.Event()
        errors: list[BaseException] = []
        try:
            with Client(self.server.url, timeout=120.0) as admin:
                self._warm_up_spark(admin)
                admin.admin.topics.create(topic)
                full = admin.subscribe(topic, "full", initial_position="earliest")
                compacted = admin.subscribe(
                    topic, "compacted", read_compacted=True, initial_position="earliest"
                )
                threads = [
                    threading.Thread(target=self._guard, args=(f, stop, errors), daemon=True)
                    for f in (
                        lambda: self._produce(topic, stop, result),
                        lambda: self._consume(full, stop, result, "consumed_full"),
                        lambda: self._consume(compacted, stop, result, "consumed_compacted"),
                        lambda: self._compact(topic, stop, result),
                    )
                ]
                t0 = time.monotonic()
                for t in threads:
                    t.start()
                next_log = 30.0
                while (elapsed := time.monotonic() - t0) < p.seconds and not errors:
                    result.samples.append(_sample(proc, elapsed))
                    if elapsed >= next_log:
                        s = result.samples[-1]
                        self.log(
                            f"soak {elapsed:.0f} s: {result.produced:,} produced, {s.fds} descriptors, "
                            f"RSS {s.rss / 2**20:.0f} MiB, {result.compactions} compactions"
                        )
                        next_log += 30.0
                    time.sleep(1.0)
                result.samples.append(_sample(proc, time.monotonic() - t0))
                stop.set()
                for t in threads:
                    t.join(120)
                if errors:
                    raise errors[0]
                full.close()
                compacted.close()
                stats = admin.admin.topics.internal_stats(topic)
                result.ledgers = len(stats["ledgers"])
                import httpx

                res = httpx.get(f"{self.server.url}/admin/v2/broker-stats/resources", timeout=30).json()
                result.refused = res["sealBacklog"]["refusedProducers"]
                result.file_cache = res["ledgerFileCache"]
        finally:
            stop.set()
            self.server.stop()
        return result

    def _warm_up_spark(self, client) -> None:  # type: ignore[no-untyped-def]
        scratch = "bench/soak/warmup"
        client.admin.topics.create(scratch)
        client.create_producer(scratch).send_many([(f"k{i % 10}", b"v") for i in range(100)])
        client.admin.topics.compact(scratch)
        status = client.admin.topics.wait_for_compaction(scratch, timeout=600)
        if status.status != "SUCCESS":
            raise RuntimeError(f"warm-up compaction failed: {status}")
        client.admin.topics.delete(scratch)

    @staticmethod
    def _guard(f: Callable[[], None], stop: threading.Event, errors: list[BaseException]) -> None:
        try:
            f()
        except BaseException as e:  # reported by run()
            errors.append(e)
            stop.set()

    def _produce(self, topic: str, stop: threading.Event, result: SoakResult) -> None:
        from api.client import Client, OutgoingMessage

        p = self.params
        rng = np.random.default_rng(5)
        interval = p.batch / p.rate
        with Client(self.server.url, timeout=120.0) as client:
            producer = client.create_producer(topic)
            next_at = time.monotonic()
            while not stop.is_set():
                ks = rng.integers(0, p.keys, size=p.batch)
                data = rng.bytes(p.batch * 100)
                producer.send_many(
                    OutgoingMessage(data[i * 100 : (i + 1) * 100], f"key-{int(k)}") for i, k in enumerate(ks)
                )
                result.produced += p.batch
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    @staticmethod
    def _consume(consumer, stop: threading.Event, result: SoakResult, counter: str) -> None:  # type: ignore[no-untyped-def]
        while not stop.is_set():
            msgs = consumer.batch_receive(max_messages=1000, timeout_millis=500)
            if msgs:
                setattr(result, counter, getattr(result, counter) + len(msgs))
                consumer.acknowledge_cumulative(msgs[-1])

    def _compact(self, topic: str, stop: threading.Event, result: SoakResult) -> None:
        from api.client import Client

        with Client(self.server.url, timeout=120.0) as client:
            while not stop.wait(self.params.compact_every_s):
                client.admin.topics.compact(topic)
                status = client.admin.topics.wait_for_compaction(topic, timeout=600, poll_interval=0.2)
                if status.status != "SUCCESS":
                    raise RuntimeError(f"compaction failed: {status}")
                result.compactions += 1


def _sample(proc: psutil.Process, at: float) -> Sample:
    jvm = 0
    for kid in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            jvm += kid.memory_info().rss
    return Sample(at=at, fds=proc.num_fds(), rss=proc.memory_info().rss, jvm_rss=jvm)


def soak_table(r: SoakResult) -> Table:
    p = r.params
    start, warm, end = r.samples[0], r.warm, r.samples[-1]
    after = r.after_warm_up
    mib = 2**20
    t = Table(
        f"Soak: {p.seconds:.0f} s of produce, a full and a readCompacted consumer, a compaction every "
        f"{p.compact_every_s:g} s",
        ["figure", "start", f"after warm-up ({warm.at:.0f} s)", "end", "max after warm-up"],
    )
    t.add(
        "server open descriptors",
        f_int(start.fds),
        f_int(warm.fds),
        f_int(end.fds),
        f_int(max(s.fds for s in after)),
    )
    t.add(
        "server RSS (MiB)",
        f"{start.rss / mib:.0f}",
        f"{warm.rss / mib:.0f}",
        f"{end.rss / mib:.0f}",
        f"{max(s.rss for s in after) / mib:.0f}",
    )
    t.add(
        "Spark processes RSS (MiB)",
        f"{start.jvm_rss / mib:.0f}",
        f"{warm.jvm_rss / mib:.0f}",
        f"{end.jvm_rss / mib:.0f}",
        f"{max(s.jvm_rss for s in after) / mib:.0f}",
    )
    fc = r.file_cache
    t.notes = [
        f"{r.produced:,} messages produced ({p.rate:,}/s in batches of {p.batch}, {p.keys:,} keys, "
        f"100-byte values, fsync always) into {r.ledgers:,} ledgers of {p.entries_per_ledger:,} entries; "
        f"consumed {r.consumed_full:,} (full) and {r.consumed_compacted:,} (readCompacted); "
        f"{r.compactions} compactions; {r.refused} produce requests refused by the seal backlog",
        f"sealed-ledger file cache at the end: {fc.get('open', 0)} open of {fc.get('limit', 0)}, "
        f"{fc.get('hits', 0):,} hits, {fc.get('misses', 0):,} misses, {fc.get('evictions', 0):,} evictions",
        "descriptors and RSS of the `compactor serve` process, from /proc every second; the Spark JVM "
        "(a child process; Spark was started and warmed up by one compaction before the clock) apart",
    ]
    return t
