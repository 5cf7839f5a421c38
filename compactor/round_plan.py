"""What every task of a round is given and hands back: the :class:`RoundPlan` (pickled into the
tasks, see ``compactor.arrow_phases``), the later groups' keys as the phases ask for them
(:data:`KeySets`), and the :class:`TaskResult` (through Spark's own task results, never rows).

Consecutive segments form the round's groups, balanced by bytes (:func:`group_segments`). A
task on a local disk writes a file under a name of its own in the round's scratch directory
before it renames it into place (:func:`_attempt_path`).
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from compactor.segments import Segment
from ledger.layers import PartInfo
from ledger.storage import StoragePath
from ledger.value_columns import ValueSchema


@dataclass(frozen=True)
class IndexedPart:
    """A part of an older layer in a delta round: its key index, its layer (by position in the
    manifest) and the layer row number of its first row."""

    keys: StoragePath
    layer: int
    first_row: int
    # The part's rows, as the manifest says: its index must hold as many.
    rows: int
    # Its key index's CRC32C, as the manifest says (None in older manifests).
    checksum: str | None = None


@dataclass(frozen=True)
class RoundPlan:
    """What every task of a round needs to know (pickled into the tasks)."""

    groups: tuple[tuple[Segment, ...], ...]
    out_dir: StoragePath  # where part files go
    scratch_dir: StoragePath  # where phase one leaves its partials for phase two (inside out_dir)
    row_group_bytes: int
    retain_null_key: bool
    keep_tombstones_since: int | None  # delete retention: tombstones published since are kept
    # A delta round: the parts of the older layers, whose rows the new keys supersede.
    indexed: tuple[IndexedPart, ...] = ()
    # How many tasks share the probe of those parts' key indexes (see ``probe.probe``), each an
    # equal run of their rows; tasks past the groups' only probe. 0 when nothing is indexed.
    probe_tasks: int = 0
    # Whether part files compress their value column (not when the input's values do not
    # compress: see ``parts.INCOMPRESSIBLE_RATIO``).
    compress_values: bool = True
    # A table topic's JSON or Avro schema: its parts get the value's typed columns
    # (``ledger.value_columns``). None for every other topic: parts as ever.
    value_schema: ValueSchema | None = None

    @property
    def tasks(self) -> int:
        """Tasks of a job of this round: one per group, and as many as share the probe."""
        return max(len(self.groups), self.probe_tasks)

    def partial_path(self, group: int) -> StoragePath:
        return self.scratch_dir / f"partial-{group:05d}.arrow"

    def part_path(self, group: int) -> StoragePath:
        return self.out_dir / f"part-{group:05d}.parquet"

    def make_out_dir(self) -> None:
        """On a local disk, create the directory the parts go to (an object store has none)."""
        local = self.out_dir.local
        if local is not None:
            local.mkdir(parents=True, exist_ok=True)


def _for_tasks_of(plan: RoundPlan, groups: Iterable[int]) -> RoundPlan:
    """``plan`` as a job whose tasks open only the files of ``groups`` should ship it: the
    other groups' footers left out. A job's closure goes to every one of its tasks through the
    JVM, and with forty ledgers the footers are about 430 KB: measured, each such job cost the
    JVM ~20 ms more CPU, and its tasks started ~14 ms later, than a job without them."""
    keep = set(groups)
    return replace(
        plan,
        groups=tuple(
            g if i in keep else tuple(replace(s, footer=None) if s.footer is not None else s for s in g)
            for i, g in enumerate(plan.groups)
        ),
    )


@dataclass(frozen=True)
class TaskResult:
    """What the tasks of a round hand back to the driver, through Spark's own task results:
    a few numbers and, in a delta round, row numbers -- never rows. The rows read and
    written; the longest phase one of a task (seconds); on object storage the manifest lines
    of the parts written (``PartInfo``, made from the staging files, so that the driver need
    not read the parts and their indexes back); and the older layers' rows a delta round's
    probe found dead, by layer (each share probes its own rows: no row is found twice)."""

    rows_read: int = 0
    rows_written: int = 0
    phase_one_s: float = 0.0
    parts: tuple[PartInfo, ...] = ()
    dead: dict[int, np.ndarray] = field(default_factory=dict)
    # The groups whose part a task that ran both phases wrote (see ``arrow_phases.full_round``).
    written: tuple[int, ...] = ()

    @staticmethod
    def of(results: Iterable[TaskResult]) -> TaskResult:
        """The results of several tasks as one."""
        done = list(results)
        found: dict[int, list[np.ndarray]] = {}
        for r in done:
            for layer, rows in r.dead.items():
                found.setdefault(layer, []).append(rows)
        return TaskResult(
            rows_read=sum(r.rows_read for r in done),
            rows_written=sum(r.rows_written for r in done),
            phase_one_s=max((r.phase_one_s for r in done), default=0.0),
            parts=tuple(p for r in done for p in r.parts),
            dead={layer: np.concatenate(rows) if len(rows) > 1 else rows[0] for layer, rows in found.items()},
            written=tuple(g for r in done for g in r.written),
        )


# The keys of group h's partial (None when it has none), for h at or after the writing group.
KeySets = Callable[[int], "pa.Array | None"]


def _cached(key_sets: KeySets) -> KeySets:
    """``key_sets`` computing each group's set once per task (they are asked for per chunk)."""
    return functools.lru_cache(maxsize=None)(key_sets)


def _attempt_path(path: Path, scratch_dir: StoragePath) -> str:
    """Where a task writes a file before renaming it to ``path`` (on a local disk): a name of
    its own in the scratch directory, so that two attempts of one task (a retry, a speculative
    copy) never write the same file, and a reader never sees a half-written one. (On object
    storage an upload is whole or absent, and two attempts' uploads hold the same rows.)"""
    scratch = scratch_dir.local
    assert scratch is not None, "attempt files are for a local disk"
    scratch.mkdir(parents=True, exist_ok=True)
    return str(scratch / f"{path.name}.{os.getpid()}-{uuid.uuid4().hex}")


def group_segments(segments: Sequence[Segment], groups: int) -> list[list[Segment]]:
    """Consecutive segments in at most ``groups`` groups of about equal bytes."""
    if not segments:
        return []
    total = sum(max(1, s.size) for s in segments)
    out: list[list[Segment]] = [[]]
    acc = 0
    for s in segments:
        if out[-1] and acc >= total * len(out) / groups and len(out) < groups:
            out.append([])
        out[-1].append(s)
        acc += max(1, s.size)
    return out
