"""Compacted topics as Iceberg tables (issue 52), through a real ``compactor serve``.

One topic of ``messages`` keyed messages over ``keys`` keys (5% deletes, as the ``rounds``
section's) in a namespace whose compaction policy has ``table`` on, then:

- **the table commit's share of a round**: a full round, then ``increments`` rounds of 1% more
  messages. Each round's own figure is the service's (``durationMs`` of its ``compactionRuns``
  row); the table commit is timed here, in process, on the same compacted ledger the service
  just wrote (``ledger.iceberg_table.commit_round`` into a scratch table directory, on top of
  this replica's previous commit, as the service commits on top of its own): the share is the
  commit's time over the round's.
- **the latest state of every key**: all of the table's rows read by DuckDB (its iceberg
  extension; the metadata location from the service's REST catalog, as an engine's catalog
  gets it) against a readCompacted consumer of the official ``pulsar-client`` reading the
  same view over the wire.
- **a point lookup**: one key's row by SQL (DuckDB over the table), a fresh query each time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ledger.entry import Position
from ledger.storage import StoragePath
from tests.benchmarks.measure import median
from tests.benchmarks.report import Table
from tests.benchmarks.service_rounds import RandomBodies, compact_and_wait, post_bodies, wait_for_spark
from tests.server import ServerProcess

TENANT, NAMESPACE, TOPIC = "bench", "tables", "state"
PATH = f"{TENANT}/{NAMESPACE}/{TOPIC}"


@dataclass(frozen=True)
class TableParams:
    messages: int = 5_000_000
    keys: int = 500_000
    value_bytes: int = 100
    increment: float = 0.01
    increments: int = 3
    threads: int = 4
    runs: int = 3  # reads and lookups: the median of this many

    @classmethod
    def quick(cls) -> TableParams:
        return cls(messages=500_000, keys=50_000, increments=2, runs=2)


@dataclass
class TableResult:
    params: TableParams
    full_round_ms: int = 0
    full_commit_ms: float = 0.0
    delta_round_ms: list[int] = field(default_factory=list)
    delta_commit_ms: list[float] = field(default_factory=list)
    rows: int = 0
    duckdb_read_s: list[float] = field(default_factory=list)
    wire_read_s: list[float] = field(default_factory=list)
    lookup_ms: list[float] = field(default_factory=list)


class TableBench:
    def __init__(self, work_dir: Path, params: TableParams, log: Callable[[str], None] = print) -> None:
        self.work_dir = Path(work_dir)
        self.params = params
        self.log = log

    def run(self) -> TableResult:
        result = TableResult(self.params)
        server = ServerProcess(self.work_dir / "tables" / "data")
        server.start(timeout=300)
        try:
            server.create_namespaces(f"{TENANT}/{NAMESPACE}")
            with httpx.Client(base_url=server.url, timeout=600) as http:
                http.post(
                    f"/admin/v2/namespaces/{TENANT}/{NAMESPACE}/compactionPolicy", json={"table": True}
                ).raise_for_status()
                http.put(f"/admin/v2/persistent/{PATH}").raise_for_status()
                wait_for_spark(http)
                replica = _CommitReplica(self.work_dir / "tables" / "replica")
                self._produce(server, self.params.messages, seed=1)
                result.full_round_ms, result.full_commit_ms = self._round(http, server, replica)
                self.log(
                    f"tables: full round {result.full_round_ms} ms, commit {result.full_commit_ms:.0f} ms"
                )
                more = max(1, int(self.params.messages * self.params.increment))
                for i in range(self.params.increments):
                    self._produce(server, more, seed=100 + i)
                    round_ms, commit_ms = self._round(http, server, replica)
                    result.delta_round_ms.append(round_ms)
                    result.delta_commit_ms.append(commit_ms)
                    self.log(f"tables: +{more:,} round {round_ms} ms, commit {commit_ms:.0f} ms")
                location = self._metadata_location(http)
                self._reads(server, location, result)
        finally:
            server.stop()
        return result

    def _produce(self, server: ServerProcess, n: int, *, seed: int) -> None:
        bodies = RandomBodies(self.params, seed).bodies(n)
        seconds, _ = post_bodies(server.url, PATH, bodies, threads=self.params.threads)
        self.log(f"tables: produced {n:,} in {seconds:.1f} s")

    def _round(self, http: httpx.Client, server: ServerProcess, replica: _CommitReplica) -> tuple[int, float]:
        run, _ = compact_and_wait(http, PATH)
        ledger_id = int(run["compactedLedgerId"])
        ledger_dir = server.ledger_root() / f"ledgers/{PATH}/compacted-{ledger_id:020d}"
        commit_ms = replica.commit(ledger_dir, ledger_id, Position.parse(run["horizon"]), int(run["id"]))
        return int(run["durationMs"]), commit_ms

    def _metadata_location(self, http: httpx.Client) -> str:
        """The table's current metadata file, as an engine's catalog client loads it."""
        deadline = time.monotonic() + 60
        while True:
            r = http.get(f"/iceberg/v1/namespaces/{TENANT}%1F{NAMESPACE}/tables/{TOPIC}")
            if r.status_code == 200:
                return str(r.json()["metadata-location"])
            if time.monotonic() > deadline:
                raise RuntimeError(f"the table did not load: {r.status_code} {r.text}")
            time.sleep(0.5)

    def _reads(self, server: ServerProcess, location: str, result: TableResult) -> None:
        import pulsar

        from tests.iceberg_readers import duckdb_connection

        topic = f"persistent://{PATH}"
        for _ in range(self.params.runs):
            con = duckdb_connection()
            t0 = time.perf_counter()
            table = con.sql(f"SELECT * FROM iceberg_scan('{location}')").fetch_arrow_table()
            result.duckdb_read_s.append(time.perf_counter() - t0)
            result.rows = table.num_rows
            con.close()
            self.log(f"tables: DuckDB read {table.num_rows:,} rows in {result.duckdb_read_s[-1]:.2f} s")
        client = pulsar.Client(server.pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            for i in range(self.params.runs):
                t0 = time.perf_counter()
                consumer = client.subscribe(
                    topic,
                    f"state-{i}",
                    initial_position=pulsar.InitialPosition.Earliest,
                    is_read_compacted=True,
                )
                for _ in range(result.rows):
                    consumer.acknowledge(consumer.receive(30_000))
                result.wire_read_s.append(time.perf_counter() - t0)
                consumer.close()
                self.log(
                    f"tables: readCompacted consumer read {result.rows:,} in {result.wire_read_s[-1]:.2f} s"
                )
        finally:
            client.close()
        for i in range(self.params.runs * 3):
            key = f"key-{(i * 7919) % self.params.keys}"
            con = duckdb_connection()
            t0 = time.perf_counter()
            con.execute(f"SELECT value FROM iceberg_scan('{location}') WHERE key = ?", [key]).fetchall()
            result.lookup_ms.append((time.perf_counter() - t0) * 1000)
            con.close()


class _CommitReplica:
    """The service's table commits again, in this process, into a scratch table directory: each
    on top of the previous one, as the service's are."""

    def __init__(self, directory: Path) -> None:
        from ledger.storage import open_storage

        directory.mkdir(parents=True, exist_ok=True)
        self.table_dir: StoragePath = open_storage(str(directory)).at("table")
        self.current: str | None = None

    def commit(self, ledger_dir: StoragePath, ledger_id: int, horizon: Position, round_id: int) -> float:
        from ledger.iceberg_table import RoundState, commit_round

        state = RoundState(
            partition=-1, ledger_dir=ledger_dir, ledger_id=ledger_id, horizon=horizon, round=round_id
        )
        t0 = time.perf_counter()
        committed = commit_round(
            self.table_dir,
            self.current,
            state,
            now_ms=int(time.time() * 1000),
            snapshots_kept=10,
            max_age_ms=5 * 24 * 3600 * 1000,
        )
        elapsed = (time.perf_counter() - t0) * 1000
        self.current = committed.metadata_location
        return elapsed


