"""The two phases as Arrow work inside Spark tasks: the fast path when message ids pack.

Spark schedules one task per **group**; the tasks decode Parquet and aggregate with Arrow's
C++ kernels, so no input row becomes a JVM row and nothing but a few counters passes through
Spark. Every input byte is decoded once per phase, by one task.

The input of a round is a list of **segments** in message-id order: the previous compacted
ledger's part files, then the sealed original ledgers, each with the packed-id range it
contributes, ``(lo, hi]``. Every segment stores its rows in id order. Consecutive segments
form groups, balanced by bytes; group ``g`` writes output part ``part-{g:05d}.parquet``, so
the part files in name order are in message-id order with no sort of full rows.

Phase one (:func:`phase_one`) writes each group's **partial**, its keys' latest rows within the
group; phase two (:func:`phase_two`) writes each group's part: the rows of its partial whose key
no later group has (``compactor.phase_one`` and ``compactor.phase_two`` say how).

The only data moving between tasks is the partials' key columns, through files a task reads
directly: no shuffle, no collect of rows to the driver.

A full round (:func:`full_round`) is one job: the last group needs no other group's keys, so
its task runs both phases at once, its partial written first; each other group's task writes
its partial, waits in the task for the later groups' partials (their phase one, in parallel,
takes about as long) and runs its phase two then: a second Spark job would cost a round trip
through the driver before any of its work. A task whose later partials do not come in time
(their tasks not running: fewer cores than tasks) leaves its phase two to a job the driver
starts once the first job ends.

One job (:func:`both_phases`): a Spark job costs tens of milliseconds before any work, which
is most of an incremental round that adds 1% to a compacted ledger. When the new rows are a
small share of the round (:func:`fits_one_job`), each task runs both phases itself: its
partial stays in memory and it reads the keys of the later groups' new rows directly (a few
narrow reads) instead of waiting for their partials. The previous ledger's parts are then
split by row group, so that copying them spreads over every task.

Every file is a ``ledger.storage.StoragePath``, so the same tasks read and write a local disk
or an S3-compatible bucket (a task opens the storage once per process, see ``open_storage``).
What differs is how a file is put in place: on a local disk a task writes under a name of its
own in the scratch directory and renames it into place (parts and key indexes fsynced first);
on object storage a part and its key index are written to a local staging file and uploaded,
and a partial is spooled and uploaded, each whole or not at all. Reads differ too: partials
and key indexes are memory-mapped on a local disk, and read whole, in one request each, from
object storage (Parquet files by ranges on both). What the driver needs of the tasks' work
-- the parts' manifest lines on object storage, a delta round's dead rows -- comes back as
the tasks' results (:class:`TaskResult`), not through files.

This module runs the phases as Spark jobs, in the shapes above, and the tasks of several rounds
in one job (:func:`many_rounds`). What the tasks do is in modules of its own:

- ``compactor.segments``: reading a segment's rows, in bounded chunks, with their packed ids;
- ``compactor.round_plan``: what every task of a round is given (:class:`RoundPlan`) and hands
  back (:class:`TaskResult`);
- ``compactor.phase_one``: a group's partial;
- ``compactor.phase_two``: a group's winners, against the later groups' keys;
- ``compactor.parts``: writing a part file and its key index;
- ``compactor.probe``: a delta round's probe of the older layers' key indexes;
- ``compactor.sql_paths``: the Arrow tasks of the Spark SQL path.
"""

from __future__ import annotations

import functools
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import pyarrow as pa
from pyspark import RDD, SparkContext
from pyspark.sql import SparkSession

from compactor.phase_one import P_KEY, _partial, _write_partial, group_latest
from compactor.phase_two import _partial_keys, _write_group, group_write
from compactor.probe import _beside_probe
from compactor.round_plan import KeySets, RoundPlan, TaskResult, _cached, _for_tasks_of
from compactor.segments import _chunks, _opened_ahead
from ledger.schema import ENTRY_ID, KEY, LEDGER_ID
from ledger.storage import StoragePath

T = TypeVar("T")

# One job for both phases when new bytes x groups x this <= the round's bytes.
_ONE_JOB_NEW_SHARE = 2


# --------------------------------------------------------------- phase one, then phase two


