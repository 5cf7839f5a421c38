"""Compaction rounds through a real ``compactor serve`` (issue 17), against the same rounds in
process, so that what users get and what the benchmark measures cannot drift apart.

The server runs with the service's defaults (``local[*]`` Spark, warm-up at start, SQLite,
``COMPACTOR_FSYNC=always``) on its own data directory. For each of ``topics`` fresh topics, the
client produces ``messages`` messages over ``keys`` keys (``value_bytes`` random bytes, 5%
deletes) through the REST API in batches of 1,000, from 4 threads, then triggers a round with
``PUT .../compaction``, waits for ``SUCCESS`` and takes the round's own figures from
``GET .../compactionRuns`` (``durationMs``: the whole round, roll-over, input planning and the
metadata commit included; ``phaseOneMs``, ``phaseTwoMs``). On the last topic it then adds
``increment`` x ``messages`` new messages and compacts again, ``increments`` times.

In process, the same input files (the server's sealed ledgers, read in place) are compacted by
``TwoPhaseCompactor`` on this process's warm SparkSession, into a scratch directory, right after
each service round: the ratio of the two is the service's overhead.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np

from ledger.entry import Position
from ledger.storage import StoragePath
from tests.benchmarks.measure import median
from tests.server import ServerProcess

TENANT, NAMESPACE = "bench", "rounds"
BATCH = 1000
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class ServiceRoundParams:
    messages: int = 5_000_000
    keys: int = 500_000
    value_bytes: int = 100
    topics: int = 3
    increment: float = 0.01
    increments: int = 3
    threads: int = 4

    @classmethod
    def quick(cls) -> ServiceRoundParams:
        return cls(messages=1_000_000, keys=100_000, topics=2, increments=2)


@dataclass
class RoundFigures:
    """One round: the service's own figures, and the same round in process (seconds)."""

    duration_ms: int
    phase_one_ms: int
    phase_two_ms: int
    client_s: float  # trigger to SUCCESS, as the client saw it
    in_process_s: float = float("nan")
    layers: list[str] = field(default_factory=list)


@dataclass
class ServiceRoundsResult:
    params: ServiceRoundParams
    full: list[RoundFigures] = field(default_factory=list)
    incremental: list[RoundFigures] = field(default_factory=list)
    produce_msgs_per_s: float = 0.0

    @property
    def full_ms(self) -> float:
        return median([r.duration_ms for r in self.full])

    @property
    def incremental_ms(self) -> float:
        return median([r.duration_ms for r in self.incremental])

    @property
    def full_in_process_s(self) -> float:
        return median([r.in_process_s for r in self.full])

    @property
    def incremental_in_process_s(self) -> float:
        return median([r.in_process_s for r in self.incremental])


class BodyShape(Protocol):
    """What :class:`RandomBodies` draws from: keys and value sizes."""

    @property
    def keys(self) -> int: ...

    @property
    def value_bytes(self) -> int: ...


class RandomBodies:
    """Random keyed messages as JSON bodies of ``BATCH`` messages, prepared before the clock
    starts (``value_bytes`` random bytes each, 5% deletes, keys drawn from ``keys``)."""

    def __init__(self, params: BodyShape, seed: int) -> None:
        self.params = params
        self.rng = np.random.default_rng(seed)

    def bodies(self, n: int) -> list[bytes]:
        import orjson

        p = self.params
        out = []
        for start in range(0, n, BATCH):
            size = min(BATCH, n - start)
            keys = self.rng.integers(0, p.keys, size)
            deletes = self.rng.random(size) < 0.05
            raw = self.rng.bytes(size * p.value_bytes)
            messages = [
                {
                    "key": f"key-{k}",
                    "value": None
                    if d
                    else base64.b64encode(raw[i * p.value_bytes : (i + 1) * p.value_bytes]).decode(),
                }
                for i, (k, d) in enumerate(zip(keys.tolist(), deletes.tolist(), strict=True))
            ]
            out.append(orjson.dumps({"messages": messages}))
        return out


