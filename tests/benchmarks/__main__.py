"""``python -m tests.benchmarks [--quick] [--only ...] [--runs N] [--out BENCHMARKS.md]``

Sections (``--only`` takes a comma-separated subset; default all):

- ``compaction``: full compaction of 5M messages / 500k keys (quick: 1M/100k) by the project's
  ``TwoPhaseCompactor``, DuckDB and a plain Python compactor; outputs checked equal.
- ``incremental``: 1% more messages, compacted again on top of each first round.
- ``layers``: layered compacted ledgers (issue 17) on the main workload: round time against the
  dirty share (delta and consolidating rounds, plus a PNG plot), a chain of 1% rounds with
  consolidation, and a readCompacted scan of a ledger with 5 deltas against one base.
- ``rounds``: compaction rounds through a real ``compactor serve`` (REST trigger, then the
  round's ``compactionRuns`` figures), full and +1%, each against the same round in process.
- ``scale``: 1M/100k, 5M/500k, 20M/2M (quick: 200k/20k, 1M/100k), the three compactors,
  plus a PNG plot (with 50M/5M when ``big`` ran too).
- ``big``: 50M/5M, the project only, once (not in quick mode).
- ``shapes``: a full round on differently shaped data (long keys with properties, big values,
  keyless messages, skewed, unique and few keys; ``tests.benchmarks.shapes``), 2M messages
  each (quick: 200k), the project against DuckDB, plus a PNG plot; ``--shapes`` picks some by name.
- ``partitions``: a topic of 16 partitions (2M messages in all; quick: 4 x 50k), full and +1%
  rounds: every partition in one Spark job against one job per partition, outputs compared.
- ``serving``: a real ``compactor serve``: produce, latency, consume, latest-state load.
- ``wire``: Pulsar's binary protocol through the official ``pulsar-client`` beside REST
  (``tests/benchmarks/wire.py``).
- ``tls``: TLS's cost: wire and REST produce, consume and latency over the plain ports beside the
  TLS ports of one server (``tests/benchmarks/wire_tls.py``).
- ``storage``: ledgers on object storage against local disk (issue 31): a ``compactor serve`` on
  its data dir and one on the S3 bucket of ``.ci/s3`` (``COMPACTOR_TEST_S3_SETTINGS``), the same
  5M/500k workload (quick: 500k/50k) on both: produce, full and +1% rounds, readCompacted and
  full-log consume (``tests/benchmarks/storage.py``).
- ``instances``: several ``compactor serve`` on one PostgreSQL (``.ci/postgres``): produce
  throughput through two instances against one, and the takeover time after kill -9 of an owner.
- ``shared``: consume throughput of 4 Shared consumers against 1 Exclusive, on a real server.
- ``cluster``: the project's compactor on a two-Worker Spark standalone cluster started from
  the pyspark wheel against ``local[*]``, on the main workload (full and incremental rounds).
- ``scrape``: produce and consume on one server in blocks without and with a scraper of
  ``/metrics`` every second (``--scrape-pairs`` pairs of blocks, alternating which goes first);
  not part of the default run.
- ``vs-pulsar``: Apache Pulsar 4.0.7 (assembled from Maven Central, standalone on loopback) and a
  real ``compactor serve``, one after the other, under Pulsar's pulsar-perf: produce with 1 and 4
  producers, consume from earliest, publish latency at 10,000 and 50,000 msg/s, each broker's CPU
  per million messages; durable and not (``--vs-pulsar-durability``), ``--vs-pulsar-seconds`` a
  run (default 30; quick 10) (``tests/benchmarks/vs_pulsar.py``); only when named in ``--only``.
- ``tables``: compacted topics as Iceberg tables (issue 52) through a real ``compactor serve``:
  the table commit's share of a full and of a +1% round (5M/500k; quick: 500k/50k), the latest
  state read by DuckDB over the table against a readCompacted consumer over the wire, and a
  point lookup by SQL (``tests/benchmarks/tables.py``).
- ``soak``: a real ``compactor serve`` for 3 minutes of produce, a full and a readCompacted
  consumer and a compaction every 5 s: its descriptors and RSS over time (with ``--quick``
  only when named in ``--only``, then 90 s).

Every table goes to stdout as it is ready, progress to stderr. The output file (default
``BENCHMARKS.md`` at the repository root) keeps today's figures, one section per area
(``tests.benchmarks.document``): a run replaces the blocks of the sections it measured, each
stamped with its command, the machine, the date and the commit, and keeps every other block as
the file has it. Plots go to ``docs/img/`` beside the output file. The targets of issue 6 are
printed, not written. A size measured by one section is reused by the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.benchmarks import document, report
from tests.benchmarks.report import Table
from tests.benchmarks.runner import IncrementalResult, SizeResult, log
from tests.benchmarks.serving import ServingResult
from tests.benchmarks.workload import WorkloadSpec

SECTIONS = (
    "compaction",
    "incremental",
    "layers",
    "scale",
    "big",
    "shapes",
    "partitions",
    "serving",
    "wire",
    "tls",
    "rounds",
    "storage",
    "instances",
    "shared",
    "cluster",
    "scrape",
    "soak",
    "vs-pulsar",
    "tables",
)
# Sections that run only when named in --only (minutes each, or a yardstick rather than a figure).
ON_REQUEST = {"scrape", "vs-pulsar"}
REPO_ROOT = Path(__file__).resolve().parents[2]

MAIN = WorkloadSpec(5_000_000, 500_000)
MAIN_QUICK = WorkloadSpec(1_000_000, 100_000)
SCALE = [
    WorkloadSpec(1_000_000, 100_000),
    WorkloadSpec(5_000_000, 500_000),
    WorkloadSpec(20_000_000, 2_000_000),
]
SCALE_QUICK = [WorkloadSpec(200_000, 20_000), WorkloadSpec(1_000_000, 100_000)]
BIG = WorkloadSpec(50_000_000, 5_000_000)
WARM_UP = WorkloadSpec(20_000, 2_000)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, two runs each: under two minutes")
    p.add_argument("--only", default="", help=f"comma-separated sections: {','.join(SECTIONS)}")
    p.add_argument("--runs", type=int, default=0, help="runs per measurement (default 3; quick 2)")
    p.add_argument(
        "--serving-auth",
        choices=("off", "both"),
        default="both",
        help="serving with authentication off only, or off and on side by side (default)",
    )
    p.add_argument(
        "--warmups", type=int, default=1, help="unmeasured rounds before the runs of each size (default 1)"
    )
    p.add_argument("--scrape-pairs", type=int, default=8, help="scrape: pairs of blocks (default 8)")
    p.add_argument(
        "--rounds-messages",
        type=int,
        default=0,
        help="rounds: messages per topic, keys a tenth of them (default 5M; quick 1M)",
    )
    p.add_argument(
        "--vs-pulsar-seconds",
        type=int,
        default=0,
        help="vs-pulsar: seconds of each pulsar-perf run (default 30; quick 10)",
    )
    p.add_argument(
        "--vs-pulsar-durability",
        choices=("both", "durable", "non-durable"),
        default="both",
        help="vs-pulsar: Pulsar's journal synced against COMPACTOR_FSYNC=always (durable), Pulsar's "
        "shipped standalone.conf against COMPACTOR_FSYNC=never (non-durable), or both (default)",
    )
    p.add_argument("--shapes", default="", help="shapes: comma-separated shape names (default all)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "BENCHMARKS.md", help="the Markdown report")
    p.add_argument("--driver-memory", default="", help="Spark driver memory (default 8g; 12g with big)")
    p.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a new temp dir)")
    p.add_argument("--keep-work-dir", action="store_true", help="do not delete the scratch directory")
    p.add_argument(
        "--spark-profile",
        action="store_true",
        help="write Spark's event log and report the stages of each compaction",
    )
    args = p.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()} or set(SECTIONS) - ON_REQUEST
    unknown = only - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.quick:
        only.discard("big")
        if not args.only:  # the soak takes minutes: in quick mode only when asked for
            only.discard("soak")
    args.sections = only
    args.out = args.out.resolve()  # plots are linked relative to it
    if args.runs < 0 or args.warmups < 0 or args.vs_pulsar_seconds < 0:
        p.error("--runs, --warmups and --vs-pulsar-seconds must not be negative")
    args.runs = args.runs or (2 if args.quick else 3)
    return args


# What a run found, by block of BENCHMARKS.md (``tests.benchmarks.document.BLOCKS``): tables, and
# lines of Markdown (plots).
Found = dict[str, list[Table | str]]


def plot_line(alt: str, path: Path, out: Path) -> str:
    """A plot's Markdown, its path relative to the report."""
    return f"![{alt}]({path.relative_to(out.parent).as_posix()})"