def phase_one(spark: SparkSession, plan: RoundPlan) -> int:
    """Write the partial of every group (one task per group); returns the rows read."""
    return sum(_per_group(spark, plan, group_latest))


def phase_two(spark: SparkSession, plan: RoundPlan, groups: Sequence[int] | None = None) -> TaskResult:
    """Write every group's part (one task per group), or those of ``groups`` (the others'
    written already by :func:`full_round`), from the partials.
    Tasks write only their own part and read only partials (and, in a delta round, their
    share of the older layers' key indexes)."""
    plan.make_out_dir()
    if groups is None:
        return TaskResult.of(_per_group(spark, plan, group_write, plan.tasks))
    return TaskResult.of(_per_group(spark, _for_tasks_of(plan, groups), group_write, groups=groups))


# ---------------------------------------------------------------------------- a full round


# How long a task of :func:`full_round` waits for the later groups' partials, at least; and
# at most as long again as its own phase one took, which theirs should take too.
_IN_TASK_WAIT_MIN_S = 0.5

# How often a waiting task looks for a partial: a file on a local disk, a HEAD request on
# object storage.
_AWAIT_LOCAL_S = 0.002
_AWAIT_OBJECT_S = 0.02


def _await_files(paths: Sequence[StoragePath], seconds: float) -> bool:
    """Whether every one of ``paths`` is there within ``seconds``."""
    if not paths:
        return True
    deadline = time.monotonic() + seconds
    pause = _AWAIT_LOCAL_S if all(p.local is not None for p in paths) else _AWAIT_OBJECT_S
    waiting = list(paths)
    while True:
        waiting = [p for p in waiting if not p.is_file()]
        if not waiting:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)


