"""Tables, the targets of issue 6, and the plots of a run's figures.

Every figure is put in a :class:`Table`, which prints as aligned text (stdout) and as a
Markdown table (in a block of ``BENCHMARKS.md``, laid out by ``tests.benchmarks.document``).
Units: seconds are wall clock; MB = 10^6 bytes; "msg/s" is messages of the input per second;
memory in MiB (2^20 bytes).
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.layers import LayersResult
from tests.benchmarks.partitions import PartitionsResult
from tests.benchmarks.runner import CompactorRuns, IncrementalResult, SizeResult
from tests.benchmarks.scrape import Block, ScrapeResult
from tests.benchmarks.service_rounds import ServiceRoundsResult
from tests.benchmarks.serving import ServingResult
from tests.benchmarks.shapes import ShapeResult
from tests.benchmarks.vs_pulsar import BrokerRuns, Run, VsPulsarResult

PROJECT = "project (Spark)"
DUCKDB = "DuckDB"
PYTHON = "Python dict"


# --------------------------------------------------------------------------- formatting


def f2(n: float) -> str:
    return f"{n:.2f}"


def f_int(n: float) -> str:
    return f"{n:,.0f}"


def f_s(s: float) -> str:
    if math.isnan(s):
        return "-"
    return f"{s:.2f}" if s < 100 else f"{s:.0f}"


def f_x(r: float) -> str:
    return "-" if math.isnan(r) else f"{r:.2f}x"


def f_mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def f_mb(b: float) -> str:
    return f"{b / 1e6:,.0f}"


def f_pct(r: float) -> str:
    return "-" if math.isnan(r) else f"{100 * r:.0f}%"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [
            max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = "  ".join("-" * w for w in widths)

        def fmt(cells: Sequence[str]) -> str:
            return "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        out = [f"== {self.title}", fmt(self.columns), line, *(fmt(r) for r in self.rows)]
        out += [f"   {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"#### {self.title}", ""]
        out.append("| " + " | ".join(self.columns) + " |")
        out.append("| " + " | ".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + " |")
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        if self.notes:
            out.append("")
            out += [f"- {n}" for n in self.notes]
        return "\n".join(out)


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------- compaction tables


def _rate(n: float, s: float) -> float:
    return n / s if s > 0 else float("nan")


def compaction_table(r: SizeResult, title: str) -> Table:
    t = Table(
        title,
        [
            "compactor",
            "median s",
            "runs (s)",
            "CPU s",
            "msg/s",
            "MB/s Parquet",
            "MB/s payload",
            "peak memory MiB",
            "output rows",
        ],
    )
    for name, runs in r.runs.items():
        s = runs.median_s
        t.add(
            name,
            f_s(s),
            " / ".join(f_s(x) for x in runs.seconds),
            f_s(runs.median_cpu_s),
            f_int(_rate(r.messages, s)),
            f"{_rate(r.parquet_bytes, s) / 1e6:,.1f}",
            f"{_rate(r.payload_bytes, s) / 1e6:,.1f}",
            memory_cell(name, runs),
            f_int(runs.rows),
        )
    proj, duck, py = (r.runs.get(n) for n in (PROJECT, DUCKDB, PYTHON))
    t.notes += _warmup_note(r.runs)
    t.notes.append(
        f"input: {f_int(r.messages)} messages, {f_int(r.spec.keys)} keys, {r.spec.value_bytes}-byte values, "
        f"{r.spec.tombstone_share:.0%} tombstones, {r.ledgers} sealed ledgers; "
        f"{f_mb(r.parquet_bytes)} MB of Parquet (random values do not compress), "
        f"{f_mb(r.payload_bytes)} MB of key+value payload; generated in {f_s(r.generate_s)} s"
    )
    if proj and duck:
        t.notes.append(f"project / DuckDB time: {f_x(proj.median_s / duck.median_s)}")
    if proj and py:
        t.notes.append(
            f"Python / project time: {f_x(py.median_s / proj.median_s)} "
            "(how many times faster the project is)"
        )
    if proj:
        p1 = [d.get("phase_one_ms") for d in proj.details]
        p2 = [d.get("phase_two_ms") for d in proj.details]
        t.notes.append(
            "project phases (ms, per run): phase one "
            + " / ".join(str(x) for x in p1)
            + "; phase two (incl. fsync + manifest) "
            + " / ".join(str(x) for x in p2)
            + f"; part files: {proj.details[-1].get('parts')}"
        )
    return t


def shapes_table(results: Sequence[ShapeResult]) -> Table:
    """One row per shape: the project's and DuckDB's median full round and their ratio."""
    t = Table(
        "Full round by shape of data: the project against DuckDB",
        [
            "shape",
            "messages",
            "Parquet MB",
            "output rows",
            "project s",
            "DuckDB s",
            "project / DuckDB",
            "CPU s, project / DuckDB",
        ],
    )
    for r in results:
        proj, duck = r.median(PROJECT), r.median(DUCKDB)
        cpu = "-"
        if r.cpu_seconds.get(PROJECT) and r.cpu_seconds.get(DUCKDB) and r.median_cpu(DUCKDB) > 0:
            p_cpu, d_cpu = r.median_cpu(PROJECT), r.median_cpu(DUCKDB)
            cpu = f"{p_cpu:.2f} / {d_cpu:.2f} ({f_x(p_cpu / d_cpu)})"
        t.add(
            f"{r.shape.name}: {r.shape.describe}",
            f_int(r.messages),
            f_mb(r.parquet_bytes),
            f_int(r.output_rows),
            f"{f_s(proj)} ({' / '.join(f_s(x) for x in r.seconds[PROJECT])})",
            f"{f_s(duck)} ({' / '.join(f_s(x) for x in r.seconds[DUCKDB])})",
            f_x(proj / duck),
            cpu,
        )
    if results:
        base = results[0].shape.spec
        t.notes.append(
            f"every shape is {f_int(base.messages)} messages over {f_int(base.keys)} keys, "
            f"{base.value_bytes}-byte random values, {base.tombstone_share:.0%} tombstones, "
            "with the one change its name says; medians of the runs shown, the order of the two "
            "alternating, after one unmeasured round of each; outputs checked equal every run; CPU "
            "seconds are medians too (the project's: its driver, JVM and Python workers)"
        )
    return t


def _warmup_note(runs: dict[str, CompactorRuns]) -> list[str]:
    if not any(r.warmup_seconds for r in runs.values()):
        return []
    warm = [f"{name} {' / '.join(f_s(x) for x in r.warmup_seconds)}" for name, r in runs.items()]
    return ["unmeasured warm-up round before the runs (s): " + ", ".join(warm)]


def memory_cell(name: str, runs: CompactorRuns) -> str:
    peak = runs.max_peak
    if peak is None:
        return "-"
    if name == PROJECT:
        return f"driver {f_mib(peak.peak_self)} + Spark {f_mib(peak.peak_children)}"
    return f"+{f_mib(runs.max_delta_self)}"


def incremental_table(r: IncrementalResult) -> Table:
    t = Table(
        f"Incremental round: {r.spec.label} + {f_int(r.new_messages)} new messages (1%)",
        ["compactor", "full round s", "incremental s", "runs (s)", "share of full", "input MB"],
    )
    for name, runs in r.runs.items():
        t.add(
            name,
            f_s(r.full[name]),
            f_s(runs.median_s),
            " / ".join(f_s(x) for x in runs.seconds),
            f_pct(r.share(name)),
            f_mb(runs.input_bytes),
        )
    t.notes += _warmup_note(r.runs)
    t.notes.append(
        "input of the second round: each compactor's own first-round output plus the new sealed ledger "
        "(the project: CompactionJob with previous_compacted and previous_horizon)"
    )
    t.notes.append(f"second-round output rows (checked equal): {f_int(r.output_rows)}")
    return t


SCALE_TITLE = "Scale: median seconds of a full compaction"


def scale_table(results: Sequence[SizeResult]) -> Table:
    names = [PROJECT, DUCKDB, PYTHON]
    t = Table(
        SCALE_TITLE,
        [
            "messages / keys",
            *names,
            "project msg/s",
            "project / DuckDB",
            "Python / project",
            "project Spark procs peak MiB",
        ],
    )
    for r in results:
        med = {n: (r.runs[n].median_s if n in r.runs else float("nan")) for n in names}
        proj = r.runs.get(PROJECT)
        jvm = proj.max_peak.peak_children if proj and proj.max_peak else float("nan")
        t.add(
            r.spec.label,
            *(f_s(med[n]) for n in names),
            f_int(_rate(r.messages, med[PROJECT])) if proj else "-",
            f_x(med[PROJECT] / med[DUCKDB]),
            f_x(med[PYTHON] / med[PROJECT]),
            f_mib(jvm) if not math.isnan(jvm) else "-",
        )
    return t


def big_table(r: SizeResult) -> Table:
    runs = r.runs[PROJECT]
    peak = runs.max_peak
    assert peak is not None
    t = Table(
        f"Big: {r.spec.label} (project only)",
        [
            "messages / keys",
            "seconds",
            "msg/s",
            "MB/s Parquet",
            "peak driver RSS MiB",
            "peak Spark processes RSS MiB",
            "peak sum MiB",
            "output rows",
        ],
    )
    s = runs.median_s
    t.add(
        r.spec.label,
        f_s(s),
        f_int(_rate(r.messages, s)),
        f"{_rate(r.parquet_bytes, s) / 1e6:,.1f}",
        f_mib(peak.peak_self),
        f_mib(peak.peak_children),
        f_mib(peak.peak_total),
        f_int(runs.rows),
    )
    t.notes.append(
        f"input: {f_mb(r.parquet_bytes)} MB of Parquet in {r.ledgers} ledgers; "
        f"phase one {runs.details[-1].get('phase_one_ms')} ms, "
        f"phase two {runs.details[-1].get('phase_two_ms')} ms"
    )
    return t


def serving_table(r: ServingResult) -> Table:
    p = r.params
    t = Table(
        "Serving: a real `compactor serve` (fsync always) through api.client", ["figure", "median", "runs"]
    )

    def runs(xs: Sequence[float], fmt: str = "{:,.0f}") -> str:
        return " / ".join(fmt.format(x) for x in xs)

    from tests.benchmarks.measure import median, percentile

    t.add("produce, 1 client, batches of 1,000 (msg/s)", f_int(median(r.produce_one)), runs(r.produce_one))
    t.add(
        f"produce, {p.threads} client threads, batches of 1,000 (msg/s)",
        f_int(median(r.produce_threads)),
        runs(r.produce_threads),
    )
    t.add(
        "single-message produce latency p50 (ms)",
        f"{r.p50_ms:.2f}",
        runs([percentile(x, 50) for x in r.latencies_ms], "{:.2f}"),
    )
    t.add(
        "single-message produce latency p99 (ms)",
        f"{r.p99_ms:.2f}",
        runs([percentile(x, 99) for x in r.latencies_ms], "{:.2f}"),
    )
    t.add("consume, full log (msg/s)", f_int(median(r.consume_full)), runs(r.consume_full))
    t.add("consume, readCompacted (msg/s)", f_int(median(r.consume_compacted)), runs(r.consume_compacted))
    t.add(
        f"latest state by full replay ({f_int(r.full_messages)} msgs) (s)",
        f_s(median(r.load_full_s)),
        runs(r.load_full_s, "{:.2f}"),
    )
    t.add(
        f"latest state by readCompacted ({f_int(r.compacted_messages)} msgs) (s)",
        f_s(median(r.load_compacted_s)),
        runs(r.load_compacted_s, "{:.2f}"),
    )
    t.add("readCompacted speed-up of the latest-state load", f_x(r.load_speedup), "")
    if r.consume_layered:
        deltas = r.layers.count("delta")
        t.add(
            f"consume, readCompacted over a base + {deltas} deltas (msg/s)",
            f_int(median(r.consume_layered)),
            runs(r.consume_layered),
        )
        t.add(
            "consume, readCompacted over one base, the same messages (msg/s)",
            f_int(median(r.consume_one_base)),
            runs(r.consume_one_base),
        )
        t.add(
            "readCompacted over the deltas / over one base (time)",
            f_x(median(r.consume_one_base) / median(r.consume_layered)),
            "",
        )
    t.notes.append(
        f"produce: {p.batches} requests of 1,000 messages ({p.value_bytes}-byte values) per measurement, "
        f"split over {p.threads} threads in the threaded case; latency: {p.latency_requests} sequential sends"
    )
    t.notes.append(
        f"consume: {f_int(p.state_keys)} keys x {p.versions} versions, compacted first "
        f"(compaction through the REST API took {f_s(r.compaction_s)} s incl. polling); a consumer "
        f"subscribes at earliest, batch_receive({p.page}), acknowledge_cumulative per batch (the "
        "client groups acks, 100 ms, as Pulsar's), builds key -> value, closes (the clock stops "
        "here); the two maps are checked equal and the server's backlog empty"
    )
    if r.consume_layered:
        t.notes.append(
            f"readCompacted over deltas: two topics get the same messages ({f_int(p.layered_keys)} keys "
            f"x {p.layered_versions} versions, then {p.layered_deltas} steps of 1% more on random keys); "
            "one is compacted after the first and after each step (a base and a delta per step, the "
            f"default consolidation rule; layers {'/'.join(r.layers)}), the other once at the end; "
            "each run consumes both as above (which goes first alternates), the two maps checked equal"
        )
    t.notes.append(f"client and server share the machine's {os.cpu_count()} cores; client: {r.client}")
    return t


def authentication_table(off: ServingResult, on: ServingResult) -> Table:
    """What authentication and authorization cost: the same runs with them off and on."""
    from tests.benchmarks.measure import median

    t = Table(
        "Serving with authentication and authorization on (issue 12: cost under 5%)",
        ["figure", "auth off", "auth on", "change"],
    )

    def row(what: str, a: float, b: float) -> None:
        change = (b - a) / a * 100 if a else 0.0
        t.add(
            what,
            f"{a:,.0f}" if a >= 100 else f"{a:.2f}",
            f"{b:,.0f}" if b >= 100 else f"{b:.2f}",
            f"{change:+.1f}%",
        )

    row("produce, 1 client (msg/s)", median(off.produce_one), median(on.produce_one))
    row(
        f"produce, {off.params.threads} client threads (msg/s)",
        median(off.produce_threads),
        median(on.produce_threads),
    )
    row("single-message produce latency p50 (ms)", off.p50_ms, on.p50_ms)
    row("consume, full log (msg/s)", median(off.consume_full), median(on.consume_full))
    row("consume, readCompacted (msg/s)", median(off.consume_compacted), median(on.consume_compacted))
    row(
        "server CPU per message produced, 1 client (µs)",
        median(off.produce_cpu_us),
        median(on.produce_cpu_us),
    )
    row(
        "server CPU per message consumed, full log (µs)",
        median(off.consume_full_cpu_us),
        median(on.consume_full_cpu_us),
    )
    row(
        "server CPU per message consumed, readCompacted (µs)",
        median(off.consume_compacted_cpu_us),
        median(on.consume_compacted_cpu_us),
    )
    t.notes.append(
        "both servers run at once and each run of one is followed by the same run of the other; auth on: "
        "HS256 tokens (verified once, then from the cache), authorization on, the client's role an admin "
        "of the benchmark's tenant (not a superuser), so every request checks the token and the role's rights"
    )
    t.notes.append(
        "server CPU: user + system time of the `compactor serve` process during the measurement, per "
        "message (requests of 1,000 messages; pages of up to 1,000): the work authentication adds is "
        "the server's, and CPU time is far less disturbed than throughput by other load on the machine"
    )
    return t


def scrape_table(result: ScrapeResult) -> Table:
    """Produce and consume without and with a Prometheus-like scraper, block by block on one
    server (see ``tests.benchmarks.scrape``)."""
    from tests.benchmarks.measure import median

    t = Table(
        f"Scraping `/metrics` every {result.interval_s:g} s while serving",
        ["figure", "without scraper", "with scraper", "change of medians", "median change per pair"],
    )
    names = {
        "produce": "produce, 1 client",
        "consume_full": "consume, full log",
        "consume_compacted": "consume, readCompacted",
    }
    rows: list[tuple[str, Callable[[Block], float], Callable[[float], str], float]] = []
    for key, name in names.items():
        # Throughput: higher is better, so a slow-down is a negative change; CPU the other way.
        rows.append((f"{name} (msg/s)", lambda b, k=key: b.rate[k], f_int, -1.0))
    for key, name in names.items():
        rows.append((f"server CPU per message, {name} (µs)", lambda b, k=key: b.cpu_us[k], f2, 1.0))
    for label, figure, fmt, _ in rows:
        without = [figure(a) for a, _ in result.pairs]
        with_ = [figure(b) for _, b in result.pairs]
        per_pair = [(b / a - 1) * 100 for a, b in zip(without, with_, strict=True)]
        t.add(
            label,
            fmt(median(without)),
            fmt(median(with_)),
            f"{(median(with_) / median(without) - 1) * 100:+.1f}%",
            f"{median(per_pair):+.1f}% (of {len(per_pair)}: {min(per_pair):+.1f}% .. {max(per_pair):+.1f}%)",
        )
    for key, name in names.items():
        scraped = [b for _, b in result.pairs]
        spent = sum(b.scrape_cpu_s[key] for b in scraped)
        if not spent:
            continue  # a service without compactor_metrics_scrape_cpu_seconds
        cpu_share = spent / sum(b.server_cpu_s[key] for b in scraped)
        wall_share = spent / sum(b.wall_s[key] for b in scraped)
        t.notes.append(
            f"{name}: in the blocks with a scraper, the scrapes took {cpu_share * 100:.2f}% of the server's "
            f"CPU and held it for {wall_share * 100:.2f}% of the wall time (the service's own "
            "compactor_metrics_scrape_cpu_seconds, the scrape thread's CPU time: with one interpreter "
            "lock, the most a scrape can hold the service back)"
        )
    if result.scrapes:
        t.notes.append(
            f"{len(result.scrapes)} scrapes during the blocks, "
            f"median {median(result.scrapes) * 1000:.1f} ms, max {max(result.scrapes) * 1000:.1f} ms each"
        )
    per, every = result.scrape_cpu_s, result.interval_s
    cores = os.cpu_count() or 1
    t.notes.append(
        f"server CPU per scrape (50 in a row after the blocks; {result.topics} topics, "
        f"{result.metrics_lines} sample lines): {per * 1000:.1f} ms, i.e. {per / every * 100:.2f}% "
        f"of one core at one scrape every {every:g} s ({per / every * 100 / cores:.2f}% "
        f"of the machine's {cores} cores)"
    )
    t.notes.append(
        f"{len(result.pairs)} pairs of blocks on one server, alternating which side goes first; a block "
        "is a produce from one client, a full replay and readCompacted loads of a compacted topic; "
        "the issue's bound is a slow-down of at most 2%"
    )
    return t


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    what: str
    goal: str
    measured: str
    met: bool | None  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return "not measured" if self.met is None else ("met" if self.met else "NOT met")


def targets(
    *,
    main: SizeResult | None,
    incremental: IncrementalResult | None,
    big: SizeResult | None,
    big_planned: bool,
    serving: ServingResult | None,
) -> Table:
    """The targets of issue 6, met or not from this run's figures."""
    from tests.benchmarks.measure import median

    rows: list[Target] = []
    standard = main is not None and main.spec.messages == 5_000_000 and main.spec.keys == 500_000
    where = "" if main is None or standard else f" (measured at {main.spec.label}, the target is at 5M/500k)"
    if main is not None and PROJECT in main.runs:
        proj = main.runs[PROJECT].median_s
        rate = main.messages / proj
        rows.append(
            Target(
                "full compaction 5M/500k: throughput" + where,
                ">= 1,500,000 msg/s",
                f"{f_int(rate)} msg/s",
                rate >= 1.5e6,
            )
        )
        if DUCKDB in main.runs:
            ratio = proj / main.runs[DUCKDB].median_s
            rows.append(
                Target(
                    "full compaction: project time / DuckDB time" + where, "<= 1.5x", f_x(ratio), ratio <= 1.5
                )
            )
        if PYTHON in main.runs:
            ratio = main.runs[PYTHON].median_s / proj
            rows.append(
                Target("full compaction: Python time / project time" + where, ">= 5x", f_x(ratio), ratio >= 5)
            )
    else:
        rows.append(Target("full compaction 5M/500k", "1.5M msg/s, <= 1.5x DuckDB, >= 5x Python", "-", None))
    if incremental is not None and PROJECT in incremental.runs:
        share = incremental.share(PROJECT)
        rows.append(
            Target(
                f"incremental round, +1% ({incremental.spec.label})",
                "<= 25% of the full round",
                f_pct(share),
                share <= 0.25,
            )
        )
    else:
        rows.append(Target("incremental round, +1%", "<= 25% of the full round", "-", None))
    if big is not None:
        peak = big.runs[PROJECT].max_peak
        assert peak is not None
        rows.append(
            Target(
                f"{big.spec.label} on this machine",
                "finishes without running out of memory",
                f"{f_s(big.runs[PROJECT].median_s)} s; peak driver RSS {f_mib(peak.peak_self)} MiB "
                f"+ Spark processes {f_mib(peak.peak_children)} MiB",
                True,
            )
        )
    else:
        rows.append(
            Target(
                "50M/5M on this machine",
                "finishes without running out of memory",
                "-" if not big_planned else "failed",
                None if not big_planned else False,
            )
        )
    if serving is not None:
        rows.append(
            Target(
                "produce in batches of 1,000 (1 client)",
                ">= 50,000 msg/s",
                f"{f_int(median(serving.produce_one))} msg/s",
                median(serving.produce_one) >= 50_000,
            )
        )
        rows.append(
            Target(
                f"produce in batches of 1,000 ({serving.params.threads} client threads)",
                ">= 50,000 msg/s",
                f"{f_int(median(serving.produce_threads))} msg/s",
                median(serving.produce_threads) >= 50_000,
            )
        )
        rows.append(
            Target(
                "consume, full log",
                ">= 100,000 msg/s",
                f"{f_int(median(serving.consume_full))} msg/s",
                median(serving.consume_full) >= 100_000,
            )
        )
        rows.append(
            Target(
                "consume, readCompacted",
                ">= 100,000 msg/s",
                f"{f_int(median(serving.consume_compacted))} msg/s",
                median(serving.consume_compacted) >= 100_000,
            )
        )
        rows.append(
            Target(
                "latest state: readCompacted vs full replay (10 versions per key)",
                ">= 5x faster",
                f_x(serving.load_speedup),
                serving.load_speedup >= 5,
            )
        )
    else:
        rows.append(Target("serving (produce, consume, latest state)", "see issue 6", "-", None))
    t = Table("Targets (issue 6)", ["target", "goal", "measured", "verdict"])
    for r in rows:
        t.add(r.what, r.goal, r.measured, r.verdict)
    return t


