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

With ``authentication=True`` the server has token authentication and authorization on and the
client sends a token whose role is an admin of the benchmark's tenant (not a superuser): every
request checks the token and the role's rights. ``compare_authentication`` runs both servers
at once, a run of each in turn, so that other load on the machine falls on both alike.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.tokens import create_token
from tests.benchmarks.measure import median, percentile
from tests.server import ServerProcess as _ServerProcess

if TYPE_CHECKING:  # imported when used: the compaction benchmarks do not need the client
    from api.client import AuthenticationToken, Client, OutgoingMessage

TENANT, NAMESPACE = "bench", "serving"
SUPERUSER, ROLE = "bench-superuser", "bench-admin"
_SECRET = b"serving-benchmark-secret-key-32b"

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
    # readCompacted over a base of layered_keys x layered_versions messages and this many deltas
    # (1% more messages each), against the same messages compacted into one base; 0: not measured.
    layered_deltas: int = 5
    layered_keys: int = 100_000
    layered_versions: int = 4
    # Seconds between scrapes of ``GET /metrics`` by a background thread while everything is
    # measured (a Prometheus server scraping the service); None: no scraper.
    scrape_interval_s: float | None = None

    @classmethod
    def quick(cls, runs: int = 2) -> ServingParams:
        return cls(batches=50, latency_requests=500, state_keys=5000, layered_keys=5000, runs=runs)


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
    consume_layered: list[float] = field(default_factory=list)  # msg/s, base + deltas
    consume_one_base: list[float] = field(default_factory=list)  # msg/s, the same in one base
    layers: list[str] = field(default_factory=list)  # of the layered topic's compacted ledger
    compacted_messages: int = 0
    full_messages: int = 0
    compaction_s: float = 0.0
    client: str = "api.client"
    authentication: bool = False
    # The server process's CPU time (user + system) per message: what authentication adds is
    # work in the server, and CPU time is far less disturbed than wall time by other load.
    produce_cpu_us: list[float] = field(default_factory=list)
    consume_full_cpu_us: list[float] = field(default_factory=list)
    consume_compacted_cpu_us: list[float] = field(default_factory=list)
    scrapes: list[float] = field(default_factory=list)  # seconds of each /metrics scrape
    # The server's CPU seconds per scrape, from back-to-back scrapes after the measurements.
    scrape_cpu_s: float | None = None

    @property
    def p50_ms(self) -> float:
        return median([percentile(r, 50) for r in self.latencies_ms])

    @property
    def p99_ms(self) -> float:
        return median([percentile(r, 99) for r in self.latencies_ms])

    @property
    def load_speedup(self) -> float:
        return median(self.load_full_s) / median(self.load_compacted_s)


class Scraper:
    """Scrapes ``GET /metrics`` every ``interval_s`` on its own thread, as Prometheus would."""

    def __init__(self, url: str, interval_s: float, seconds: list[float]) -> None:
        self.url = url
        self.interval_s = interval_s
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._stop.wait(self.interval_s):
                t0 = time.perf_counter()
                http.get("/metrics").raise_for_status()
                self.seconds.append(time.perf_counter() - t0)