def emit(table: Table, tables: Found, block: str) -> None:
    tables.setdefault(block, []).append(table)
    print(table.text(), "\n", flush=True)


def run_compaction(
    args: argparse.Namespace, work_dir: Path, tables: Found
) -> tuple[
    SizeResult | None, IncrementalResult | None, SizeResult | None, list[SizeResult], dict[int, str], str, str
]:
    """The compaction, incremental, scale and big sections on one warm SparkSession."""
    from compactor.spark import get_spark, stop_spark
    from compactor.warmup import warm_up_jit
    from tests.benchmarks.compactors import DuckDBCompactor, ProjectCompactor, PythonCompactor
    from tests.benchmarks.runner import Bench

    sections = args.sections
    driver_memory = args.driver_memory or ("12g" if "big" in sections else "8g")
    extra = None
    if args.spark_profile:
        from tests.benchmarks.spark_profile import enable_conf

        extra = enable_conf(work_dir / "spark-events")
    log(f"starting Spark (driver memory {driver_memory})")
    spark = get_spark(driver_memory=driver_memory, extra_conf=extra)
    spark_version = spark.version
    project, duck, py = ProjectCompactor(spark), DuckDBCompactor(), PythonCompactor()
    bench = Bench(work_dir, [project, duck, py], runs=args.runs, warmups=args.warmups)
    main: SizeResult | None = None
    inc: IncrementalResult | None = None
    big: SizeResult | None = None
    scale: list[SizeResult] = []
    done: dict[tuple[int, int], SizeResult] = {}
    try:
        log("warming up: one small round of every compactor, and Spark's JIT as the service does")
        bench.warm_up(WARM_UP)
        warm_up_jit(spark)
        spec = MAIN_QUICK if args.quick else MAIN
        if sections & {"compaction", "incremental", "layers"}:
            main, w, last = bench.full_round(spec, keep="incremental" in sections)
            done[(spec.messages, spec.keys)] = main
            emit(report.compaction_table(main, f"Full compaction: {spec.label}"), tables, "compaction")
            if "incremental" in sections:
                inc = bench.incremental(main, w, last)
                emit(report.incremental_table(inc), tables, "incremental")
            if "layers" in sections:
                from tests.benchmarks import layers

                found = layers.run(spark, w, main.runs[project.name].median_s, runs=args.runs, log=log)
                for table in report.layers_tables(found):
                    emit(table, tables, "layers")
                path = report.layers_plot(found, args.out.parent / document.PLOTS / "dirty-share.png")
                tables["layers"].append(plot_line("round time against dirty share", path, args.out))
            bench.drop(w)
        if "scale" in sections:
            for s in SCALE_QUICK if args.quick else SCALE:
                found = done.get((s.messages, s.keys))
                if found is None:
                    found, w, _ = bench.full_round(s)
                    bench.drop(w)
                    done[(s.messages, s.keys)] = found
                scale.append(found)
                emit(report.compaction_table(found, f"Scale point: {s.label}"), tables, "scale-points")
            emit(report.scale_table(scale), tables, "scale")
        if "shapes" in sections:
            from tests.benchmarks import shapes

            base = shapes.QUICK_BASE if args.quick else shapes.BASE
            wanted = {n.strip() for n in args.shapes.split(",") if n.strip()}
            chosen = [s for s in shapes.shapes(base) if not wanted or s.name in wanted]
            found_shapes = shapes.run(
                bench,
                [project, duck],
                chosen,
                runs=args.runs,
                warmups=args.warmups,
                keep=args.keep_work_dir,
                log=log,
            )
            emit(report.shapes_table(found_shapes), tables, "shapes")
            if found_shapes:
                path = report.shapes_plot(found_shapes, args.out.parent / document.PLOTS / "shapes.png")
                tables["shapes"].append(plot_line("a full round by shape of data", path, args.out))
        if "partitions" in sections:
            from tests.benchmarks import partitions

            found_parts = partitions.run(
                spark,
                work_dir,
                partitions=4 if args.quick else 16,
                messages=200_000 if args.quick else 2_000_000,
                keys=20_000 if args.quick else 200_000,
                runs=args.runs,
                log=log,
            )
            emit(report.partitions_table(found_parts), tables, "partitions")
        if "big" in sections:
            big, w, last = bench.full_round(BIG, runs=1, warmups=0, compactors=[project], keep=True)
            emit(report.big_table(big), tables, "big")
            if "layers" in sections:  # and the +1% round on top of it (issue 17)
                from tests.benchmarks import layers

                seconds = layers.increment(spark, w, last[project.name].directory)
                emit(report.big_increment_table(big, seconds), tables, "big-layers")
            bench.drop(w)
    finally:
        stop_spark()
    return main, inc, big, scale, bench.labels, spark_version, driver_memory