# --------------------------------------------------------------------------- plots


def scale_plot(results: Sequence[SizeResult], big: SizeResult | None, path: Path) -> Path:
    """Median time against messages, one line per compactor (log-log), saved as PNG."""
    from tests.benchmarks import plots

    points: dict[str, list[tuple[int, float]]] = {}
    for name in (PROJECT, DUCKDB, PYTHON):
        xy = [(r.messages, r.runs[name].median_s) for r in results if name in r.runs]
        if name == PROJECT and big is not None:
            xy.append((big.messages, big.runs[PROJECT].median_s))
        if xy:
            points[name] = xy
    return plots.scale(points, path, cores=os.cpu_count())


def shapes_plot(results: Sequence[ShapeResult], path: Path) -> Path:
    """The project's and DuckDB's median full round by shape, saved as PNG."""
    from tests.benchmarks import plots

    rows = [(r.shape.name, r.median(PROJECT), r.median(DUCKDB)) for r in results]
    return plots.shapes([(name, p, d, p / d) for name, p, d in rows], path)


# --------------------------------------------------------------------------- layers (issue 17)


def layers_tables(r: LayersResult) -> list[Table]:
    """The dirty-share sweep, the chain of 1% rounds, and the reader's cost of layers."""
    from tests.benchmarks.measure import median as med

    sweep = Table(
        f"Round time against dirty share: {r.spec.label} (in process)",
        ["new messages", "share", "delta round s", "share of full", "consolidating round s", "share of full"],
    )
    for p in r.sweep:
        d, c = med(p.delta_s), med(p.consolidate_s)
        sweep.rows.append(
            [
                f_int(p.messages),
                f"{100 * p.share:.1f}%",
                f_s(d),
                f_pct(d / r.full_s),
                f_s(c),
                f_pct(c / r.full_s),
            ]
        )
    sweep.notes.append(
        f"full round {f_s(r.full_s)} s; each point on the same base (the full round's output), new ledgers "
        "after it, the horizon placed to take the share; delta: the round adds a delta layer and deletion "
        "vectors; consolidating: `max_deltas=0`, the previous ledger's live rows copied into a new base "
        "(every incremental round before layers)"
    )
    chain = Table(
        f"A chain of 1% rounds: {r.spec.label}, max deltas {r.max_deltas}, consolidation ratio "
        f"{r.consolidation_ratio}",
        ["round", "s", "share of full", "kind", "layers after"],
    )
    for i, c in enumerate(r.chain, 1):
        chain.rows.append([str(i), f_s(c.seconds), f_pct(c.seconds / r.full_s), c.kind, str(c.layers)])
    if r.chain:
        mean = sum(c.seconds for c in r.chain) / len(r.chain)
        deltas = [c.seconds for c in r.chain if c.kind == "delta"]
        cons = [c.seconds for c in r.chain if c.kind != "delta"]
        chain.notes.append(
            f"mean round {f_s(mean)} s = {f_pct(mean / r.full_s)} of a full round; delta rounds median "
            f"{f_s(med(deltas)) if deltas else '-'} s, consolidations median "
            f"{f_s(med(cons)) if cons else '-'} s"
        )
    reader = Table(
        f"readCompacted scan of the ledger with {r.read_deltas} deltas: {r.spec.label}",
        ["ledger", "rows", "median s", "runs (s)", "rows/s"],
    )
    for name, runs in (("base + 5 deltas (deletion vectors)", r.read_layered_s), ("one base", r.read_base_s)):
        if runs:
            reader.rows.append(
                [
                    name,
                    f_int(r.read_rows),
                    f_s(med(runs)),
                    " / ".join(f_s(x) for x in runs),
                    f_int(r.read_rows / med(runs)),
                ]
            )
    if r.read_layered_s and r.read_base_s:
        reader.notes.append(
            f"layered / one base: {f_x(med(r.read_layered_s) / med(r.read_base_s))}; pages of 1,000 from the "
            "start through `CompactedLedger.read`, the service's readCompacted path below HTTP; "
            "the same live rows"
        )
    return [sweep, chain, reader]