def tables_table(r: TableResult) -> Table:
    p = r.params
    t = Table(
        f"Compacted topics as Iceberg tables: {p.messages:,} messages / {p.keys:,} keys",
        ["what", "figure"],
    )
    t.add("full round (the service's durationMs)", f"{r.full_round_ms:,} ms")
    t.add("its table commit", f"{r.full_commit_ms:,.0f} ms ({100 * r.full_commit_ms / r.full_round_ms:.1f}%)")
    if r.delta_round_ms:
        rm, cm = median([float(x) for x in r.delta_round_ms]), median(r.delta_commit_ms)
        t.add(f"+{p.increment:.0%} round (median of {len(r.delta_round_ms)})", f"{rm:,.0f} ms")
        t.add("its table commit", f"{cm:,.0f} ms ({100 * cm / rm:.1f}%)")
    duck, wire = median(r.duckdb_read_s), median(r.wire_read_s)
    t.add(f"latest state ({r.rows:,} rows): DuckDB over the table", f"{duck:.2f} s")
    t.add(
        "the same: a readCompacted consumer over the wire (pulsar-client)",
        f"{wire:.2f} s ({wire / duck:.1f}x)",
    )
    t.add(f"one key by SQL (DuckDB, median of {len(r.lookup_ms)})", f"{median(r.lookup_ms):,.0f} ms")
    t.notes.append(
        "Commit: ledger.iceberg_table.commit_round timed in process on the compacted ledger the "
        "service wrote (each on top of the previous commit, as the service's); the round's figure "
        "is the service's own. The consumer: the official pulsar-client, receive and acknowledge."
    )
    t.notes.append(
        "Targets (issue 52): the commit at most 5% of a round; DuckDB at least 10x faster than the consumer."
    )
    return t
