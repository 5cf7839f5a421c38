"""Ledgers on object storage against local disk (issue 31), through real servers.

Servers of the same settings but for where their ledgers are run at once: ``compactor serve``
on its data dir, and one on a fresh prefix of the S3-compatible bucket that ``.ci/s3`` started
(its settings in ``COMPACTOR_TEST_S3_SETTINGS``; loopback, so the figures are the cost of the
object store's protocol and of the service's reads, not of a network). Every step runs on each
server in turn, alternating which goes first, so that other load falls on all alike:

- **produce**: ``topics`` topics of ``messages`` messages over ``keys`` keys (100-byte values,
  5% deletes) through the REST API from ``threads`` (8) threads in batches of 1,000: messages/s
  of those full topics, and the p99 of one request's acknowledgement, the +1% steps' too
  (``COMPACTOR_FSYNC=always``);
- **full round** of each topic, then **+1% rounds** (``increments`` of them) on the last one:
  the service's own ``durationMs`` (roll-over, sealing's wait, planning, both phases, commit);
  the first +1% round of every server after the same pause, so that each starts on fresh
  Python workers (``IDLE_WORKERS_RETIRED_S``);
- **consume** the last topic from its earliest message, ``runs`` times each, readCompacted and
  the full log, through ``api.client`` (``batch_receive`` of 1,000, cumulative acknowledgement):
  messages/s. The first readCompacted consume after the last round (nothing of the compacted
  ledger read yet, so nothing cached) is reported apart from the median. Where radosgw's admin
  socket is at hand, the requests the S3 server answered during each consume, per 1,000
  messages (its own counters: everything it served meanwhile).

Which servers run is :data:`BACKENDS`, a list of :class:`Backend`: where the ledgers are and
which write-ahead mode the server runs with. The first is the reference every ratio is taken
against. A second write-ahead mode (``COMPACTOR_WAL=object``, issue 31) is one more entry,
``Backend("S3, WAL in objects", "s3", wal="object")``: every row, produce's included, gets a
column for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ledger.storage import S3Settings, open_storage
from tests.benchmarks.measure import median, percentile
from tests.benchmarks.report import Table, f_int, f_x
from tests.benchmarks.service_rounds import RandomBodies, compact_and_wait, post_bodies
from tests.server import S3_ENV, ServerProcess, s3_server_env, s3_settings

TENANT, NAMESPACE = "bench", "storage"
PAGE = 1000


@dataclass(frozen=True)
class Backend:
    """One server the section measures: ``storage`` is ``"local"`` (its data dir) or ``"s3"``
    (a fresh prefix of the test bucket); ``wal`` is its ``COMPACTOR_WAL`` (None: the service's
    default, the local write-ahead file)."""

    label: str
    storage: str
    wal: str | None = None

    def env(self, run: str) -> dict[str, str]:
        """The server's settings of where its ledgers are (and its write-ahead mode)."""
        env: dict[str, str] = {}
        if self.storage == "s3":
            if s3_settings() is None:
                raise RuntimeError(f"the storage benchmark needs {S3_ENV} (the settings .ci/s3 prints)")
            env = s3_server_env(f"bench-{run}-{self.slug}")
        elif self.storage != "local":
            raise ValueError(f"unknown storage {self.storage!r}")
        if self.wal is not None:
            env["COMPACTOR_WAL"] = self.wal
        return env

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.label.lower())


BACKENDS: tuple[Backend, ...] = (
    Backend("local disk", "local"),
    Backend("S3", "s3"),
    Backend("S3, WAL in objects", "s3", wal="object"),
)


# Seconds after which Spark has retired a server's idle Python workers (PythonWorkerFactory
# retires them after a minute without a task; its monitor looks every few seconds).
IDLE_WORKERS_RETIRED_S = 75


@dataclass(frozen=True)
class StorageParams:
    messages: int = 5_000_000
    keys: int = 500_000
    value_bytes: int = 100
    topics: int = 2
    increment: float = 0.01
    increments: int = 3
    # Producers at once: with COMPACTOR_WAL=object each request waits for the next flush (up to
    # 100 ms), so throughput comes from concurrency, as it does from a Pulsar client's pipeline.
    threads: int = 8
    runs: int = 3

    @classmethod
    def quick(cls, runs: int = 2) -> StorageParams:
        return cls(messages=500_000, keys=50_000, topics=2, increments=2, runs=runs)