def layers_plot(r: LayersResult, path: Path) -> Path:
    """Round time against dirty share: delta rounds, consolidating rounds, the full round."""
    from tests.benchmarks import plots
    from tests.benchmarks.measure import median as med

    return plots.dirty_share(
        [100 * p.share for p in r.sweep],
        [med(p.delta_s) for p in r.sweep],
        [med(p.consolidate_s) for p in r.sweep],
        r.full_s,
        r.spec.label,
        path,
    )


def big_increment_table(big: SizeResult, seconds: Sequence[float]) -> Table:
    from tests.benchmarks.measure import median as med

    full = big.runs[PROJECT].median_s
    t = Table(
        f"Big: +1% on {big.spec.label} (project, a delta round on the full round's output)",
        ["full round s", "+1% round s", "runs (s)", "share of full"],
    )
    t.rows.append(
        [
            f_s(full),
            f_s(med(list(seconds))),
            " / ".join(f_s(x) for x in seconds),
            f_pct(med(list(seconds)) / full),
        ]
    )
    return t


def service_rounds_table(r: ServiceRoundsResult) -> Table:
    p = r.params
    t = Table(
        f"Rounds through a real `compactor serve`: {p.messages / 1e6:g}M/{p.keys / 1e3:g}k, "
        f"then +{100 * p.increment:g}%",
        [
            "round",
            "service ms (durationMs)",
            "phase one ms",
            "phase two ms",
            "client s",
            "in process s",
            "service / in process",
            "layers",
        ],
    )
    for name, rows in (("full", r.full), ("incremental", r.incremental)):
        for i, f in enumerate(rows, 1):
            t.rows.append(
                [
                    f"{name} {i}",
                    f_int(f.duration_ms),
                    f_int(f.phase_one_ms),
                    f_int(f.phase_two_ms),
                    f_s(f.client_s),
                    f_s(f.in_process_s),
                    f_x(f.duration_ms / 1000 / f.in_process_s),
                    "+".join(f.layers),
                ]
            )
    if r.full and r.incremental:
        t.notes.append(
            f"median full round: service {f_int(r.full_ms)} ms, in process {f_s(r.full_in_process_s)} s "
            f"({f_x(r.full_ms / 1000 / r.full_in_process_s)}); median incremental round: service "
            f"{f_int(r.incremental_ms)} ms = {f_pct(r.incremental_ms / r.full_ms)} of the service's full "
            "round, "
            f"in process {f_s(r.incremental_in_process_s)} s = "
            f"{f_pct(r.incremental_in_process_s / r.full_in_process_s)} of the in-process full round"
        )
    t.notes.append(
        f"produced through the REST API from 4 threads at {f_int(r.produce_msgs_per_s)} msg/s "
        f"(batches of 1,000, {p.value_bytes}-byte values, 5% deletes), one fresh topic per full round; "
        "a round is triggered with `PUT .../compaction` and its figures are the service's own "
        "(`compactionRuns`: roll-over, planning, both phases, the metadata commit); in process: "
        "`TwoPhaseCompactor` on the same sealed ledgers right after, on the benchmark's warm "
        "SparkSession, chained the same way"
    )
    return t