class ServiceRounds:
    def __init__(
        self,
        work_dir: Path,
        params: ServiceRoundParams,
        *,
        in_process: InProcessReplica | None,
        env: dict[str, str] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.params = params
        self.in_process = in_process
        self.env = env or {}
        self.log = log

    def run(self) -> ServiceRoundsResult:
        result = ServiceRoundsResult(self.params)
        server = ServerProcess(self.work_dir / "service-rounds" / "data", env=self.env)
        server.start(timeout=300)
        try:
            server.create_namespaces(f"{TENANT}/{NAMESPACE}")
            with httpx.Client(base_url=server.url, timeout=600) as http:
                wait_for_spark(http)
                rates = []
                for t in range(self.params.topics):
                    topic = f"persistent://{TENANT}/{NAMESPACE}/t{t}"
                    path = f"{TENANT}/{NAMESPACE}/t{t}"
                    http.put(f"/admin/v2/persistent/{path}").raise_for_status()
                    rates.append(self._produce(server, path, self.params.messages, seed=t))
                    figures = self._round(http, server, path)
                    result.full.append(figures)
                    self.log(
                        f"service rounds: {topic} full round {figures.duration_ms} ms "
                        f"(phase one {figures.phase_one_ms}, two {figures.phase_two_ms}), "
                        f"in process {figures.in_process_s:.2f} s"
                    )
                result.produce_msgs_per_s = median(rates)
                path = f"{TENANT}/{NAMESPACE}/t{self.params.topics - 1}"
                more = max(1, int(self.params.messages * self.params.increment))
                for i in range(self.params.increments):
                    self._produce(server, path, more, seed=1000 + i)
                    figures = self._round(http, server, path)
                    result.incremental.append(figures)
                    self.log(
                        f"service rounds: +{more:,} round {figures.duration_ms} ms {figures.layers}, "
                        f"in process {figures.in_process_s:.2f} s"
                    )
        finally:
            server.stop()
        return result

    def _produce(self, server: ServerProcess, path: str, n: int, *, seed: int) -> float:
        bodies = RandomBodies(self.params, seed).bodies(n)
        seconds, _ = post_bodies(server.url, path, bodies, threads=self.params.threads)
        self.log(f"service rounds: produced {n:,} to {path} in {seconds:.1f} s")
        return n / seconds

    def _round(self, http: httpx.Client, server: ServerProcess, path: str) -> RoundFigures:
        run, client_s = compact_and_wait(http, path)
        figures = RoundFigures(
            duration_ms=int(run["durationMs"]),
            phase_one_ms=int(run["phaseOneMs"]),
            phase_two_ms=int(run["phaseTwoMs"]),
            client_s=client_s,
        )
        ledger_id = int(run["compactedLedgerId"])
        topic_root = server.ledger_root() / f"ledgers/{path}"  # a directory, or a bucket's prefix
        manifest_dir = topic_root / f"compacted-{ledger_id:020d}"
        from ledger.compacted_store import Manifest

        figures.layers = [layer.kind for layer in Manifest.load(manifest_dir).layers]
        if self.in_process is not None:
            figures.in_process_s = self.in_process.round(topic_root, Position.parse(run["horizon"]))
        return figures


def wait_for_spark(http: httpx.Client) -> None:
    """Wait until the server's Spark is up (its warm-up at start-up done)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if http.get("/health").json().get("compaction") == "available":
            return
        time.sleep(0.2)
    raise RuntimeError("the server's Spark did not become available")


def post_bodies(url: str, path: str, bodies: list[bytes], *, threads: int) -> tuple[float, list[float]]:
    """Produce ``bodies`` (JSON produce requests) to topic ``path`` of the server at ``url`` from
    ``threads`` threads at once (each its own connection, taking every ``threads``-th body):
    the seconds from the first request to the last reply, and each request's seconds."""
    chunks = [bodies[i::threads] for i in range(threads)]
    errors: list[BaseException] = []
    latencies: list[list[float]] = [[] for _ in chunks]

    def send(mine: list[bytes], out: list[float]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=120) as c:
                for body in mine:
                    t0 = time.perf_counter()
                    c.post(f"/topics/persistent/{path}", content=body, headers=JSON).raise_for_status()
                    out.append(time.perf_counter() - t0)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=send, args=(c, out)) for c, out in zip(chunks, latencies, strict=True)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, [x for out in latencies for x in out]