def _latest_then_write(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: group ``group``'s partial, written for the earlier groups, then its
    phase two in the same task once every later group's partial is there (not when they do
    not come in time: see :func:`full_round`)."""
    later = [plan.partial_path(h) for h in range(group + 1, len(plan.groups))]
    return _both_phases(
        plan,
        group,
        _partial_keys(plan),
        publish=True,
        ready=lambda phase_one_s: _await_files(later, max(_IN_TASK_WAIT_MIN_S, phase_one_s)),
    )


def full_round(spark: SparkSession, plan: RoundPlan) -> TaskResult:
    """Both phases of every group in one job, one task each, in reverse group order: task 0
    runs the last group, whose part needs no other group's keys, so it never waits; every
    other task writes its partial and then waits for the later groups'. Spark launches a
    job's tasks in task order, so each task waits only for groups whose tasks started before
    its own, and every wait ends while the tasks run at once. With fewer cores than tasks a
    later group's task may not be running yet: a task waits at most as long as its own phase
    one took (half a second at least) and then leaves its phase two to :func:`phase_two`
    (the result's ``written`` lists the groups done)."""
    if plan.probe_tasks:
        raise ValueError("a delta round's probe needs its own job: see full_round_fits()")
    order = range(len(plan.groups) - 1, -1, -1)
    return TaskResult.of(_per_group(spark, plan, _latest_then_write, groups=order))


def full_round_fits(plan: RoundPlan) -> bool:
    """Whether :func:`full_round` can run the round: not a delta round's, whose probe tasks
    read every group's keys and mark dead rows in the older layers before any part is
    written."""
    return plan.probe_tasks == 0


def _both_phases(
    plan: RoundPlan,
    group: int,
    later: KeySets,
    *,
    publish: bool = False,
    ready: Callable[[float], bool] | None = None,
) -> TaskResult:
    """Both phases of group ``group`` in the calling task: its partial, kept in memory, then
    its part, the later groups' key sets from ``later``. ``publish``: the partial is also
    written, before the part, for other tasks to read its keys. ``ready(phase one's
    seconds)``, when given, decides whether phase two runs at all: if not, the result counts
    the rows read and names no group in ``written``."""
    t0 = time.perf_counter()
    own, rows_read = _partial(plan, group)
    if publish:
        _write_partial(plan, group, own)
    own_keys = own.column(P_KEY).combine_chunks()
    phase_one_s = time.perf_counter() - t0
    if ready is not None and not ready(phase_one_s):
        return TaskResult(rows_read=rows_read, phase_one_s=phase_one_s)
    written = _write_group(plan, group, own, lambda h: own_keys if h == group else later(h))
    return replace(written, rows_read=rows_read, phase_one_s=phase_one_s, written=(group,))


# ---------------------------------------------------------------------------- a job's tasks


# The codec of what a job carries to its tasks: zstd makes a plan of forty ledgers' footers
# (430 KB, much alike) ten times smaller in a millisecond.
_PACK_CODEC = "zstd"


@dataclass(frozen=True)
class _Packed(Generic[T]):
    """An object as a job's closure carries it to every task: pickled and compressed once in
    the driver. A closure crosses py4j, the JVM and each task's socket as bytes, and a full
    round's plan is mostly footers: 430 KB cost the JVM ~20 ms of CPU per job."""

    data: bytes
    size: int

    @staticmethod
    def of(value: T) -> _Packed[T]:
        raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return _Packed(pa.Codec(_PACK_CODEC).compress(raw, asbytes=True), len(raw))

    def unpack(self) -> T:
        raw = pa.Codec(_PACK_CODEC).decompress(self.data, decompressed_size=self.size, asbytes=True)
        return pickle.loads(raw)  # type: ignore[no-any-return]


# Per SparkContext, an RDD of the group numbers ``0 .. n-1`` in ``n`` partitions, by ``n``:
# building one costs a round trip through a file, reusing it costs nothing.
_GROUP_RDDS: weakref.WeakKeyDictionary[SparkContext, dict[int, RDD[int]]] = weakref.WeakKeyDictionary()
_GROUP_RDDS_LOCK = threading.Lock()


def _group_rdd(spark: SparkSession, n: int) -> RDD[int]:
    sc = spark.sparkContext
    with _GROUP_RDDS_LOCK:
        by_n = _GROUP_RDDS.setdefault(sc, {})
        if n not in by_n:
            by_n[n] = sc.parallelize(range(n), n)
        return by_n[n]


def _per_group(
    spark: SparkSession,
    plan: RoundPlan,
    work: Callable[[RoundPlan, int], T],
    tasks: int | None = None,
    *,
    first: int = 0,
    groups: Sequence[int] | None = None,
) -> list[T]:
    """``work(plan, first + t)`` for every task ``t`` (by default one per group), or
    ``work(plan, groups[t])``, one Spark task each; their results, in order."""
    chosen = tuple(groups) if groups is not None else None
    packed = _Packed.of(plan)

    def task(numbers: Iterable[int]) -> Iterable[T]:
        unpacked = packed.unpack()
        for t in numbers:
            yield work(unpacked, chosen[t] if chosen is not None else first + t)

    n = len(chosen) if chosen is not None else len(plan.groups) if tasks is None else tasks
    if n == 0:
        return []
    return _group_rdd(spark, n).mapPartitions(task).collect()


# ---------------------------------------------------------------------------- one job


def new_bytes(plan: RoundPlan) -> int:
    """Bytes of the round's new segments (not the previous compacted ledger's)."""
    return sum(s.size for g in plan.groups for s in g if not s.previous)


def fits_one_job(plan: RoundPlan) -> bool:
    """Whether both phases should run in one Spark job (:func:`both_phases`): with one group
    (nothing to exchange), or when the new segments are a small share of the round (an
    incremental round), so that every task reading the later groups' new keys itself costs
    less than a second job."""
    if len(plan.groups) == 1:
        return True
    total = sum(s.size for g in plan.groups for s in g)
    return _ONE_JOB_NEW_SHARE * len(plan.groups) * new_bytes(plan) <= total


def _new_keys(plan: RoundPlan, group: int) -> pa.Array | None:
    """Every key of group ``group``'s new segments (tombstones included)."""
    columns = [LEDGER_ID, ENTRY_ID, KEY]
    new = [s for s in plan.groups[group] if not s.previous]
    chunks = [
        c
        for s, opened in _opened_ahead(new, columns)
        for t, _ in _chunks(s, columns, opened=opened)
        for c in t.column(KEY).chunks
        if len(c)
    ]
    return pa.concat_arrays(chunks) if chunks else None


def group_round(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: both phases of group ``group``, computing the later groups' key sets
    from their new segments rather than from partials, beside the task's share of a delta
    round's probe (if any), which reads the new keys itself rather than wait for phase one."""
    new_keys = _cached(functools.partial(_new_keys, plan))  # shared by the task's two threads
    done, dead = _beside_probe(plan, group, new_keys, lambda: _both_phases(plan, group, new_keys))
    return replace(done or TaskResult(), dead=dead)


def both_phases(spark: SparkSession, plan: RoundPlan) -> TaskResult:
    """Both phases in one job (one task per group)."""
    plan.make_out_dir()
    return TaskResult.of(_per_group(spark, plan, group_round, plan.tasks))


# ---------------------------------------------------------------------------- several rounds


class TaskFailed(Exception):
    """A task of a round that shared its Spark job with other rounds raised: ``str()`` is
    the error's one line; its cause carries the task's traceback (where a damaged file is
    named, as in a Spark error's text)."""

    def __init__(self, kind: str, message: str, trace: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.__cause__ = RuntimeError(trace)


def _timed_latest(plan: RoundPlan, group: int) -> TaskResult:
    t0 = time.perf_counter()
    rows_read = group_latest(plan, group)
    return TaskResult(rows_read=rows_read, phase_one_s=time.perf_counter() - t0)


# What a task of a shared job runs, by kind: both phases; phase one; phase two.
_SHARED_WORK: dict[str, Callable[[RoundPlan, int], TaskResult]] = {
    "both": group_round,
    "latest": _timed_latest,
    "write": group_write,
}


# A task's error as its driver reports it: the exception's type name, message and traceback.
_TaskError = tuple[str, str, str]


def _shared_job(
    spark: SparkSession, tasks: Sequence[tuple[int, int, str]], plans: dict[int, RoundPlan]
) -> tuple[dict[int, TaskResult], dict[int, Exception]]:
    """For every ``(r, t, kind)`` of ``tasks``, the work ``kind`` names on ``plans[r]``'s task
    ``t``, one Spark task each, all in one job. A task that raises fails its round only: its
    error is returned, not raised, so the other rounds' tasks finish and their results stand.
    Returns each round's results (as one) and the rounds that failed, with their first error."""

    packed = _Packed.of(plans)

    def task(indexes: Iterable[int]) -> Iterator[tuple[int, int, TaskResult | None, _TaskError | None]]:
        import traceback

        unpacked = packed.unpack()
        for n in indexes:
            r, t, kind = tasks[n]
            try:
                yield r, t, _SHARED_WORK[kind](unpacked[r], t), None
            except Exception as e:  # noqa: BLE001 - reported to the driver as its round's error
                yield r, t, None, (type(e).__name__, str(e), traceback.format_exc())

    for plan in plans.values():
        plan.make_out_dir()
    results: dict[int, list[TaskResult]] = {r: [] for r in plans}
    failed: dict[int, Exception] = {}
    if tasks:
        for r, _, value, error in sorted(
            _group_rdd(spark, len(tasks)).mapPartitions(task).collect(), key=lambda o: (o[0], o[1])
        ):
            if error is not None:
                failed.setdefault(r, TaskFailed(*error))
            elif value is not None:
                results[r].append(value)
    return {r: TaskResult.of(v) for r, v in results.items() if r not in failed}, failed


def many_rounds(
    spark: SparkSession, both: dict[int, RoundPlan], apart: dict[int, RoundPlan]
) -> dict[int, TaskResult | Exception]:
    """One job for several rounds (the partitions of a topic): the tasks of
    :func:`both_phases` for the rounds in ``both``, and of :func:`phase_one` for those in
    ``apart`` (whose phase two is :func:`many_writes`). Returns, by round, its tasks' result,
    or the exception that failed the round."""
    tasks = [(r, t, "both") for r, p in both.items() for t in range(p.tasks)]
    tasks += [(r, t, "latest") for r, p in apart.items() for t in range(len(p.groups))]
    results, failed = _shared_job(spark, tasks, {**both, **apart})
    return {**results, **failed}


def many_writes(spark: SparkSession, plans: dict[int, RoundPlan]) -> dict[int, TaskResult | Exception]:
    """Phase two of several rounds whose phase one :func:`many_rounds` ran, in one job;
    returns, by round, its tasks' result or the exception that failed it."""
    tasks = [(r, t, "write") for r, p in plans.items() for t in range(p.tasks)]
    results, failed = _shared_job(spark, tasks, plans)
    return {**results, **failed}