def partitions_table(r: PartitionsResult) -> Table:
    """A partitioned topic's full and +1% rounds: in one Spark job against one after another."""
    from tests.benchmarks.measure import median as med

    t = Table(
        f"A topic of {r.partitions} partitions: every partition in one Spark job, or one after another",
        ["round", "one job s", "one after another s", "one job / one after another"],
    )
    for name, one, each in (
        ("full", r.one_job_s, r.per_partition_s),
        ("+1% of every partition", r.delta_one_job_s, r.delta_per_partition_s),
    ):
        t.add(
            name,
            f"{f_s(med(one))} ({' / '.join(f_s(x) for x in one)})",
            f"{f_s(med(each))} ({' / '.join(f_s(x) for x in each)})",
            f_x(med(one) / med(each)),
        )
    t.notes.append(
        f"{f_int(r.messages)} messages over {f_int(r.keys)} keys in all, spread evenly over the "
        f"partitions (each a topic of its own); in process on the warm SparkSession; medians of "
        f"the runs shown, the order of the two ways alternating, after one unmeasured round of each"
    )
    t.notes.append(
        f"Spark jobs of one full round: {', '.join(f'{k} {v}' for k, v in r.jobs.items())}; "
        f"outputs checked equal, partition by partition ({f_int(r.rows)} rows)"
    )
    return t


