"""Layered compacted ledgers in process (issue 17): what a round costs against its dirty share,
what a chain of 1% rounds costs with consolidation, and what layers cost a reader.

- sweep: on a full round's output (the base), new messages of several shares of the topic
  (one set of new ledgers, the round's horizon placed to take the share), each compacted twice
  on the same base: as a delta round, and as a consolidating round (``max_deltas=0``: the
  previous ledger's live rows copied into a new base, which is what every incremental round did
  before layers). Medians of ``runs``.
- chain: ``rounds`` consecutive rounds of +1% each with the service's default bounds
  (``COMPACTOR_COMPACTION_MAX_DELTAS``, ``COMPACTOR_COMPACTION_CONSOLIDATION_RATIO``): each
  round's time and whether it added a delta or consolidated, and the mean share of a full round.
- reader: a readCompacted-style scan (pages of 1,000 from the start, as a consumer reads) of
  the chain's ledger when it has 5 deltas, against the same live rows consolidated into one base.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from compactor import CompactionJob, CompactionResult, TwoPhaseCompactor
from ledger.compacted_store import CompactedLedger
from ledger.entry import Position
from ledger.storage import StoragePath
from tests.benchmarks.measure import median
from tests.benchmarks.workload import Workload, WorkloadSpec, generate, key_dictionary

SHARES = (0.001, 0.005, 0.01, 0.02, 0.05, 0.10)


@dataclass
class SweepPoint:
    share: float
    messages: int
    delta_s: list[float] = field(default_factory=list)
    consolidate_s: list[float] = field(default_factory=list)


@dataclass
class ChainRound:
    seconds: float
    layers: int
    kind: str  # "delta" or "consolidation"


@dataclass
class LayersResult:
    spec: WorkloadSpec
    full_s: float
    sweep: list[SweepPoint] = field(default_factory=list)
    chain: list[ChainRound] = field(default_factory=list)
    read_layered_s: list[float] = field(default_factory=list)
    read_base_s: list[float] = field(default_factory=list)
    read_rows: int = 0
    read_deltas: int = 0
    max_deltas: int = 8
    consolidation_ratio: float = 0.5


def _job(
    w: Workload,
    ledgers: list[tuple[int, Path]],
    horizon: Position,
    out: int,
    previous: CompactionResult | None,
    **kw: object,
) -> CompactionJob:
    return CompactionJob(
        topic_root=w.topic_root,
        inputs=[p for _, p in ledgers],
        input_ledger_ids=[i for i, _ in ledgers],
        previous_compacted=previous.directory if previous else None,
        previous_horizon=previous.horizon if previous else None,
        horizon=horizon,
        output_ledger_id=out,
        **kw,  # type: ignore[arg-type]
    )


def _scan(ledger: CompactedLedger, page: int = 1000) -> tuple[int, float]:
    gc.collect()  # a collection owed by earlier work is not the scan's
    t0 = time.perf_counter()
    n = 0
    at: Position | None = Position(0, 0)
    while at is not None:
        entries, at = ledger.read(at, page)
        n += len(entries)
    return n, time.perf_counter() - t0


def _more(w: Workload, messages: int, first_ledger_id: int) -> Workload:
    spec = w.spec
    add = WorkloadSpec(
        messages=messages,
        keys=spec.keys,
        value_bytes=spec.value_bytes,
        tombstone_share=spec.tombstone_share,
        entries_per_ledger=spec.entries_per_ledger,
        seed=spec.seed,
    )
    return generate(w.topic_root, add, first_ledger_id=first_ledger_id, key_dict=key_dictionary(spec.keys))


def run(
    spark: object,
    w: Workload,
    full_s: float,
    *,
    runs: int,
    chain_rounds: int = 12,
    max_deltas: int = 8,
    consolidation_ratio: float = 0.5,
    log: Callable[[str], None] = print,
) -> LayersResult:
    """The three measurements on workload ``w`` (its original ledgers), whose full round took
    ``full_s`` (median)."""
    compactor = TwoPhaseCompactor(spark)  # type: ignore[arg-type]
    result = LayersResult(w.spec, full_s, max_deltas=max_deltas, consolidation_ratio=consolidation_ratio)
    out = 1_500_000_000

    def fresh() -> int:
        nonlocal out
        out += 1
        return out

    base = compactor.compact(_job(w, list(w.ledgers), w.horizon, fresh(), None))

    # ---------------------------------------------------------------- sweep
    biggest = int(w.messages * max(SHARES))
    extra = _more(w, biggest, w.ledgers[-1][0] + 1)
    ledgers = [*w.ledgers, *extra.ledgers]
    per_ledger = w.spec.entries_per_ledger
    for share in SHARES:
        n = max(1, int(w.messages * share))
        first = extra.ledgers[0][0]
        horizon = Position(first + (n - 1) // per_ledger, (n - 1) % per_ledger)
        point = SweepPoint(share, n)
        for i in range(runs + 1):  # the first is a warm-up
            for kind, kw in (
                ("delta", {"max_deltas": 64, "consolidation_ratio": 1.0}),
                ("consolidate", {"max_deltas": 0}),
            ):
                t0 = time.perf_counter()
                r = compactor.compact(_job(w, ledgers, horizon, fresh(), base, **kw))
                seconds = time.perf_counter() - t0
                if i:
                    (point.delta_s if kind == "delta" else point.consolidate_s).append(seconds)
                r.directory.delete_tree()
        log(
            f"layers: +{share:.1%} ({n:,} messages): delta {median(point.delta_s):.2f} s, "
            f"consolidating {median(point.consolidate_s):.2f} s (full {full_s:.2f} s)"
        )
        result.sweep.append(point)
    for _, p in extra.ledgers:
        p.unlink()

    # ---------------------------------------------------------------- chain
    previous = base
    made: list[StoragePath] = []
    step = max(1, int(w.messages * 0.01))
    next_ledger = w.ledgers[-1][0] + 1
    chain_ledgers = list(w.ledgers)
    five_deltas: CompactionResult | None = None
    for i in range(chain_rounds):
        more = _more(w, step, next_ledger)
        next_ledger = more.ledgers[-1][0] + 1
        chain_ledgers.extend(more.ledgers)
        t0 = time.perf_counter()
        r = compactor.compact(
            _job(
                w,
                chain_ledgers,
                more.horizon,
                fresh(),
                previous,
                max_deltas=max_deltas,
                consolidation_ratio=consolidation_ratio,
            )
        )
        seconds = time.perf_counter() - t0
        kind = "delta" if r.manifest.deltas > 0 else "consolidation"
        result.chain.append(ChainRound(seconds, len(r.manifest.layers), kind))
        log(f"layers: chain round {i + 1}: {seconds:.2f} s, {kind}, {len(r.manifest.layers)} layers")
        made.append(r.directory)
        previous = r
        if r.manifest.deltas == 5 and five_deltas is None:
            five_deltas = r
            # ------------------------------------------------------------ reader
            same = compactor.compact(_job(w, chain_ledgers, more.horizon, fresh(), base, max_deltas=0))
            for _ in range(max(5, runs)):  # short scans: more runs against the noise
                n, s = _scan(CompactedLedger(r.directory))
                result.read_layered_s.append(s)
                m, s2 = _scan(CompactedLedger(same.directory))
                result.read_base_s.append(s2)
                assert n == m, (n, m)
            result.read_rows = n
            result.read_deltas = 5
            log(
                f"layers: read {n:,} rows: 5 deltas {median(result.read_layered_s):.2f} s, "
                f"one base {median(result.read_base_s):.2f} s"
            )
            same.directory.delete_tree()
    for d in [*made, base.directory]:
        d.delete_tree()
    return result


def increment(
    spark: object, w: Workload, previous: Path, *, share: float = 0.01, runs: int = 1
) -> list[float]:
    """Seconds of ``runs`` delta rounds of ``share`` x ``w``'s messages on top of the compacted
    ledger ``previous`` (``w``'s full round, horizon ``w.horizon``), each on the same base."""
    compactor = TwoPhaseCompactor(spark)  # type: ignore[arg-type]
    more = _more(w, max(1, int(w.messages * share)), w.ledgers[-1][0] + 1)
    ledgers = [*w.ledgers, *more.ledgers]
    out: list[float] = []
    for i in range(runs):
        job = CompactionJob(
            topic_root=w.topic_root,
            inputs=[p for _, p in ledgers],
            input_ledger_ids=[n for n, _ in ledgers],
            previous_compacted=previous,
            previous_horizon=w.horizon,
            horizon=more.horizon,
            output_ledger_id=1_600_000_000 + i,
        )
        t0 = time.perf_counter()
        r = compactor.compact(job)
        out.append(time.perf_counter() - t0)
        assert r.manifest.deltas == 1, r.manifest
        r.directory.delete_tree()
    return out
