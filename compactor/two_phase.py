"""``TwoPhaseCompactor``: one compaction round of one topic, on Spark.

The round (see DESIGN.md, "The compaction"):

1. Input (``compactor.inputs``): the previous compacted ledger, whole, plus the rows of the
   sealed original ledgers with ids in ``(previous_horizon, horizon]``. Both share
   ``ledger.schema``.
2. Phase one reads the narrow columns only and finds, per key, the latest id and whether it
   is a tombstone. Phase two reads the full columns, keeps the winners and writes them in
   message-id order as Parquet part files into ``<dir>.tmp``; the driver fsyncs every file,
   writes the manifest, renames the directory into place and fsyncs the parent. A reader
   therefore sees a complete compacted ledger or none. (On a local disk; for object storage
   see below.)
3. When message ids pack into one BIGINT (always, in practice) both phases run as Arrow work
   in Spark tasks, one task per group of input files (``compactor.arrow_phases``): two Spark
   jobs, or one when the round adds little to a previous compacted ledger. Otherwise, and for
   phase one of the event-time and property strategies, they run as Spark SQL
   (``compactor.phases``).

Files are ``ledger.storage.StoragePath`` objects: a topic's ledgers are on a local disk or in an
S3-compatible bucket, read and written by the same code. Object storage has no rename, so
there a round writes straight into the final ``<dir>/`` prefix, the manifest last; nothing
names the new ledger until the caller's metadata commit, which is what publishes it (a prefix
no commit names is an orphan, which the service removes). Spark SQL's own file reads and
writes work on a local disk only: on object storage the input is read by Arrow tasks
(:func:`sql_paths.rows_frame`), and a round whose output only Spark SQL can write (ids that
do not pack; ``retainNullKey`` with the event-time and property strategies) is refused with
``ValueError`` before it writes anything.

The compactor never touches the metadata database: it returns a :class:`CompactionResult`
and the caller commits it. On any failure it removes what it wrote and re-raises.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compactor import arrow_phases, sql_paths
from compactor.deltas import adds_a_delta, fold_deletes, indexed_parts
from compactor.inputs import (
    NEEDS_ARROW,
    CompactionInputs,
    _on_object_storage,
    input_frame,
    input_segments,
    plan_inputs,
    spark_path,
)
from compactor.phases import LATEST_ID, OFFSET, RECORDS, keep_ids, key_summary, narrow_columns, phase_two
from compactor.probe import PROBE_ROWS, probe_tasks
from compactor.progress import BOTH_PHASES_BAND, COMMIT, PHASE_ONE, PHASE_TWO, RoundProgress, SparkJobTracker
from compactor.result import CompactionJob, CompactionResult
from compactor.round_plan import RoundPlan, TaskResult, group_segments
from compactor.segments import Segment
from compactor.spark import JOB_GROUP, await_group_tasks, job_group
from ledger import prefetch
from ledger.files import TMP_SUFFIX, fsync_dir, fsync_path
from ledger.manifest_writer import write_manifest
from ledger.paths import compacted_dir
from ledger.schema import COLUMNS, KEY
from ledger.storage import StoragePath, as_storage_path

# Target row-group size of compacted part files. A reader decodes whole row groups, so
# smaller groups make a page read cheaper; 8 MiB still compresses well.
ROW_GROUP_BYTES = 8 * 1024 * 1024

FaultHook = Callable[[str], None]

# Input bytes per group of the Arrow path, at least (see ``TwoPhaseCompactor._group_count``).
MIN_PART_BYTES = 32 * 1024 * 1024

# Where phase one of the Arrow path leaves its per-group partials, inside the round's
# directory (removed before the manifest is written).
SCRATCH_DIR = "_phase_one"

# Group labels by group count: they depend only on Spark's hash function, so compute them once.
_LABELS: dict[int, tuple[int, ...]] = {}


def _local(path: StoragePath) -> Path:
    """Where a file of a round on a local disk is."""
    found = path.local
    assert found is not None, f"{path} is not on a local disk"
    return found


def _ms_since(t0: float) -> int:
    return int((time.perf_counter() - t0) * 1000)


def shared_group(root: Path | str | StoragePath, ledger_id: int, rounds: int) -> str:
    """The Spark job group of ``rounds`` rounds that share their jobs
    (:meth:`TwoPhaseCompactor.compact_many`; a second job, phase two, when a round needs
    one), named after the round among them with the smallest compacted ledger id: its topic
    directory ``root`` (ledger ids alone repeat across databases) and that id."""
    return f"compaction-{ledger_id}-{rounds}-rounds:{as_storage_path(root)}"


@dataclass(eq=False)
class _Round:
    """One round between its plan and its end: what :meth:`TwoPhaseCompactor.compact` and
    :meth:`TwoPhaseCompactor.compact_many` carry from one stage to the next."""

    job: CompactionJob
    progress: RoundProgress | None
    final: StoragePath
    # Where the round writes: ``final`` + ``.tmp`` on a local disk (renamed into place at the
    # end), ``final`` itself on object storage (no rename there).
    work: StoragePath
    inputs: CompactionInputs
    since: int | None
    incremental: bool
    delta: bool
    bytes_in: int
    plan: RoundPlan | None  # the Arrow path's; None: Spark SQL
    one_job: bool
    summary: DataFrame | None = None
    t0: float = 0.0
    entries_read: int = 0
    phase_one_ms: int = 0
    renamed: bool = False
    # What the tasks handed back (the parts they described, the rows found dead).
    written: TaskResult = field(default_factory=TaskResult)

    def read(self, entries: int, phase_one_ms: int) -> None:
        self.entries_read, self.phase_one_ms = entries, phase_one_ms


class TwoPhaseCompactor:
    """Runs compaction rounds on ``spark``. ``fault_hook(step)`` is called before each step
    (``"phase_one"``, ``"phase_two"``, ``"manifest"``: the new files are written, ``"rename"``:
    the manifest too -- on object storage, where nothing is renamed, the round's last step);
    tests make it raise to inject failures."""

    def __init__(
        self,
        spark: SparkSession,
        *,
        fault_hook: FaultHook | None = None,
        min_part_bytes: int = MIN_PART_BYTES,
        probe_rows: int = PROBE_ROWS,
    ) -> None:
        self.spark = spark
        self.fault_hook = fault_hook
        self.min_part_bytes = min_part_bytes
        self.probe_rows = probe_rows

    def _group_count(self, segments: Sequence[Segment], cores: int) -> int:
        """Groups (tasks, part files) of a round: one per core of the round's ``cores``, but
        none under ``min_part_bytes`` of input -- each task of phase two reads every later
        group's partial, so more groups than the work needs only cost."""
        groups = max(1, cores)
        if self.min_part_bytes > 0:
            total = sum(s.size for s in segments)
            groups = min(groups, max(1, -(-total // self.min_part_bytes)))
        return groups

    def _labels(self, groups: int) -> tuple[int, ...]:
        found = _LABELS.get(groups)
        if found is None:
            found = _LABELS[groups] = sql_paths.spread_labels(self.spark, groups)
        return found

    # ------------------------------------------------------------------ inputs

    def inputs(self, job: CompactionJob) -> CompactionInputs:
        """The files ``job`` reads (see :func:`plan_inputs`)."""
        return plan_inputs(job)

    def read_input(
        self, job: CompactionJob, columns: Sequence[str] = COLUMNS, *, inputs: CompactionInputs | None = None
    ) -> DataFrame:
        """The round's input rows, ``columns`` only (see :func:`input_frame`)."""
        return input_frame(self.spark, job, inputs if inputs is not None else self.inputs(job), columns)

    def phase_one_frame(self, job: CompactionJob, *, inputs: CompactionInputs | None = None) -> DataFrame:
        """Phase one of ``job`` as a DataFrame (the keyless rows as one group with key NULL)."""
        inputs = inputs if inputs is not None else self.inputs(job)
        return key_summary(
            self.read_input(job, narrow_columns(job.strategy), inputs=inputs),
            packed=inputs.packed,
            strategy=job.strategy,
        )

    # ------------------------------------------------------------------ the round

    def compact(self, job: CompactionJob, progress: RoundProgress | None = None) -> CompactionResult:
        """Run the round; ``progress``, if given, is kept up to date while it runs (see
        ``compactor.progress``)."""
        r = self._plan_round(job, progress, cores=self.spark.sparkContext.defaultParallelism)
        try:
            self._spark_work(r)
            return self._finish_round(r)
        except BaseException:
            self._abandon(r)
            raise
        finally:
            if r.summary is not None:
                r.summary.unpersist()

    def compact_many(
        self, jobs: Sequence[CompactionJob], progresses: Sequence[RoundProgress | None] | None = None
    ) -> list[CompactionResult | Exception]:
        """Rounds of several topics (the partitions of a partitioned topic) in ONE Spark job:
        each round's work is tasks of that job, and each round ends on its own -- its files
        put in place, or removed -- so a round that fails leaves the others' results
        standing. Returns, in ``jobs``' order, each round's result or the exception that
        failed it.

        The cores are shared out first across the rounds: each gets one group (one task)
        until there are fewer rounds than cores, so that usually every round fits one job
        (:func:`arrow_phases.fits_one_job`). Rounds that still need two phases add one more
        job, shared by all of them. Rounds the Arrow path cannot run (ids that do not pack,
        strategies other than ``offset``) run after it, one by one, as :meth:`compact` runs them.
        """
        progresses = list(progresses) if progresses is not None else [None] * len(jobs)
        cores = max(1, self.spark.sparkContext.defaultParallelism // max(1, len(jobs)))
        out: list[CompactionResult | Exception | None] = [None] * len(jobs)
        rounds: dict[int, _Round] = {}
        for i, (job, progress) in enumerate(zip(jobs, progresses, strict=True)):
            try:
                rounds[i] = self._plan_round(job, progress, cores=cores)
            except Exception as e:  # noqa: BLE001 - this round fails, the others go on
                out[i] = e
        shared = {i: r for i, r in rounds.items() if r.plan is not None and r.job.strategy == OFFSET}
        try:
            failed = self._shared_work(shared) if shared else {}
        except BaseException:
            for r in rounds.values():
                self._abandon(r)
            raise
        for i, r in rounds.items():
            try:
                if i in failed:
                    raise failed[i]
                if i not in shared:
                    self._spark_work(r)
                out[i] = self._finish_round(r)
            except Exception as e:  # noqa: BLE001
                self._abandon(r)
                out[i] = e
            finally:
                if r.summary is not None:
                    r.summary.unpersist()
        return [o if o is not None else RuntimeError("round not run") for o in out]

    def _plan_round(self, job: CompactionJob, progress: RoundProgress | None, *, cores: int) -> _Round:
        """A round's inputs and plan, read from manifests and footers; nothing written yet
        (what a crashed attempt at the same ledger id left is removed: its temporary directory
        on a local disk, where an existing ledger directory is refused with
        ``FileExistsError``; on object storage every object under the ledger's prefix, which
        only such an attempt can have written, ledger ids being allocated once)."""
        final = compacted_dir(job.topic_root, job.output_ledger_id)
        if _on_object_storage(job):
            work = final
            final.delete_tree()
        else:
            work = final.with_name(final.name + TMP_SUFFIX)
            if _local(final).exists():
                raise FileExistsError(f"compacted ledger {job.output_ledger_id} already exists: {final}")
            if _local(work).exists():  # left by a crashed attempt at this same ledger id
                shutil.rmtree(_local(work))
        inputs = self.inputs(job)
        since = job.now_ms - job.delete_retention_ms if job.delete_retention_ms else None
        # Arrow inside Spark tasks when ids pack (always, in practice): see arrow_phases.
        # Spark SQL when they do not, and for phase one of the other strategies.
        fast = inputs.packed and (job.strategy == OFFSET or not job.retain_null_key)
        if not fast and _on_object_storage(job):
            raise ValueError(NEEDS_ARROW)  # Spark SQL would write the parts: not to a bucket
        # With the offset strategy a round need not aggregate the previous compacted ledger
        # again: its keys are unique and each is replaced only by a newer row of the key.
        incremental = fast and job.strategy == OFFSET and bool(inputs.previous_parts)
        # And usually it need not copy it either: it adds a delta layer and marks the rows
        # the new keys supersede in the older layers' deletion vectors (found through their
        # key indexes). Past the bounds on deltas and dead rows it consolidates instead: the
        # older layers' live rows and the new winners become one new base.
        previous = inputs.previous_manifest
        delta = incremental and adds_a_delta(job, previous)
        indexed = indexed_parts(job, previous) if delta else ()  # type: ignore[arg-type]
        if delta:
            bytes_in = sum(inputs.size(p) for p in inputs.originals)
            keys = [p.keys for p in indexed]
            at_once = any(k.local is None for k in keys)
            bytes_in += sum(prefetch.each(StoragePath.size, keys, at_once=at_once))
        else:
            bytes_in = inputs.bytes_in
        if progress is not None:
            progress.set_totals(entries=inputs.new_rows if delta else inputs.rows, bytes_=bytes_in)
        plan: RoundPlan | None = None
        if fast:
            segments = input_segments(job, inputs, incremental=incremental, new_only=delta)
            groups = group_segments(segments, self._group_count(segments, cores))
            plan = RoundPlan(
                groups=tuple(tuple(g) for g in groups),
                out_dir=work,
                scratch_dir=work / SCRATCH_DIR,
                row_group_bytes=ROW_GROUP_BYTES,
                retain_null_key=job.retain_null_key,
                keep_tombstones_since=since,
                indexed=indexed,
                probe_tasks=probe_tasks(indexed, cores, self.probe_rows),
                compress_values=inputs.values_compress,
                value_schema=job.value_schema,
            )
        one_job = plan is not None and job.strategy == OFFSET and arrow_phases.fits_one_job(plan)
        return _Round(
            job=job,
            progress=progress,
            final=final,
            work=work,
            inputs=inputs,
            since=since,
            incremental=incremental,
            delta=delta,
            bytes_in=bytes_in,
            plan=plan,
            one_job=one_job,
        )

    def _spark_work(self, r: _Round) -> None:
        """The round's Spark jobs: both phases in one, or phase one then phase two."""
        job, progress, plan = r.job, r.progress, r.plan
        if r.one_job:
            # Both phases in each task: a second Spark job would cost more than the reads
            # it saves (see arrow_phases.fits_one_job).
            self._fault("phase_one")
            self._fault("phase_two")
            r.t0 = time.perf_counter()
            if progress is not None:
                progress.enter(PHASE_ONE, BOTH_PHASES_BAND)
            with (
                self._job_description(f"compaction {job.output_ledger_id}: both phases"),
                self._jobs(f"compaction-{job.output_ledger_id}-both", [progress]),
            ):
                r.written = arrow_phases.both_phases(self.spark, plan)  # type: ignore[arg-type]
            r.read(r.written.rows_read, int(r.written.phase_one_s * 1000))
            return
        if plan is not None and job.strategy == OFFSET and arrow_phases.full_round_fits(plan):
            self._full_round(r, plan)
            return
        self._fault("phase_one")
        r.t0 = time.perf_counter()
        with (
            self._job_description(f"compaction {job.output_ledger_id}: phase one"),
            self._jobs(f"compaction-{job.output_ledger_id}-{PHASE_ONE}", [progress]),
        ):
            if plan is not None and job.strategy == OFFSET:
                entries_read = arrow_phases.phase_one(self.spark, plan)
            else:
                # Materialised here; phase two joins against it, the count comes from it.
                r.summary = self.phase_one_frame(job, inputs=r.inputs).persist(StorageLevel.MEMORY_AND_DISK)
                totals = r.summary.agg(F.sum(RECORDS)).first()
                entries_read = int(totals[0] or 0) if totals is not None else 0
        r.read(entries_read, _ms_since(r.t0))
        self._fault("phase_two")
        if progress is not None:
            progress.set_totals(entries=r.entries_read)  # exact now
            progress.enter(PHASE_TWO)
        with (
            self._job_description(f"compaction {job.output_ledger_id}: phase two"),
            self._jobs(f"compaction-{job.output_ledger_id}-{PHASE_TWO}", [progress]),
        ):
            r.written = self._phase_two(job, r.inputs, plan, r.summary, r.since, r.work)

    def _full_round(self, r: _Round, plan: RoundPlan) -> None:
        """Both phases of every group in one job (:func:`arrow_phases.full_round`); the
        groups whose tasks could not wait for the later groups' partials then run their phase
        two in a job of their own."""
        job, progress = r.job, r.progress
        self._fault("phase_one")
        r.t0 = time.perf_counter()
        plan.make_out_dir()
        if progress is not None:
            progress.enter(PHASE_ONE, BOTH_PHASES_BAND)
        with (
            self._job_description(f"compaction {job.output_ledger_id}: both phases"),
            self._jobs(f"compaction-{job.output_ledger_id}-both", [progress]),
        ):
            written = arrow_phases.full_round(self.spark, plan)
        r.read(written.rows_read, int(written.phase_one_s * 1000))
        self._fault("phase_two")
        left = [g for g in range(len(plan.groups)) if g not in written.written]
        if left:
            if progress is not None:
                progress.set_totals(entries=r.entries_read)
                progress.enter(PHASE_TWO)
            with (
                self._job_description(f"compaction {job.output_ledger_id}: phase two"),
                self._jobs(f"compaction-{job.output_ledger_id}-{PHASE_TWO}", [progress]),
            ):
                rest = arrow_phases.phase_two(self.spark, plan, left)
            written = TaskResult.of([written, rest])
        r.written = written

    def _shared_work(self, rounds: dict[int, _Round]) -> dict[int, Exception]:
        """The Arrow work of several rounds as tasks of one Spark job (two when a round needs
        both phases apart); returns the rounds whose tasks failed, with their error."""
        self._fault("phase_one")
        self._fault("phase_two")
        ids = ",".join(str(r.job.output_ledger_id) for r in rounds.values())
        both = {i: r.plan for i, r in rounds.items() if r.one_job}
        apart = {i: r.plan for i, r in rounds.items() if not r.one_job}
        t0 = time.perf_counter()
        for r in rounds.values():
            r.t0 = t0
            if r.progress is not None:
                r.progress.enter(PHASE_ONE, BOTH_PHASES_BAND if r.one_job else None)
        first = min((r.job for r in rounds.values()), key=lambda j: j.output_ledger_id)
        tag = shared_group(first.topic_root, first.output_ledger_id, len(rounds))
        with (
            self._job_description(f"compaction {ids}: {len(rounds)} rounds"),
            self._jobs(tag, [r.progress for r in rounds.values()], own_group=True),
        ):
            outcomes = arrow_phases.many_rounds(self.spark, both, apart)  # type: ignore[arg-type]
        failed: dict[int, Exception] = {}
        for i, outcome in outcomes.items():
            if isinstance(outcome, Exception):
                failed[i] = outcome
            else:
                rounds[i].written = outcome
                rounds[i].read(outcome.rows_read, int(outcome.phase_one_s * 1000))
        later = {i: p for i, p in apart.items() if i not in failed}
        if later:
            for i in later:
                p = rounds[i].progress
                if p is not None:
                    p.set_totals(entries=rounds[i].entries_read)
                    p.enter(PHASE_TWO)
            with (
                self._job_description(f"compaction {ids}: phase two"),
                self._jobs(tag, [rounds[i].progress for i in later], own_group=True),
            ):
                second = arrow_phases.many_writes(self.spark, later)  # type: ignore[arg-type]
            for i, outcome in second.items():
                if isinstance(outcome, Exception):
                    failed[i] = outcome
                else:
                    rounds[i].written = outcome
        return failed

    def _finish_round(self, r: _Round) -> CompactionResult:
        """After the Spark work: deletion vectors, the manifest, and on a local disk the fsyncs
        before it and the rename into place after it (on object storage every object is
        durable once uploaded, and the manifest, written last, completes the ledger)."""
        job, progress, work, final = r.job, r.progress, r.work, r.final
        previous = r.inputs.previous_manifest
        entries_read = r.entries_read
        if r.incremental:  # the previous ledger's rows were not read: count them
            entries_read += previous.entries  # type: ignore[union-attr]
        if progress is not None:
            progress.set_totals(entries=entries_read)
            progress.enter(COMMIT)
        dead = r.written.dead if r.delta else {}
        local = work.local
        described = None  # on object storage, the parts as their tasks described them
        if local is not None:
            shutil.rmtree(local / SCRATCH_DIR, ignore_errors=True)
            local.mkdir(parents=True, exist_ok=True)
        else:
            described = {p.name: p for p in r.written.parts}
            if not r.one_job:  # only phase one apart leaves files there (its partials)
                (work / SCRATCH_DIR).delete_tree()  # before the manifest: never part of a ledger
        below = fold_deletes(job, previous, dead, work) if r.delta else None  # type: ignore[arg-type]
        if local is not None:
            for path in sorted(local.iterdir()):
                if path.is_file():
                    fsync_path(path)
        self._fault("manifest")
        manifest = write_manifest(work, below=below, described=described)  # a local disk's: fsynced
        self._fault("rename")
        if local is not None:
            os.rename(local, _local(final))
            r.renamed = True
            fsync_dir(local.parent)
        return CompactionResult(
            horizon=job.horizon,
            ledger_id=job.output_ledger_id,
            directory=final,
            entries_read=entries_read,
            records_kept=manifest.entries,
            records_removed=entries_read - manifest.entries,
            bytes_in=r.bytes_in,
            bytes_out=manifest.size_bytes,
            phase_one_ms=r.phase_one_ms,
            phase_two_ms=_ms_since(r.t0 + r.phase_one_ms / 1000),
            manifest=manifest,
        )

    @staticmethod
    def _abandon(r: _Round) -> None:
        """Remove what a failed round wrote (on object storage, every object under the new
        ledger's prefix: nothing has published it)."""
        local = r.work.local
        if local is None:
            # What a failed delete leaves is an orphan, which the service's sweep removes: the
            # round's own error is the one to raise.
            with contextlib.suppress(OSError):
                r.work.delete_tree()
            return
        shutil.rmtree(local, ignore_errors=True)
        if r.renamed:
            shutil.rmtree(_local(r.final), ignore_errors=True)

    def _phase_two(
        self,
        job: CompactionJob,
        inputs: CompactionInputs,
        plan: RoundPlan | None,
        summary: DataFrame | None,
        since: int | None,
        work: StoragePath,
    ) -> TaskResult:
        """Phase two as its own job: the Arrow path's (``plan``) from its partials, or from
        the ids of a Spark SQL phase one (``summary``), or all in Spark SQL (into ``work``, on
        a local disk only: see :data:`NEEDS_ARROW`)."""
        if plan is not None and job.strategy == OFFSET:
            return arrow_phases.phase_two(self.spark, plan)
        elif plan is not None:
            labels = self._labels(len(plan.groups))
            ids = keep_ids(summary, keep_tombstones_since=since)  # type: ignore[arg-type]
            keep = ids.select(
                sql_paths.label_column(ids[LATEST_ID], sql_paths.group_bounds(plan.groups), labels).alias(
                    sql_paths.LABEL
                ),
                ids[LATEST_ID].alias(sql_paths.ID),
            )
            return sql_paths.phase_two_from_ids(self.spark, keep, plan, labels)
        kept = phase_two(
            self.read_input(job, inputs=inputs),
            summary.where(F.col(KEY).isNotNull()),  # type: ignore[union-attr]
            retain_null_key=job.retain_null_key,
            keep_tombstones_since=since,
        )
        (
            kept.write.mode("errorifexists")
            .option("compression", "lz4_raw")  # as parts.PART_CODEC
            .option("parquet.block.size", str(ROW_GROUP_BYTES))
            .parquet(spark_path(work))
        )
        return TaskResult()  # local disk only: the driver reads the footers

    # ------------------------------------------------------------------ helpers

    @contextmanager
    def _jobs(
        self, group: str, progresses: Sequence[RoundProgress | None], *, own_group: bool = False
    ) -> Iterator[None]:
        """The body's Spark jobs in job group ``group``, their progress polled into every one
        of ``progresses`` (the rounds that share them). With no progress to poll, the jobs stay
        in the caller's group if it set one, unless ``own_group`` (rounds that share a job are
        always in their ``shared_group``, where their jobs can be counted). If the body fails,
        it returns only once no task of the jobs' group runs: a failed job's other tasks may
        still be writing into the round's directory, which the caller is about to remove."""
        watching = [p for p in progresses if p is not None]
        caller = None if watching or own_group else self.spark.sparkContext.getLocalProperty(JOB_GROUP)
        if watching:
            scope: AbstractContextManager[None] = SparkJobTracker(self.spark, group, watching).tracking()
        else:
            scope = nullcontext() if caller is not None else job_group(self.spark, group)
        try:
            with scope:
                yield
        except BaseException:
            await_group_tasks(self.spark, caller if caller is not None else group)
            raise

    def _fault(self, phase: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(phase)

    @contextmanager
    def _job_description(self, text: str) -> Iterator[None]:
        sc = self.spark.sparkContext
        sc.setJobDescription(text)
        try:
            yield
        finally:
            sc.setJobDescription(None)  # type: ignore[arg-type]