# --------------------------------------------------------------------------- Apache Pulsar (issue 48)


def vs_pulsar_tables(r: VsPulsarResult) -> list[Table]:
    """One table per durability mode: the same pulsar-perf runs against Apache Pulsar and against
    the service (see ``tests.benchmarks.vs_pulsar``)."""
    p = r.params
    tables = []
    for mode, brokers in r.modes.items():
        pulsar, service = brokers.get("Pulsar"), brokers.get("service")
        how = (
            "durable (Pulsar's journal synced; COMPACTOR_FSYNC=always)"
            if mode == "durable"
            else "not durable (Pulsar's shipped standalone.conf; COMPACTOR_FSYNC=never)"
        )
        t = Table(
            f"Apache Pulsar {r.version} and `compactor serve` under pulsar-perf, {how}",
            [
                "measure",
                "Pulsar",
                "service",
                "service/Pulsar",
                "load before (Pulsar / service)",
                "others' CPU (Pulsar / service)",
            ],
        )

        def rate(x: Run) -> float:
            return x.acked_rate

        def p50(x: Run) -> float:
            return x.p50_ms

        def p99(x: Run) -> float:
            return x.p99_ms

        # label, run, figure, format, the fixed rate the run was asked for (latency rows)
        rows: list[tuple[str, str, Callable[[Run], float], Callable[[float], str], int]] = [
            ("produce, 1 producer (msg/s)", "produce-1", rate, f_int, 0),
            ("produce, 4 producers (msg/s)", "produce-4", rate, f_int, 0),
            ("consume from earliest (msg/s)", "consume", rate, f_int, 0),
        ]
        for at in p.latency_rates:
            rows.append((f"publish latency p50 at {at:,} msg/s (ms)", f"latency-{at}", p50, f2, at))
            rows.append((f"publish latency p99 at {at:,} msg/s (ms)", f"latency-{at}", p99, f2, at))
        rows += [
            ("broker CPU s per million produced, 1 producer", "produce-1", Run.cpu_per_million, f2, 0),
            ("broker CPU s per million produced, 4 producers", "produce-4", Run.cpu_per_million, f2, 0),
            ("broker CPU s per million consumed", "consume", Run.cpu_per_million, f2, 0),
        ]

        def run_of(side: BrokerRuns | None, what: str) -> Run | None:
            found = side.runs.get(what) if side is not None else None
            return found if found is not None and found.error is None else None

        def load(x: Run | None) -> str:
            return f"{x.load[0]:.2f}" if x is not None else "-"

        def others(x: Run | None) -> str:
            if x is None or x.wall_s <= 0:
                return "-"
            return f_pct(max(0.0, x.others_cpu_s) / (x.wall_s * r.cores))

        behind = False
        for label, what, figure, fmt, asked in rows:
            a, b = run_of(pulsar, what), run_of(service, what)
            cells = []
            values = []
            for x in (a, b):
                v = figure(x) if x is not None else math.nan
                values.append(v)
                cell = "-" if math.isnan(v) else fmt(v)
                if x is not None and asked and x.messages < 0.95 * asked * p.seconds:
                    cell += " *"
                    behind = True
                cells.append(cell)
            va, vb = values
            ratio = f_x(vb / va) if va and not math.isnan(va) and not math.isnan(vb) else "-"
            t.add(label, *cells, ratio, f"{load(a)} / {load(b)}", f"{others(a)} / {others(b)}")
        t.notes.append(
            "service/Pulsar: > 1 = the service faster for throughput; for latency and CPU, < 1 = the "
            "service better. One run each, Pulsar first, then the service, each fresh on an empty data dir"
        )
        if behind:
            t.notes.append(
                "*: the broker fell behind the fixed rate: under 95% of the messages sent were acknowledged "
                "by the end (pulsar-perf sends at the rate whatever the acknowledgements: its queue grew, "
                "and the latency with it)"
            )
        t.notes.append(
            f"pulsar-perf (Java client): {p.value_bytes}-byte values, batching on (1 ms, up to 1,000 "
            f"messages), no keys; produce as fast as it goes and at fixed rates for {p.seconds} s each; "
            "latency: send to acknowledgement, pulsar-perf's Aggregated p50/p99; produce msg/s: messages "
            "acknowledged over the sending plus the longest latency (the last acknowledgement came within "
            "it: a lower bound), or over pulsar-perf's Aggregated time if shorter (from the client's start "
            "to the first tick of its 10 s clock after the end; its rate is below); consume: a new "
            "subscription from earliest on the 1-producer topic reading all of it, msg/s from the first "
            "message to the last"
        )
        t.notes.append(
            f"load before: the 1-minute load average as each run started ({r.cores} cores; the broker and "
            "pulsar-perf alone make about 2 at full speed); others' CPU: the machine's busy time during the "
            "run that was not the broker's, pulsar-perf's or the harness's, as a share of all cores"
        )
        for side in (pulsar, service):
            if side is None:
                continue
            facts = [f"ready in {side.ready_s:.0f} s" if not math.isnan(side.ready_s) else "not started"]
            client = []
            busy = []
            for what, x in side.runs.items():
                if x.error is not None:
                    facts.append(f"{what} FAILED: {x.error}")
                    continue
                part = f"{what} {f_int(x.messages)} messages in {x.window_s:.1f} s"
                if what != "consume":
                    part += f" + {x.max_ms / 1000:.1f} s, {f_int(x.acked_rate)} msg/s"
                part += f" (Aggregated {f_int(x.rate)}"
                if x.intervals:
                    part += "; every 10 s: " + " / ".join(f_int(v) for v in x.intervals)
                part += ")"
                facts.append(part)
                if not what.startswith("latency-") and x.messages:
                    client.append(f"{what} {x.client_cpu_s / x.messages * 1e6:.2f}")
                    if x.wall_s > 0:
                        cores = (x.broker_cpu_s / x.wall_s, x.client_cpu_s / x.wall_s)
                        busy.append(f"{what} {sum(cores):.2f} ({cores[0]:.2f} + {cores[1]:.2f})")
            if client:
                facts.append("pulsar-perf's own CPU s per million: " + ", ".join(client))
            if busy:
                lead = f"cores busy over the run's wall time, broker + pulsar-perf (of {r.cores}): "
                facts.append(lead + ", ".join(busy))
            if side.error is not None:
                facts.append(f"FAILED: {side.error}")
            t.notes.append(f"{side.name}: " + "; ".join(facts))
        tables.append(t)
    return tables