def run_scrape_pairs(args: argparse.Namespace, work_dir: Path) -> Table:
    """Produce and consume on one server in blocks without and with a scraper, alternating."""
    from tests.benchmarks.scrape import ScrapeBench
    from tests.benchmarks.serving import ServingParams

    params = ServingParams.quick(runs=1) if args.quick else ServingParams(batches=100, runs=1)
    bench = ScrapeBench(work_dir / "scrape", params, pairs=args.scrape_pairs, log=log)
    return report.scrape_table(bench.run())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    started = time.perf_counter()
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="compactor-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    header_load = os.getloadavg()
    started_at = document.now()
    tables: Found = {}
    failures: list[str] = []
    main_r: SizeResult | None = None
    inc: IncrementalResult | None = None
    big: SizeResult | None = None
    scale: list[SizeResult] = []
    serving: ServingResult | None = None
    labels: dict[int, str] = {}
    spark_version = duckdb_version = "-"
    driver_memory = "-"
    import duckdb
    import pyspark

    spark_version, duckdb_version = pyspark.__version__, duckdb.__version__
    try:
        # Serving first: its client runs in this process, which the compaction sections leave
        # with a large heap (and a machine with gigabytes of fresh files); a consumer of the
        # service would not carry either.
        if "serving" in args.sections:
            from tests.benchmarks.serving import ServingBench, ServingParams, compare_authentication

            params = ServingParams.quick(runs=args.runs) if args.quick else ServingParams(runs=args.runs)
            log("serving: starting `compactor serve`")
            try:
                if args.serving_auth == "both":
                    serving, secured = compare_authentication(work_dir, params, log=log)
                    emit(report.serving_table(serving), tables, "serving")
                    emit(report.authentication_table(serving, secured), tables, "serving")
                else:
                    serving = ServingBench(work_dir, params, log=log).run()
                    emit(report.serving_table(serving), tables, "serving")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"serving benchmark failed: {type(e).__name__}: {e}")
        if "wire" in args.sections:
            from tests.benchmarks.wire import WireBench, WireParams, wire_table

            log("wire: starting `compactor serve` for Pulsar's binary protocol")
            try:
                wparams = WireParams.quick(runs=args.runs) if args.quick else WireParams(runs=args.runs)
                emit(wire_table(WireBench(work_dir, wparams, log=log).run()), tables, "wire")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"wire benchmark failed: {type(e).__name__}: {e}")
        if "tls" in args.sections:
            from tests.benchmarks.wire_tls import TlsBench, TlsParams, tls_table

            log("tls: starting `compactor serve` with its TLS ports")
            try:
                tparams = TlsParams.quick(runs=args.runs) if args.quick else TlsParams(runs=args.runs)
                emit(tls_table(TlsBench(work_dir, tparams, log=log).run()), tables, "tls")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"tls benchmark failed: {type(e).__name__}: {e}")
        if "instances" in args.sections:
            from tests.benchmarks.instances import InstancesBench, InstancesParams, instances_table

            log("instances: several `compactor serve` on PostgreSQL")
            try:
                iparams = InstancesParams.quick() if args.quick else InstancesParams(runs=args.runs)
                emit(instances_table(InstancesBench(work_dir, iparams, log=log).run()), tables, "instances")
            except Exception as e:
                traceback.print_exc()
                failures.append(f"instances benchmark failed: {type(e).__name__}: {e}")
        if "shared" in args.sections:
            from tests.benchmarks.shared import SharedBench, SharedParams, shared_table

            log("shared: starting `compactor serve`")
            try:
                shared_params = SharedParams(runs=args.runs)
                if args.quick:
                    shared_params = SharedParams.quick(runs=args.runs)
                emit(shared_table(SharedBench(work_dir, shared_params, log=log).run()), tables, "shared")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"shared benchmark failed: {type(e).__name__}: {e}")
        if "scrape" in args.sections:
            emit(run_scrape_pairs(args, work_dir), tables, "scrape")
        if "soak" in args.sections:
            from tests.benchmarks.soak import SoakBench, SoakParams, soak_table

            log("soak: starting `compactor serve`")
            try:
                soak_params = SoakParams.quick() if args.quick else SoakParams()
                soaked = SoakBench(work_dir, soak_params, log=log).run()
                emit(soak_table(soaked), tables, "soak")
            except Exception as e:
                traceback.print_exc()
                failures.append(f"soak benchmark failed: {type(e).__name__}: {e}")
        if "vs-pulsar" in args.sections:
            from tests.benchmarks.vs_pulsar import MODES, VsPulsarBench, VsPulsarParams

            modes = MODES if args.vs_pulsar_durability == "both" else (args.vs_pulsar_durability,)
            vparams = VsPulsarParams.quick(modes) if args.quick else VsPulsarParams(modes=modes)
            if args.vs_pulsar_seconds:
                vparams = dataclasses.replace(vparams, seconds=args.vs_pulsar_seconds)
            log(f"vs-pulsar: Apache Pulsar and `compactor serve` under pulsar-perf ({', '.join(modes)})")
            try:
                found_vs = VsPulsarBench(work_dir, vparams, log=log).run()
                for table in report.vs_pulsar_tables(found_vs):
                    emit(table, tables, "vs-pulsar")
                failures += found_vs.errors()  # in the tables' notes, and here
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"vs-pulsar benchmark failed: {type(e).__name__}: {e}")
        if args.sections & {"compaction", "incremental", "layers", "scale", "big", "shapes", "partitions"}:
            main_r, inc, big, scale, labels, spark_version, driver_memory = run_compaction(
                args, work_dir, tables
            )
        if "rounds" in args.sections:
            from compactor.spark import get_spark, stop_spark
            from tests.benchmarks.service_rounds import InProcessReplica, ServiceRoundParams, ServiceRounds

            log("rounds: starting `compactor serve` and this process's Spark")
            from tests.server import export_s3_client_env

            export_s3_client_env()  # COMPACTOR_TEST_STORAGE=s3: the rounds read the server's bucket
            try:
                from compactor.warmup import warm_up_jit

                replica_spark = get_spark(driver_memory=args.driver_memory or "8g")
                warm_up_jit(replica_spark)  # as the server warms its own at start-up
                replica = InProcessReplica(replica_spark)
                try:
                    params = ServiceRoundParams.quick() if args.quick else ServiceRoundParams()
                    if args.rounds_messages:
                        n = args.rounds_messages
                        params = dataclasses.replace(params, messages=n, keys=max(1, n // 10))
                    found_rounds = ServiceRounds(
                        work_dir / "rounds",
                        params,
                        in_process=replica,
                        log=log,
                    ).run()
                finally:
                    replica.close()
                    stop_spark()
                emit(report.service_rounds_table(found_rounds), tables, "rounds")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"rounds benchmark failed: {type(e).__name__}: {e}")
        if "storage" in args.sections:
            from tests.benchmarks.storage import StorageBench, StorageParams, storage_table
            from tests.server import s3_settings

            log("storage: `compactor serve` on local disk and on the S3 bucket")
            try:
                if s3_settings() is None:
                    raise RuntimeError(
                        'no S3 server: export COMPACTOR_TEST_S3_SETTINGS="$(.ci/s3)" first (it starts one)'
                    )
                sparams = StorageParams.quick(runs=args.runs) if args.quick else StorageParams(runs=args.runs)
                emit(storage_table(StorageBench(work_dir, sparams, log=log).run()), tables, "storage")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"storage benchmark failed: {type(e).__name__}: {e}")
        if "tables" in args.sections:
            from tests.benchmarks.tables import TableBench, TableParams, tables_table

            log("tables: `compactor serve` with a table topic, DuckDB and pulsar-client")
            try:
                tparams = TableParams.quick() if args.quick else TableParams(runs=args.runs)
                emit(tables_table(TableBench(work_dir, tparams, log=log).run()), tables, "tables")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"tables benchmark failed: {type(e).__name__}: {e}")
        if "cluster" in args.sections:
            from tests.benchmarks import cluster

            try:
                found = cluster.run(
                    work_dir / "cluster-section",
                    MAIN_QUICK if args.quick else MAIN,
                    WARM_UP,
                    runs=args.runs,
                    driver_memory=args.driver_memory or "8g",
                    log=log,
                )
                emit(cluster.table(found), tables, "cluster")
            except Exception as e:  # the other figures are still worth writing down
                traceback.print_exc()
                failures.append(f"cluster benchmark failed: {type(e).__name__}: {e}")
        if scale:
            path = report.scale_plot(scale, big, args.out.parent / document.PLOTS / "scale.png")
            tables["scale"].append(plot_line("time against size", path, args.out))
        if args.spark_profile and labels:
            from tests.benchmarks.spark_profile import profile_table, read_profiles

            profiles, plans = read_profiles(work_dir / "spark-events")
            wanted = {}
            for ledger_id, label in labels.items():  # the last run of every label
                wanted[label.rsplit(" run ", 1)[0]] = ledger_id
            for what, ledger_id in wanted.items():
                if ledger_id in profiles:
                    emit(profile_table(profiles[ledger_id], what), tables, "spark-profile")
            plans_path = args.out.parent / "benchmarks-spark-plans.txt"
            plans_path.write_text("\n\n".join(plans[-4:]) + "\n", encoding="utf-8")
            log(f"final physical plans of the last compaction: {plans_path}")
        target_table = report.targets(
            main=main_r, incremental=inc, big=big, big_planned="big" in args.sections, serving=serving
        )
        print(target_table.text(), "\n", flush=True)
        total = time.perf_counter() - started
        load_end = os.getloadavg()
        import pyarrow

        details = [
            f"load average (1 min) {header_load[0]:.2f} at the start, {load_end[0]:.2f} at the end",
            f"Python {platform.python_version()}, PySpark {spark_version}, DuckDB {duckdb_version}, "
            f"PyArrow {pyarrow.__version__}"
            + (f", Spark driver memory {driver_memory}" if driver_memory != "-" else ""),
            f"wall time of the run {total:.0f} s",
        ]
        document.report_run(args.out, tables, argv=argv, when=started_at, details=details)
        log(f"wrote {args.out} in {total:.0f} s total")
    finally:
        if not args.keep_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
