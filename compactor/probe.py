"""A delta round's probe, in its tasks: the older layers' rows that the round's new keys supersede.

A delta round copies no row of the older layers: the rows that die are marked in their layers'
deletion vectors (by the driver: ``compactor.deltas``). The tasks find them in the older parts'
key indexes alone, never the parts (:func:`probe`), each task an equal share of their rows
(:func:`probe_tasks`), on a thread of its own beside its group's work (:func:`_beside_probe`);
the rows found come back in the tasks' results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.round_plan import IndexedPart, KeySets, RoundPlan
from compactor.segments import _bool_numpy
from ledger import key_index

T = TypeVar("T")

# Indexed rows per task of a delta round's probe (see probe_tasks). A task probes beside its
# own writing, on a thread of its own (see _beside_probe), so below this another task (about
# 20 ms of Spark's on 2 cores) costs more than it takes off the probe (~50 ns a row).
PROBE_ROWS = 1_000_000


def probe_tasks(indexed: Sequence[IndexedPart], cores: int, probe_rows: int = PROBE_ROWS) -> int:
    """How many tasks share a delta round's probe: one per ``probe_rows`` indexed rows, at
    most one per core, at least one (none when nothing is indexed)."""
    if not indexed:
        return 0
    rows = sum(p.rows for p in indexed)
    return max(1, min(cores, -(-rows // probe_rows)))


def _probe_slices(plan: RoundPlan, share: int) -> Iterator[tuple[IndexedPart, int, int]]:
    """Share ``share``'s run of the indexed rows (all parts' rows in order, cut into
    ``probe_tasks`` equal runs): ``(part, first, stop)`` row ranges within parts."""
    total = sum(p.rows for p in plan.indexed)
    lo, hi = total * share // plan.probe_tasks, total * (share + 1) // plan.probe_tasks
    at = 0
    for part in plan.indexed:
        first, stop = max(lo - at, 0), min(hi - at, part.rows)
        if first < stop:
            yield part, first, stop
        at += part.rows


def probe(plan: RoundPlan, share: int, new_keys: Sequence[pa.Array]) -> dict[int, np.ndarray]:
    """Runs in a task of a delta round: the rows of the older layers that die, within the
    task's share of their key indexes (:func:`_probe_slices`), as layer row numbers by layer,
    for the driver to fold into deletion vectors (see ``round_plan.TaskResult``).

    A row dies when one of ``new_keys`` (every group's new keys, tombstones included) is its
    key: every new row of a key is newer than every older layer's row. Rows no longer kept
    whatever the new keys die too: tombstones past their retention, and keyless rows once
    keyless rows are not retained. Only the key indexes are read, never the parts. Each row is
    in exactly one share, so the tasks probe the indexes once between them.
    """
    chunks = [k for k in new_keys if len(k)]
    wanted = pc.drop_null(pa.concat_arrays(chunks)) if chunks else pa.array([], pa.string())
    found: dict[int, list[np.ndarray]] = {}
    for part, first, stop in _probe_slices(plan, share):
        whole = key_index.read_cached(part.keys, rows=part.rows, checksum=part.checksum)
        index = whole.slice(first, stop - first)
        keys = index.column(key_index.KEY)
        dead = np.zeros(index.num_rows, dtype=bool)
        if len(wanted):
            dead |= _bool_numpy(pc.is_in(keys, value_set=wanted, skip_nulls=True))
        dead |= key_index.dead_tombstones(index, plan.keep_tombstones_since)
        if not plan.retain_null_key and keys.null_count:
            dead |= _bool_numpy(keys.is_null())
        rows = np.flatnonzero(dead)
        if len(rows):
            found.setdefault(part.layer, []).append(rows + part.first_row + first)
    return {layer: np.concatenate(rows) for layer, rows in found.items()}


def _beside_probe(
    plan: RoundPlan, group: int, key_sets: KeySets, work: Callable[[], T]
) -> tuple[T | None, dict[int, np.ndarray]]:
    """``work()``, the task's own group's (None for a task that only probes), while the
    task's share of a delta round's probe (if it has one) runs on a thread of its own, and
    the rows that share found dead. Both spend their time in pyarrow's kernels, which release
    the GIL, so a small delta round's task (one group, often the round's only task) keeps two
    cores busy instead of one."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe") as side:
        probing = side.submit(_probe_all, plan, group, key_sets) if group < plan.probe_tasks else None
        done = work() if group < len(plan.groups) else None
        dead = probing.result() if probing is not None else {}
    return done, dead


def _probe_all(plan: RoundPlan, share: int, key_sets: KeySets) -> dict[int, np.ndarray]:
    """:func:`probe` of share ``share`` against every group's new keys."""
    return probe(plan, share, [k for h in range(len(plan.groups)) if (k := key_sets(h)) is not None])