@dataclass
class BackendFigures:
    """What one server measured (seconds, messages/s, request counts)."""

    produce_rates: list[float] = field(default_factory=list)
    produce_latencies_s: list[float] = field(default_factory=list)
    full_ms: list[int] = field(default_factory=list)
    incremental_ms: list[int] = field(default_factory=list)
    compacted_first: float = float("nan")  # msg/s of the first readCompacted consume
    compacted: list[float] = field(default_factory=list)  # msg/s, later consumes
    full_log: list[float] = field(default_factory=list)  # msg/s
    compacted_first_requests: float = float("nan")  # S3 requests per 1,000 messages, first consume
    compacted_requests: list[float] = field(default_factory=list)  # the same, later consumes
    full_log_requests: list[float] = field(default_factory=list)
    compacted_messages: int = 0  # live records of the consumed topic's compacted ledger
    full_messages: int = 0  # messages in its log


@dataclass
class StorageResult:
    params: StorageParams
    backends: Sequence[Backend]
    figures: dict[str, BackendFigures] = field(default_factory=dict)
    counted: bool = False  # whether radosgw's request counters were read


def rgw_requests() -> int | None:
    """Requests ``.ci/s3``'s radosgw has answered since it started (its admin socket's
    counters), or None when they cannot be read here."""
    socket = Path(os.environ.get("COMPACTOR_S3_DIR", "/tmp/compactor-s3")) / "cluster/run/client.rgw.asok"
    ceph = shutil.which("ceph")
    if ceph is None or not socket.exists():
        return None
    try:
        done = subprocess.run(
            [ceph, "--admin-daemon", str(socket), "perf", "dump", "rgw"],
            capture_output=True,
            timeout=10,
            check=True,
        )
        return int(json.loads(done.stdout)["rgw"]["req"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


class _Server:
    """One backend's server and what it measured."""

    def __init__(self, backend: Backend, work_dir: Path, run: str) -> None:
        self.backend = backend
        env = backend.env(run)
        data_dir = work_dir / backend.slug / "data"
        # Spelled out for the local disk too: COMPACTOR_TEST_STORAGE=s3 must not move it.
        env.setdefault("COMPACTOR_STORAGE_URL", str(data_dir))
        self.server = ServerProcess(data_dir, env=env)
        self.figures = BackendFigures()

    def drop_objects(self) -> None:
        """Remove everything the server left in the bucket (its prefix)."""
        env = self.server.extra_env
        if self.backend.storage != "s3":
            return
        s3 = S3Settings(
            endpoint_url=env.get("COMPACTOR_S3_ENDPOINT_URL"), region=env.get("COMPACTOR_S3_REGION")
        )
        with contextlib.suppress(Exception):  # best effort: the bucket is the tests' scratch space
            open_storage(env["COMPACTOR_STORAGE_URL"], s3).delete_prefix("")


class StorageBench:
    """Runs the section: every backend's server at once, every step on each in turn."""

    def __init__(
        self,
        work_dir: Path,
        params: StorageParams,
        *,
        backends: Sequence[Backend] = BACKENDS,
        log: Callable[[str], None] = print,
    ) -> None:
        self.work_dir = Path(work_dir) / "storage"
        self.params = params
        self.backends = list(backends)
        self.log = log

    def run(self) -> StorageResult:
        from tests.server import export_s3_client_env

        export_s3_client_env()
        result = StorageResult(self.params, self.backends)
        run = uuid.uuid4().hex[:8]
        servers = [_Server(b, self.work_dir, run) for b in self.backends]
        try:
            for s in servers:
                s.server.start(timeout=300)
                s.server.create_namespaces(f"{TENANT}/{NAMESPACE}")
            for s in servers:
                self._wait_until_warm(s)
            self._measure(servers, result)
        finally:
            for s in servers:
                s.server.stop()
                s.drop_objects()
        for s in servers:
            result.figures[s.backend.label] = s.figures
        return result

    # ------------------------------------------------------------------ steps

    def _measure(self, servers: list[_Server], result: StorageResult) -> None:
        p = self.params
        last = f"{TENANT}/{NAMESPACE}/t{p.topics - 1}"
        for t in range(p.topics):
            path = f"{TENANT}/{NAMESPACE}/t{t}"
            bodies = RandomBodies(p, seed=t).bodies(p.messages)
            for s in self._turns(servers, t):
                self._produce(s, path, bodies, p.messages)
                self._round(s, path, s.figures.full_ms, "full")
        more = max(1, int(p.messages * p.increment))
        # Every server's first +1% round in the same state: each has been idle for longer than
        # Spark keeps idle Python workers (a minute), so each starts on fresh workers, as a
        # service's round does after a quiet minute. (Without the pause the server whose full
        # round came last would start warm and the others cold.)
        time.sleep(IDLE_WORKERS_RETIRED_S)
        for i in range(p.increments):
            bodies = RandomBodies(p, seed=1000 + i).bodies(more)
            for s in self._turns(servers, i):
                # Throughput is the full topics' (1% of a topic is a few requests per thread:
                # its rate is the latency of one flush); its acknowledgements count for the p99.
                self._produce(s, last, bodies, more, rate=False)
                self._round(s, last, s.figures.incremental_ms, f"+{more:,}")
        for s in servers:
            # Each its own: 4 threads interleave the same batches differently on each server, so
            # the latest record of a key (and whether it is a delete) may differ between them.
            stats = self._internal_stats(s, last)
            compacted = stats["compactedLedger"]
            assert isinstance(compacted, dict)
            s.figures.compacted_messages = int(compacted["entries"])
            s.figures.full_messages = int(str(stats["numberOfEntries"]))
        result.counted = rgw_requests() is not None
        for i in range(p.runs + 1):
            for s in self._turns(servers, i):
                self._consume(s, last, i, read_compacted=True)
        for i in range(p.runs):
            for s in self._turns(servers, i):
                self._consume(s, last, i, read_compacted=False)

    @staticmethod
    def _turns(servers: list[_Server], i: int) -> list[_Server]:
        """The servers in the order of turn ``i``: forwards, then backwards, and so on."""
        return servers if i % 2 == 0 else servers[::-1]

    def _wait_until_warm(self, s: _Server) -> None:
        """Spark available and the start-up warm-up over: its jobs would share the cores."""
        deadline = time.monotonic() + 600
        with httpx.Client(base_url=s.server.url, timeout=10) as http:
            while True:
                health = http.get("/health").json()
                if health.get("compaction") == "available" and not health.get("warmingUp"):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{s.backend.label}: the server did not warm up in 600 s")
                time.sleep(0.2)

    def _produce(
        self, s: _Server, path: str, bodies: list[bytes], messages: int, *, rate: bool = True
    ) -> None:
        with httpx.Client(base_url=s.server.url, timeout=60) as http:
            if http.put(f"/admin/v2/persistent/{path}").status_code not in (204, 409):
                raise RuntimeError(f"{s.backend.label}: cannot create {path}")
        seconds, latencies = post_bodies(s.server.url, path, bodies, threads=self.params.threads)
        if rate:
            s.figures.produce_rates.append(messages / seconds)
        s.figures.produce_latencies_s.extend(latencies)
        self.log(
            f"storage ({s.backend.label}): produced {messages:,} to {path} at {messages / seconds:,.0f}/s"
        )

    def _round(self, s: _Server, path: str, into: list[int], what: str) -> None:
        with httpx.Client(base_url=s.server.url, timeout=1800) as http:
            run, _ = compact_and_wait(http, path)
        into.append(int(run["durationMs"]))
        self.log(
            f"storage ({s.backend.label}): {what} round of {path} {run['durationMs']} ms "
            f"(phase one {run['phaseOneMs']}, two {run['phaseTwoMs']})"
        )

    def _internal_stats(self, s: _Server, path: str) -> dict[str, object]:
        with httpx.Client(base_url=s.server.url, timeout=60) as http:
            found: dict[str, object] = http.get(f"/admin/v2/persistent/{path}/internalStats").json()
            return found

    def _consume(self, s: _Server, path: str, i: int, *, read_compacted: bool) -> None:
        from api.client import Client

        expected = s.figures.compacted_messages if read_compacted else s.figures.full_messages
        what = "compacted" if read_compacted else "full"
        before = rgw_requests()
        with Client(s.server.url, timeout=120.0) as client:
            seconds = consume(client, f"persistent://{path}", f"{what}-{i}", read_compacted, expected)
        after = rgw_requests()
        rate = expected / seconds
        f = s.figures
        if read_compacted and i == 0:
            f.compacted_first = rate
        elif read_compacted:
            f.compacted.append(rate)
        else:
            f.full_log.append(rate)
        requests = ""
        if s.backend.storage == "s3" and before is not None and after is not None:
            per_k = (after - before) / expected * 1000
            requests = f", {after - before} S3 requests"
            if read_compacted and i == 0:
                f.compacted_first_requests = per_k
            else:
                (f.compacted_requests if read_compacted else f.full_log_requests).append(per_k)
        self.log(f"storage ({s.backend.label}): {what} consume {i} {rate:,.0f} msg/s{requests}")


def consume(client: object, topic: str, sub: str, read_compacted: bool, expected: int) -> float:
    """Subscribe from the earliest message, receive ``expected`` messages in pages of
    :data:`PAGE` (each acknowledged cumulatively), close: the seconds it took."""
    from api.client import Client

    assert isinstance(client, Client)
    got = 0
    t0 = time.perf_counter()
    consumer = client.subscribe(topic, sub, read_compacted=read_compacted, initial_position="earliest")
    while got < expected:
        msgs = consumer.batch_receive(max_messages=PAGE, timeout_millis=10_000)
        if not msgs:
            raise RuntimeError(f"{sub}: stalled after {got} of {expected} messages")
        got += len(msgs)
        consumer.acknowledge_cumulative(msgs[-1])
    consumer.close()
    seconds = time.perf_counter() - t0
    if got != expected:
        raise AssertionError(f"{sub}: received {got} messages, expected {expected}")
    client.admin.topics.delete_subscription(topic, sub)
    return seconds


# --------------------------------------------------------------------------- the table


def storage_table(r: StorageResult) -> Table:
    """Every backend's figures side by side, with each one's cost against the first."""
    p = r.params
    ref, *others = r.backends
    columns = ["measure", *(b.label for b in r.backends)]
    columns += [f"{b.label} / {ref.label}" for b in others] + ["target"]
    t = Table(
        f"Ledgers on object storage against local disk: {p.messages / 1e6:g}M/{p.keys / 1e3:g}k "
        f"x {p.topics} topics, +{100 * p.increment:g}% x {p.increments}",
        columns,
    )

    def row(
        what: str,
        get: Callable[[BackendFigures], float],
        fmt: Callable[[float], str],
        *,
        rate: bool,
        target: str = "",
    ) -> None:
        values = [get(r.figures[b.label]) for b in r.backends]
        # A ratio above 1 is always "costs more than the reference": time over time, or the
        # reference's rate over this one's.
        ratios = [
            (values[0] / v if rate else v / values[0]) if values[0] and v else float("nan")
            for v in values[1:]
        ]
        t.add(what, *(fmt(v) for v in values), *(f_x(x) for x in ratios), target)

    def med(values: list[float]) -> float:
        return median(values) if values else float("nan")

    row(
        f"produce, {p.threads} threads, batches of 1,000 (msg/s)",
        lambda f: med(f.produce_rates),
        f_int,
        rate=True,
        target=">= 50,000 msg/s, WAL in objects",
    )
    row(
        "produce: p99 acknowledgement of a batch (ms)",
        lambda f: percentile(f.produce_latencies_s, 99) * 1000 if f.produce_latencies_s else float("nan"),
        lambda v: f"{v:.1f}",
        rate=False,
    )
    row(
        "full round (ms, durationMs)",
        lambda f: med([float(x) for x in f.full_ms]),
        f_int,
        rate=False,
        target="<= 1.5x",
    )
    row(
        f"+{100 * p.increment:g}% round (ms, durationMs)",
        lambda f: med([float(x) for x in f.incremental_ms]),
        f_int,
        rate=False,
        target="<= 2x",
    )
    row(
        "readCompacted consume, first after the round (msg/s)",
        lambda f: f.compacted_first,
        f_int,
        rate=True,
        target="<= 2x",
    )
    row(
        "readCompacted consume, later runs (msg/s)",
        lambda f: med(f.compacted),
        f_int,
        rate=True,
        target="<= 2x",
    )
    row("full-log consume (msg/s)", lambda f: med(f.full_log), f_int, rate=True)
    if r.counted:
        for what, get in (
            ("S3 requests per 1,000 messages, readCompacted, first", lambda f: f.compacted_first_requests),
            ("S3 requests per 1,000 messages, readCompacted, later", lambda f: med(f.compacted_requests)),
            ("S3 requests per 1,000 messages, full log", lambda f: med(f.full_log_requests)),
        ):
            values = [get(r.figures[b.label]) for b in r.backends]
            t.add(what, *("-" if v != v else f"{v:.2f}" for v in values), *("" for _ in others), "")
    t.notes.append(
        f"one server per column, all running at once, each step on each in turn (alternating which "
        f"goes first); full rounds: medians of {p.topics} topics, +1% rounds of {p.increments}; consumes "
        f"of the last topic ({f_int(r.figures[ref.label].compacted_messages)} live records compacted, "
        f"{f_int(r.figures[ref.label].full_messages)} in the log), medians of {p.runs} runs after the first; "
        "S3 is Ceph's radosgw on loopback (`.ci/s3`)"
    )
    return t


if __name__ == "__main__":
    import sys
    import tempfile

    from tests.benchmarks.runner import log

    quick = "--quick" in sys.argv
    params = StorageParams.quick() if quick else StorageParams()
    with tempfile.TemporaryDirectory(prefix="storage-bench-") as d:
        print(storage_table(StorageBench(Path(d), params, log=log).run()).text())
