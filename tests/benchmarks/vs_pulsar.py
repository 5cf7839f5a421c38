"""Apache Pulsar 4.0.7 and ``compactor serve`` under Pulsar's own load tool, one after the other on
this machine (issue 48).

``python -m tests.benchmarks --only vs-pulsar [--vs-pulsar-seconds 30] [--vs-pulsar-durability both]``
(or ``python -m tests.benchmarks.vs_pulsar``). Not part of the default run: with 30 s runs a
durability mode takes about 10 minutes (two broker start-ups, Pulsar's up to 35 s; five runs on each,
each with a few seconds of the client's start and end, a consume up to ``consume_cap_s``).

Pulsar comes from Maven Central: ``mvn dependency:copy-dependencies`` over
``tests/benchmarks/pulsar/pom.xml`` (broker, bookie, Java client, pulsar-perf), with a generated
settings file that mirrors every repository to Maven Central (Pulsar's poms name others that cannot
be reached everywhere), into ``~/.cache/topic-compactor/pulsar-<version>/<hash of the pom>/lib``
once (``XDG_CACHE_HOME`` moves it); about 320 jars, 235 MB. It runs standalone (broker and one
bookie in one JVM, RocksDB metadata, no ZooKeeper) on 127.0.0.1:16650 (binary), 18080 (HTTP) and
13181 (bookie), refused when one of them is taken.

Durability modes, each broker started fresh on an empty data directory, Pulsar first:

- ``durable``: ``pulsar/standalone-durable.conf`` (the bookie syncs its journal before a message is
  acknowledged, BookKeeper's default) against ``COMPACTOR_FSYNC=always``;
- ``non-durable``: ``pulsar/standalone.conf`` (Pulsar's shipped standalone, no journal sync)
  against ``COMPACTOR_FSYNC=never``.

The service runs with ``COMPACTOR_SPARK_WARMUP=false``: nothing here compacts, and its start-up
warm-up round would otherwise spend CPU during the first runs (Pulsar has no such work).

The same pulsar-perf commands (``org.apache.pulsar.testclient.PulsarPerfTestTool``, the Java
client) against each broker, 100-byte values, batching on (1 ms window, up to 1,000 messages):

- produce, 1 producer and 4 producers, at 10,000,000 msg/s (as fast as it goes: ``-r 0`` is refused)
  for ``seconds``: messages acknowledged over the sending window (producers created .. DONE) plus
  the run's longest send-to-ack latency (``Run.acked_rate``: the last acknowledgement came within
  it, so a lower bound), or over pulsar-perf's Aggregated time when that is shorter (a broker far
  behind: its acknowledgements are counted at the first tick of pulsar-perf's 10 s reporting clock
  after DONE, and the sends still pending then fail). The Aggregated time runs from the client's
  start to that tick, in steps of 10 s (a 5 s run is timed as 10 s, a 30 s one as about 40 s): the
  Aggregated rate and the periodic lines (every 10 s, the last interval's rate) are kept beside.
- consume from earliest: a new Exclusive subscription on the 1-producer topic reading every message
  it acknowledged (``-m``; at most ``consume_cap_s``): from the first message received to the last.
- publish latency at a fixed 10,000 and 50,000 msg/s for ``seconds``: the Aggregated p50 and p99 of
  send to acknowledgement (after pulsar-perf's 1 s warm-up); a broker that acknowledged under 95%
  of the messages by the end is marked (pulsar-perf sends at the rate whatever the acknowledgements:
  its queue grew, and the latency with it).
- broker CPU: user + system seconds from ``/proc/<pid>/stat`` across each run (the Pulsar JVM; the
  service's process, its reaped children and its live descendants), per million messages.
- the host: the load average before each run, and the CPU of everything else during it (the
  machine's busy time from ``/proc/stat`` minus the broker's, pulsar-perf's and this process's).

Before each run the broker is given up to ``settle_s`` to go quiet (under a tenth of a core), so a
run's CPU is little of the last run's background work (a bookie's flush, a ledger's sealing).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests.server import ServerProcess

PULSAR_DIR = Path(__file__).resolve().parent / "pulsar"
POM = PULSAR_DIR / "pom.xml"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
SETTINGS_XML = (
    "<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
    "<url>{url}</url></mirror></mirrors></settings>\n"
)
BINARY_PORT, HTTP_PORT, BOOKIE_PORT = 16650, 18080, 13181
PULSAR_PORTS = (BINARY_PORT, HTTP_PORT, BOOKIE_PORT)
PULSAR_URL = f"pulsar://127.0.0.1:{BINARY_PORT}"
PULSAR_ADMIN = f"http://127.0.0.1:{HTTP_PORT}"
AS_FAST_AS_IT_GOES = 10_000_000  # msg/s: pulsar-perf refuses -r 0
MODES = ("durable", "non-durable")
PULSAR_CONF = {"durable": "standalone-durable.conf", "non-durable": "standalone.conf"}
SERVICE_FSYNC = {"durable": "always", "non-durable": "never"}
PERF_MAIN = "org.apache.pulsar.testclient.PulsarPerfTestTool"
PULSAR_MAIN = "org.apache.pulsar.PulsarStandaloneStarter"
_TICK = os.sysconf("SC_CLK_TCK")
_ADD_OPENS = [
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/sun.net=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
]
# Numbers as pulsar-perf prints them (English locale forced; padded, no grouping).
_N = r"\s*([-+]?(?:[\d.]+(?:E[-+]?\d+)?|NaN|\S*∞))"
_AGGREGATED_RATE = re.compile(rf"Aggregated throughput stats ---{_N} records (?:sent|received) ---{_N} msg/s")
_AGGREGATED_LATENCY = re.compile(
    rf"Aggregated latency stats --- Latency: mean:{_N} ms - med:{_N} - 95pct:{_N} - 99pct:{_N}.*? - Max:{_N}"
)
_INTERVAL = re.compile(
    rf"Throughput (?:produced|received):{_N} msg ---{_N}\s+msg/s .*?Latency: mean:{_N} ms - med:{_N}"
    rf" - 95pct:{_N} - 99pct:{_N}"
)
# The sending (receiving) part of a run, between two of pulsar-perf's log lines (log4j2-perf.properties
# starts each with HH:mm:ss.SSS): producers created (consumers receiving) .. DONE.
_CLOCK = r"^(\d\d):(\d\d):(\d\d)\.(\d\d\d) "
_FIRST = re.compile(_CLOCK + r".*(?:Created \d+ producers|Start receiving from)", re.MULTILINE)
_DONE = re.compile(_CLOCK + r".*-{5,} DONE", re.MULTILINE)


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # NaN, ∞: an empty histogram
        return math.nan


@dataclass(frozen=True)
class VsPulsarParams:
    seconds: int = 30
    modes: tuple[str, ...] = MODES
    value_bytes: int = 100
    latency_rates: tuple[int, ...] = (10_000, 50_000)
    settle_s: float = 20.0

    @classmethod
    def quick(cls, modes: tuple[str, ...] = MODES) -> VsPulsarParams:
        return cls(seconds=10, modes=modes)

    @property
    def consume_cap_s(self) -> int:
        return max(60, 4 * self.seconds)


# --------------------------------------------------------------------------- assembling Pulsar


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topic-compactor"


def pulsar_version(pom: Path = POM) -> str:
    found = re.search(r"<pulsar\.version>([^<]+)</pulsar\.version>", pom.read_text(encoding="utf-8"))
    if found is None:
        raise RuntimeError(f"{pom}: no <pulsar.version>")
    return found.group(1)


def assemble(log: Callable[[str], None] = print, pom: Path = POM) -> Path:
    """The directory of Pulsar's jars for ``pom`` (assembled once, then found in the cache)."""
    data = pom.read_bytes()
    root = _cache_root() / f"pulsar-{pulsar_version(pom)}" / hashlib.sha256(data).hexdigest()[:16]
    lib = root / "lib"
    if (lib / ".complete").is_file():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "vs-pulsar assembles Apache Pulsar with Maven: no `mvn` on PATH (apt-get install maven)"
        )
    root.mkdir(parents=True, exist_ok=True)
    log(f"vs-pulsar: assembling Pulsar {pulsar_version(pom)} from Maven Central into {lib} (once)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=root, prefix="assembling-") as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_bytes(data)
        (work / "settings.xml").write_text(SETTINGS_XML.format(url=MAVEN_CENTRAL), encoding="utf-8")
        out = work / "lib"
        done = subprocess.run(
            [
                mvn,
                "-s",
                "settings.xml",
                "-q",
                "-B",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={out}",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        jars = list(out.glob("*.jar")) if out.is_dir() else []
        if done.returncode != 0 or len(jars) < 100:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise RuntimeError(
                f"mvn dependency:copy-dependencies failed ({done.returncode}, {len(jars)} jars):\n{tail}"
            )
        (out / ".complete").write_text(f"{len(jars)} jars from {pom}\n", encoding="utf-8")
        try:
            out.rename(lib)
        except OSError:
            if not (lib / ".complete").is_file():  # else another run assembled it meanwhile
                raise
    log(f"vs-pulsar: {len(jars)} jars in {time.monotonic() - started:.0f} s")
    return lib


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("vs-pulsar needs Java 17 or 21 (`make java`)")
    return found


# --------------------------------------------------------------------------- processes and CPU


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and of its children it has reaped (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICK


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, its reaped children and its live descendants (theirs included)."""
    total = proc_cpu_seconds(pid)
    for kid in descendants(pid):
        with contextlib.suppress(OSError):  # gone meanwhile: its parent reaped it into its own
            total += proc_cpu_seconds(kid.pid)
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, ``/proc/stat``): user, nice, system,
    irq, softirq, steal."""
    first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def reaped_children_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def ports_free(ports: tuple[int, ...], wait_s: float = 30.0) -> None:
    """Raise unless every port can be bound on 127.0.0.1 (waiting ``wait_s`` for a broker that
    just stopped to let go of them)."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = []
        for port in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    busy.append(port)
        if not busy:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 in use: another Pulsar standalone? "
                "(../shared/real-pulsar/stop.sh stops the shared recipe's)"
            )
        time.sleep(0.5)


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group (a session of its own, started here), SIGKILL after
    ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """A SIGTERM to this process unwinds it (``finally`` blocks stop the brokers) instead of
    ending it on the spot."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- the two brokers


class Broker:
    name: str
    service_url: str
    admin_url: str

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def cpu_seconds(self) -> float:
        raise NotImplementedError

    def discard_data(self) -> None:
        """Remove what the stopped broker stored (gigabytes after a full run), keeping its logs."""
        raise NotImplementedError


class PulsarStandalone(Broker):
    """``PulsarStandaloneStarter`` on loopback (the JVM is the broker: its CPU is the JVM's)."""

    name = "Pulsar"
    service_url = PULSAR_URL
    admin_url = PULSAR_ADMIN

    def __init__(self, lib: Path, conf: Path, data_dir: Path) -> None:
        self.lib, self.conf, self.data_dir = lib, conf, data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "logs" / "stdout.log"

    def start(self, timeout: float = 180.0) -> None:
        ports_free(PULSAR_PORTS)
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [
            _java(),
            "-Xms256m",
            "-Xmx2g",
            "-XX:MaxDirectMemorySize=2g",
            "-Djava.net.preferIPv4Stack=true",
            "-Djute.maxbuffer=10485760",
            "-Dio.netty.tryReflectionSetAccessible=true",
            *_ADD_OPENS,
            "-Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver",
            "-Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver",
            "-Dlog4j.shutdownHookEnabled=false",
            "-Dlog4j2.is.webapp=false",
            f"-Dlog4j2.configurationFile={PULSAR_DIR / 'log4j2.properties'}",
            f"-Dpulsar.log.dir={logs}",
            "-Dpulsar.log.file=pulsar-standalone.log",
            "-Dpulsar.log.level=info",
            "-cp",
            f"{self.lib}/*",
            PULSAR_MAIN,
            "--config",
            str(self.conf),
            "--no-functions-worker",
            "--no-stream-storage",
            "-a",
            "127.0.0.1",
            "--metadata-dir",
            str(self.data_dir / "metadata"),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
            "--bookkeeper-port",
            str(BOOKIE_PORT),
            "--zookeeper-dir",
            str(self.data_dir / "zookeeper-unused"),
        ]
        with open(self.log, "ab") as out:
            # A session of its own: a Ctrl-C at the terminal reaches this process, whose
            # ``finally`` stops the broker, not the broker behind its back.
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.data_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Pulsar exited with {self.proc.returncode}; see {logs}")
            with contextlib.suppress(httpx.HTTPError):
                ready = httpx.get(f"{self.admin_url}/admin/v2/namespaces/public/default", timeout=2)
                if ready.status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"Pulsar not ready after {timeout:g} s; see {logs}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.proc is not None:
            _stop_group(self.proc, 60)

    def discard_data(self) -> None:
        for name in ("metadata", "bookkeeper", "zookeeper-unused"):
            shutil.rmtree(self.data_dir / name, ignore_errors=True)


class Service(Broker):
    """A real ``compactor serve`` (``tests.server.ServerProcess``) with the fsync policy given."""

    name = "service"

    def __init__(self, data_dir: Path, fsync: str) -> None:
        self.server = ServerProcess(
            data_dir, env={"COMPACTOR_FSYNC": fsync, "COMPACTOR_SPARK_WARMUP": "false"}
        )
        self.service_url = self.server.pulsar_url
        self.admin_url = self.server.url
        self.log = self.server.log

    def start(self) -> None:
        ports_free((self.server.port, self.server.broker_port), wait_s=0)
        self.server.start()
        self.server.create_namespaces("public/default")

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.pid)

    def stop(self) -> None:
        proc = self.server.proc
        if proc is None:
            return
        kids = descendants(proc.pid) if proc.poll() is None else []
        self.server.stop()
        for kid in kids:  # one the server left behind (psutil refuses a pid since reused)
            with contextlib.suppress(psutil.NoSuchProcess):
                kid.kill()

    def discard_data(self) -> None:
        shutil.rmtree(self.server.data_dir, ignore_errors=True)


# --------------------------------------------------------------------------- pulsar-perf


@dataclass
class Run:
    """One pulsar-perf run against one broker."""

    what: str
    messages: int = 0
    rate: float = math.nan  # msg/s, pulsar-perf's Aggregated
    p50_ms: float = math.nan  # publish latency (produce runs), Aggregated
    p99_ms: float = math.nan
    max_ms: float = math.nan
    intervals: list[float] = field(default_factory=list)  # msg/s of each periodic line
    window_s: float = math.nan  # from the first send (or receive) to pulsar-perf's DONE
    wall_s: float = 0.0
    broker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0  # pulsar-perf's JVM
    others_cpu_s: float = 0.0  # everything else on the machine
    load: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    error: str | None = None
    log: str = ""

    def cpu_per_million(self) -> float:
        return self.broker_cpu_s / self.messages * 1e6 if self.messages else math.nan

    @property
    def acked_rate(self) -> float:
        """Messages acknowledged a second from the first send to the last acknowledgement, at
        least: two times hold that span, the sending window plus the longest send-to-ack latency
        (every message acknowledged was sent before DONE and took no longer) and pulsar-perf's
        Aggregated time (from the client's start to the first tick of its 10 s reporting clock
        after DONE, when it counts): the shorter of them. A consume's window runs from its first
        message to its last."""
        if not self.window_s > 0:
            return self.rate
        if self.what == "consume":
            return self.messages / self.window_s
        tail = 0.0 if math.isnan(self.max_ms) else self.max_ms / 1000
        bound = self.messages / (self.window_s + tail)
        return bound if math.isnan(self.rate) else max(bound, self.rate)


def _seconds_of_day(m: re.Match[str]) -> float:
    h, mi, s, ms = (int(g) for g in m.groups()[:4])
    return h * 3600 + mi * 60 + s + ms / 1000


def parse_perf(text: str, run: Run) -> None:
    """Fill ``run``'s figures from pulsar-perf's output: messages, Aggregated msg/s, p50 and p99
    (ms; NaN when absent), the rate of every periodic line, the window; ValueError without an
    Aggregated line."""
    rate = _AGGREGATED_RATE.search(text)
    if rate is None:
        raise ValueError("no 'Aggregated throughput stats' line")
    run.messages, run.rate = int(_num(rate.group(1))), _num(rate.group(2))
    latency = _AGGREGATED_LATENCY.search(text)
    if latency is not None:
        run.p50_ms, run.p99_ms, run.max_ms = (_num(latency.group(i)) for i in (2, 4, 5))
    run.intervals = [_num(m.group(2)) for m in _INTERVAL.finditer(text)]
    first, done = _FIRST.search(text), _DONE.search(text)
    if first is not None and done is not None:
        run.window_s = (_seconds_of_day(done) - _seconds_of_day(first)) % 86400  # past midnight too


@dataclass
class BrokerRuns:
    name: str
    runs: dict[str, Run] = field(default_factory=dict)
    ready_s: float = math.nan
    error: str | None = None


@dataclass
class VsPulsarResult:
    params: VsPulsarParams
    version: str
    modes: dict[str, dict[str, BrokerRuns]] = field(default_factory=dict)  # mode -> broker -> runs
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    def errors(self) -> list[str]:
        """What failed: a broker, or one of its runs."""
        found = []
        for mode, brokers in self.modes.items():
            for side in brokers.values():
                if side.error is not None:
                    found.append(f"vs-pulsar ({mode}) {side.name}: {side.error}")
                for run in side.runs.values():
                    if run.error is not None:
                        found.append(f"vs-pulsar ({mode}) {side.name} {run.what}: {run.error}")
        return found


class VsPulsarBench:
    def __init__(self, work_dir: Path, params: VsPulsarParams, log: Callable[[str], None] = print) -> None:
        self.work_dir = Path(work_dir) / "vs-pulsar"
        self.params = params
        self.log = log

    def run(self) -> VsPulsarResult:
        lib = assemble(self.log)
        result = VsPulsarResult(self.params, pulsar_version())
        with sigterm_as_exit():
            for mode in self.params.modes:
                where = self.work_dir / mode
                result.modes[mode] = {
                    "Pulsar": self.measure(
                        PulsarStandalone(lib, PULSAR_DIR / PULSAR_CONF[mode], where / "pulsar"), lib, mode
                    ),
                    "service": self.measure(
                        Service(where / "service" / "data", SERVICE_FSYNC[mode]), lib, mode
                    ),
                }
        return result

    def measure(self, broker: Broker, lib: Path, mode: str) -> BrokerRuns:
        out = BrokerRuns(broker.name)
        p = self.params
        self.log(f"vs-pulsar ({mode}): starting {broker.name}")
        started = time.monotonic()
        try:
            broker.start()
            out.ready_s = time.monotonic() - started
            self.log(f"vs-pulsar ({mode}): {broker.name} ready in {out.ready_s:.0f} s")
            topic = f"persistent://public/default/vs-pulsar-{mode}"
            fast = ["-r", str(AS_FAST_AS_IT_GOES), "-time", str(p.seconds)]
            one = self.perf(broker, lib, mode, "produce-1", self.produce([*fast, "-n", "1"], f"{topic}-p1"))
            out.runs[one.what] = one
            run = self.perf(broker, lib, mode, "produce-4", self.produce([*fast, "-n", "4"], f"{topic}-p4"))
            out.runs[run.what] = run
            if one.messages:
                consume = [
                    "consume",
                    *("-n", "1", "-ss", "vs-pulsar", "-sp", "Earliest", "-st", "Exclusive"),
                    *("-m", str(one.messages), "-time", str(p.consume_cap_s)),
                    f"{topic}-p1",
                ]
                run = self.perf(broker, lib, mode, "consume", consume, timeout=p.consume_cap_s + 120)
            else:
                run = Run("consume", error="nothing produced to consume")
            out.runs[run.what] = run
            for rate in p.latency_rates:
                args = self.produce(
                    ["-r", str(rate), "-time", str(p.seconds), "-n", "1"], f"{topic}-at-{rate}"
                )
                run = self.perf(broker, lib, mode, f"latency-{rate}", args)
                out.runs[run.what] = run
        except Exception as e:  # the other broker's figures are still worth having
            out.error = f"{type(e).__name__}: {e}"
            self.log(f"vs-pulsar ({mode}): {broker.name} failed: {out.error}")
        finally:
            self.log(f"vs-pulsar ({mode}): stopping {broker.name}")
            broker.stop()
            broker.discard_data()
        return out

    def produce(self, args: list[str], topic: str) -> list[str]:
        size = str(self.params.value_bytes)
        return ["produce", "-s", size, "-b", "1", "-bm", "1000", *args, topic]

    def settle(self, broker: Broker) -> None:
        """Wait (at most ``settle_s``) until the broker uses under a tenth of a core."""
        deadline = time.monotonic() + self.params.settle_s
        before = broker.cpu_seconds()
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = broker.cpu_seconds()
            if now - before < 0.1:
                return
            before = now

    def perf(
        self, broker: Broker, lib: Path, mode: str, what: str, args: list[str], timeout: float | None = None
    ) -> Run:
        """One pulsar-perf run against ``broker``, with the CPU and the load around it."""
        run = Run(what)
        where = self.work_dir / mode
        where.mkdir(parents=True, exist_ok=True)
        conf = where / f"client-{broker.name}.conf"
        conf.write_text(
            f"brokerServiceUrl={broker.service_url}\nwebServiceUrl={broker.admin_url}\n", encoding="utf-8"
        )
        log_path = where / f"perf-{broker.name}-{what}.log"
        run.log = str(log_path)
        cmd = [
            _java(),
            "-Xms128m",
            "-Xmx2g",
            "-XX:MaxDirectMemorySize=1g",
            "-Djava.net.preferIPv4Stack=true",
            "-Duser.language=en",
            "-Duser.country=US",
            "-Dio.netty.tryReflectionSetAccessible=true",
            *_ADD_OPENS,
            f"-Dlog4j2.configurationFile={PULSAR_DIR / 'log4j2-perf.properties'}",
            "-cp",
            f"{lib}/*",
            PERF_MAIN,
            str(conf),
            args[0],
            "-u",
            broker.service_url,
            *args[1:],
        ]
        self.settle(broker)
        self.log(f"vs-pulsar ({mode}): {broker.name} {what}")
        run.load = os.getloadavg()
        cpu0, client0, own0, busy0 = (
            broker.cpu_seconds(),
            reaped_children_seconds(),
            own_seconds(),
            machine_busy_seconds(),
        )
        started = time.monotonic()
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=where,
                start_new_session=True,
            )
            try:
                proc.wait(timeout if timeout is not None else self.params.seconds + 120)
            except subprocess.TimeoutExpired:
                run.error = "pulsar-perf did not finish in time"
            finally:
                _stop_group(proc, 10)
        run.wall_s = time.monotonic() - started
        run.broker_cpu_s = broker.cpu_seconds() - cpu0
        run.client_cpu_s = reaped_children_seconds() - client0
        own = own_seconds() - own0
        run.others_cpu_s = machine_busy_seconds() - busy0 - run.broker_cpu_s - run.client_cpu_s - own
        text = log_path.read_text(encoding="utf-8", errors="replace")
        try:
            parse_perf(text, run)
        except ValueError as e:
            run.error = run.error or f"{e} (exit {proc.returncode}; see {log_path})"
        if run.error:
            self.log(f"vs-pulsar ({mode}): {broker.name} {what}: {run.error}")
        else:
            self.log(
                f"vs-pulsar ({mode}): {broker.name} {what}: {run.messages:,} messages, "
                f"{run.acked_rate:,.0f} msg/s, broker CPU {run.broker_cpu_s:.1f} s"
            )
        return run


if __name__ == "__main__":
    import argparse
    import sys

    from tests.benchmarks.report import vs_pulsar_tables

    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.vs_pulsar")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--durability", choices=(*MODES, "both"), default="both")
    ns = parser.parse_args()
    chosen = MODES if ns.durability == "both" else (ns.durability,)
    with tempfile.TemporaryDirectory(prefix="vs-pulsar-") as d:
        found = VsPulsarBench(
            Path(d), VsPulsarParams(seconds=ns.seconds, modes=chosen), log=lambda m: print(m, file=sys.stderr)
        ).run()
        for table in vs_pulsar_tables(found):
            print(table.text(), "\n")