def compact_and_wait(http: httpx.Client, path: str) -> tuple[dict[str, Any], float]:
    """Trigger a round of topic ``path`` and wait for it: the round's ``compactionRuns`` row
    (the service's own figures) and the seconds from the trigger to ``SUCCESS`` as the client
    saw them. ``RuntimeError`` if the round failed."""
    admin = f"/admin/v2/persistent/{path}"
    t0 = time.perf_counter()
    http.put(f"{admin}/compaction").raise_for_status()
    while True:
        st = http.get(f"{admin}/compaction").json()
        if st["status"] in ("SUCCESS", "ERROR"):
            break
        # Every 100 ms, as a user waits (Pulsar's admin CLI polls once a second): each poll
        # costs the server a request, and 20 ms polls took a share of the cores the round
        # runs on. The round's figures are the server's own (durationMs), not this loop's.
        time.sleep(0.1)
    client_s = time.perf_counter() - t0
    if st["status"] != "SUCCESS":
        raise RuntimeError(f"compaction of {path} failed: {st.get('lastError')}")
    run: dict[str, Any] = http.get(f"{admin}/compactionRuns", params={"limit": 1}).json()[0]
    return run, client_s


class InProcessReplica:
    """The service's rounds again, in this process, on the server's sealed ledgers (read in
    place): a topic's first round full, later ones on top of this replica's previous output
    (so they add deltas or consolidate exactly as the service's rounds do). Outputs go into
    the server's topic directory under ledger ids the server never allocates, and are removed
    as soon as the next round no longer needs them."""

    def __init__(self, spark: object, *, max_deltas: int = 8, consolidation_ratio: float = 0.5) -> None:
        from compactor import TwoPhaseCompactor

        self.compactor = TwoPhaseCompactor(spark)  # type: ignore[arg-type]
        self.max_deltas = max_deltas
        self.consolidation_ratio = consolidation_ratio
        self._previous: dict[StoragePath, object] = {}
        self._outputs: dict[StoragePath, list[StoragePath]] = {}
        self._next = 2_000_000_000

    def round(self, topic_root: StoragePath, horizon: Position) -> float:
        from compactor import CompactionJob, CompactionResult

        sealed = [(int(p.name.split(".")[0]), p) for p in topic_root.files() if p.name.endswith(".parquet")]
        ledgers = sorted((i, p) for i, p in sealed if i <= horizon.ledger_id)
        previous = self._previous.get(topic_root)
        assert previous is None or isinstance(previous, CompactionResult)
        self._next += 1
        job = CompactionJob(
            topic_root=topic_root,
            inputs=[p for _, p in ledgers],
            input_ledger_ids=[i for i, _ in ledgers],
            previous_compacted=previous.directory if previous else None,
            previous_horizon=previous.horizon if previous else None,
            horizon=horizon,
            output_ledger_id=self._next,
            max_deltas=self.max_deltas,
            consolidation_ratio=self.consolidation_ratio,
        )
        t0 = time.perf_counter()
        result = self.compactor.compact(job)
        seconds = time.perf_counter() - t0
        self._previous[topic_root] = result
        self._outputs.setdefault(topic_root, []).append(result.directory)
        # Directories no longer named by the latest manifest can go (the service does the same).
        keep = {f.split("/")[0] for f in result.manifest.files()} | {result.directory.name}
        for d in list(self._outputs[topic_root]):
            if d.name not in keep:
                d.delete_tree()
                self._outputs[topic_root].remove(d)
        return seconds

    def close(self) -> None:
        for dirs in self._outputs.values():
            for d in dirs:
                d.delete_tree()