def scrape_cpu_seconds(url: str, scrapes: int = 50) -> float:
    """The server's CPU seconds per ``/metrics`` scrape: its ``process_cpu_seconds_total``
    across ``scrapes`` scrapes in a row (nothing else running), divided by their number."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    def cpu(http: httpx.Client) -> float:
        for family in text_string_to_metric_families(http.get("/metrics").text):
            if family.name == "process_cpu_seconds":
                return float(family.samples[0].value)
        raise RuntimeError("no process_cpu_seconds_total in /metrics")

    with httpx.Client(base_url=url, timeout=30) as http:
        before = cpu(http)
        for _ in range(scrapes - 1):
            http.get("/metrics").raise_for_status()
        return (cpu(http) - before) / scrapes


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

    def __init__(
        self,
        work_dir: Path,
        params: ServingParams,
        log: Callable[[str], None] = print,
        *,
        authentication: bool = False,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.params = params
        self.log = log
        self.authentication = authentication
        env: dict[str, str] = {}
        if authentication:
            env = {
                "COMPACTOR_AUTHENTICATION_ENABLED": "true",
                "COMPACTOR_AUTHORIZATION_ENABLED": "true",
                "COMPACTOR_SUPERUSER_ROLES": SUPERUSER,
                "COMPACTOR_TOKEN_SECRET_KEY": "data:;base64," + base64.b64encode(_SECRET).decode(),
            }
        name = "serving-auth" if authentication else "serving"
        self.server = ServerProcess(self.work_dir / name / "data", env=env)
        self._topics = 0
        self.label = "auth on" if authentication else "auth off"

    def _topic(self, what: str) -> str:
        self._topics += 1
        return f"{TENANT}/{NAMESPACE}/{what}-{self._topics}"

    def _auth(self, role: str) -> AuthenticationToken | None:
        from api.client import AuthenticationToken

        if not self.authentication:
            return None
        return AuthenticationToken(create_token(subject=role, secret_key=_SECRET))

    def client(self, role: str = ROLE) -> Client:
        from api.client import Client

        return Client(self.server.url, timeout=120.0, authentication=self._auth(role))

    def run(self) -> ServingResult:
        result = ServingResult(self.params, authentication=self.authentication)
        self.server.start()
        try:
            with self.client() as client, contextlib.ExitStack() as scraping:
                self.open(client)
                if self.params.scrape_interval_s is not None:
                    scraping.enter_context(
                        Scraper(self.server.url, self.params.scrape_interval_s, result.scrapes)
                    )
                for i in range(self.params.runs):
                    self.serve_once(client, result, i)
                topic = self.prepare_state(client, result)
                for i in range(self.params.runs):
                    self.load_once(client, topic, result, i)
                if self.params.layered_deltas:
                    layered, one_base = self.prepare_layered(client, result)
                    for i in range(self.params.runs):
                        self.load_layered_once(client, layered, one_base, result, i)
            if self.params.scrape_interval_s is not None:
                result.scrape_cpu_s = scrape_cpu_seconds(self.server.url)
        finally:
            self.server.stop()
        return result

    def open(self, client: Client) -> None:
        """The benchmark's tenant and namespace (its role their admin), and a warm server."""
        from api.client import Conflict

        with self.client(SUPERUSER) as admin:
            with contextlib.suppress(Conflict):
                admin.admin.tenants.create(TENANT, admin_roles=[ROLE])
            with contextlib.suppress(Conflict):
                admin.admin.namespaces.create(f"{TENANT}/{NAMESPACE}")
        self._warm_up(client)

    def server_cpu_s(self) -> float:
        import psutil

        assert self.server.proc is not None
        t = psutil.Process(self.server.proc.pid).cpu_times()
        return t.user + t.system

    def serve_once(self, client: Client, result: ServingResult, i: int) -> None:
        cpu = self.server_cpu_s()
        result.produce_one.append(self._produce(client, threads=1))
        messages = self.params.batches * BATCH
        result.produce_cpu_us.append((self.server_cpu_s() - cpu) / messages * 1e6)
        result.produce_threads.append(self._produce(client, threads=self.params.threads))
        result.latencies_ms.append(self._latency(client))
        self.log(
            f"serving run {i + 1} ({self.label}): produce {result.produce_one[-1]:,.0f}/s (1 client), "
            f"{result.produce_threads[-1]:,.0f}/s ({self.params.threads} threads), "
            f"p50 {percentile(result.latencies_ms[-1], 50):.2f} ms"
        )

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
        # And the server's own start-up warm-up has ended: its jobs would share the cores with
        # what is timed.
        deadline = time.monotonic() + 600
        import httpx

        while httpx.get(f"{self.server.url}/health", timeout=10).json().get("warmingUp"):
            if time.monotonic() > deadline:
                raise RuntimeError("the server's warm-up did not end in 600 s")
            time.sleep(0.2)

    def _produce(self, client: Client, *, threads: int) -> float:
        p = self.params
        topic = self._topic(f"produce{threads}")
        client.admin.topics.create(topic)
        per_thread = max(1, p.batches // threads)
        rng = np.random.default_rng(threads)
        work = [_messages(rng, per_thread * BATCH, 100_000, p.value_bytes) for _ in range(threads)]
        clients = [self.client() for _ in range(threads)]
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

    def prepare_state(self, client: Client, result: ServingResult) -> str:
        """A compacted topic of ``state_keys`` x ``versions`` messages to load the state of."""

        p = self.params
        topic = self._topic("state")
        client.admin.topics.create(topic)
        producer = client.create_producer(topic)
        rng = np.random.default_rng(11)
        keys = np.arange(p.state_keys)
        for _ in range(p.versions):  # every key once per version, in a fresh random order
            producer.send_many(self._versions(rng, rng.permutation(keys)))
        t0 = time.perf_counter()
        client.admin.topics.compact(topic)
        status = client.admin.topics.wait_for_compaction(topic, timeout=1800, poll_interval=0.1)
        result.compaction_s = time.perf_counter() - t0
        if status.status != "SUCCESS":
            raise RuntimeError(f"compaction of {topic} failed: {status}")
        result.full_messages = p.state_keys * p.versions
        result.compacted_messages = p.state_keys
        return topic

    def _versions(self, rng: np.random.Generator, keys: np.ndarray) -> list[OutgoingMessage]:
        """A new value for each of ``keys`` (indexes of the state's keys), in that order."""
        from api.client import OutgoingMessage

        size = self.params.value_bytes
        data = rng.bytes(len(keys) * size)
        return [OutgoingMessage(data[i * size : (i + 1) * size], f"key-{int(k)}") for i, k in enumerate(keys)]

    def prepare_layered(self, client: Client, result: ServingResult) -> tuple[str, str]:
        """Two topics with the same messages, ``layered_keys`` x ``layered_versions`` and then
        ``layered_deltas`` steps of 1% more on random keys: one compacted after the first and
        after each step (a base and a delta per step, with the service's default consolidation
        rule), one compacted once at the end (one base of the same live messages)."""
        p = self.params
        layered, one_base = self._topic("layered"), self._topic("one-base")
        rng = np.random.default_rng(13)
        keys = np.arange(p.layered_keys)
        batches = [[self._versions(rng, rng.permutation(keys)) for _ in range(p.layered_versions)]]
        step = max(1, p.layered_keys * p.layered_versions // 100)
        for _ in range(p.layered_deltas):
            batches.append([self._versions(rng, rng.integers(0, p.layered_keys, step))])
        producers = {}
        for topic in (layered, one_base):
            client.admin.topics.create(topic)
            producers[topic] = client.create_producer(topic)
        for batch in batches:
            for topic in (layered, one_base):
                for messages in batch:
                    producers[topic].send_many(messages)
            self._compact(client, layered)
        self._compact(client, one_base)
        result.layers = self._layers(client, layered)
        if result.layers.count("delta") != p.layered_deltas or self._layers(client, one_base) != ["base"]:
            raise RuntimeError(f"expected a base and {p.layered_deltas} deltas, found {result.layers}")
        return layered, one_base

    def _compact(self, client: Client, topic: str) -> None:
        client.admin.topics.compact(topic)
        status = client.admin.topics.wait_for_compaction(topic, timeout=1800, poll_interval=0.1)
        if status.status != "SUCCESS":
            raise RuntimeError(f"compaction of {topic} failed: {status}")

    def _layers(self, client: Client, topic: str) -> list[str]:
        """The kinds of the layers of ``topic``'s compacted ledger, from its manifest on disk."""
        from ledger.compacted_store import Manifest

        ledger_id = int(client.admin.topics.internal_stats(topic)["compactedLedger"]["ledgerId"])
        directory = self.server.data_dir / "ledgers" / topic / f"compacted-{ledger_id:020d}"
        return [layer.kind for layer in Manifest.load(directory).layers]

    def load_layered_once(
        self, client: Client, layered: str, one_base: str, result: ServingResult, i: int
    ) -> None:
        n = self.params.layered_keys
        order = [(layered, "layered"), (one_base, "one-base")]
        seconds, states = {}, {}
        for topic, name in order if i % 2 == 0 else order[::-1]:  # neither always goes first
            seconds[name], states[name] = self._load(client, topic, f"{name}-{i}", True, n)
        layered_s, layered_state = seconds["layered"], states["layered"]
        base_s, base_state = seconds["one-base"], states["one-base"]
        if layered_state != base_state:
            raise AssertionError("readCompacted over the deltas differs from over one base")
        result.consume_layered.append(n / layered_s)
        result.consume_one_base.append(n / base_s)
        self.log(
            f"serving layered run {i + 1} ({self.label}): readCompacted over {result.layers.count('delta')} "
            f"deltas {n / layered_s:,.0f}/s, over one base {n / base_s:,.0f}/s"
        )

    def load_once(self, client: Client, topic: str, result: ServingResult, i: int) -> None:
        cpu = self.server_cpu_s()
        full_s, full_state = self._load(client, topic, f"full-{i}", False, result.full_messages)
        cpu_full = self.server_cpu_s()
        comp_s, comp_state = self._load(client, topic, f"compacted-{i}", True, result.compacted_messages)
        result.consume_full_cpu_us.append((cpu_full - cpu) / result.full_messages * 1e6)
        result.consume_compacted_cpu_us.append(
            (self.server_cpu_s() - cpu_full) / result.compacted_messages * 1e6
        )
        if comp_state != full_state:
            raise AssertionError("readCompacted state differs from the full replay's")
        if len(full_state) != self.params.state_keys:
            raise AssertionError(f"replay found {len(full_state)} keys, expected {self.params.state_keys}")
        result.load_full_s.append(full_s)
        result.load_compacted_s.append(comp_s)
        result.consume_full.append(result.full_messages / full_s)
        result.consume_compacted.append(result.compacted_messages / comp_s)
        self.log(
            f"serving state run {i + 1} ({self.label}): full replay {full_s:.2f} s, "
            f"readCompacted {comp_s:.2f} s ({full_s / comp_s:.1f}x)"
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


def compare_authentication(
    work_dir: Path, params: ServingParams, log: Callable[[str], None] = print
) -> tuple[ServingResult, ServingResult]:
    """The serving figures with authentication off and on: both servers run at once, and each
    run of one is followed by the same run of the other."""
    benches = (
        ServingBench(work_dir, params, log, authentication=False),
        ServingBench(work_dir, params, log, authentication=True),
    )
    results = tuple(ServingResult(params, authentication=b.authentication) for b in benches)
    clients: list[Client] = []
    try:
        for b in benches:
            b.server.start()
            clients.append(b.client())
            b.open(clients[-1])
        for i in range(params.runs):
            for b, c, r in zip(benches, clients, results, strict=True):
                b.serve_once(c, r, i)
        topics = [b.prepare_state(c, r) for b, c, r in zip(benches, clients, results, strict=True)]
        for i in range(params.runs):
            for b, c, t, r in zip(benches, clients, topics, results, strict=True):
                b.load_once(c, t, r, i)
    finally:
        for c in clients:
            c.close()
        for b in benches:
            b.server.stop()
    return results[0], results[1]
