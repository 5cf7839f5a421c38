"""Phase two of the Arrow path: a group's winners, and its part written from them.

A key's latest row overall is its row in the *last* group that has the key, because groups are
in id order. So task ``g`` (:func:`group_write`, one per group:
``compactor.arrow_phases.phase_two``) keeps the rows of its partial whose key appears in no
later group's partial (an exact set membership over the later partials' key columns), drops
tombstones (unless delete retention keeps them), and reads the full rows of its segments,
keeping exactly those ids (``compactor.parts.write_part``). It takes the key column from the
partial rather than decoding it again. The previous compacted ledger's rows (incremental
rounds) are kept by key: unless a new row of the key exists.

Here the later groups' keys are read from their partials (:func:`_partial_keys`); a task that
runs both phases gets them otherwise (see ``compactor.arrow_phases``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactor.parts import write_part
from compactor.phase_one import P_ID, P_KEY, P_PUBLISH_TIME, P_TOMBSTONE, _read_partial
from compactor.probe import _beside_probe
from compactor.round_plan import KeySets, RoundPlan, TaskResult, _cached
from compactor.segments import _bool_numpy


def _publish_time(plan: RoundPlan) -> list[str]:
    return [P_PUBLISH_TIME] if plan.keep_tombstones_since is not None else []


def _partial_keys(plan: RoundPlan) -> KeySets:
    """Key sets read from the partials phase one wrote."""

    def keys(h: int) -> pa.Array | None:
        try:
            return _read_partial(plan, h, [P_KEY]).column(P_KEY).combine_chunks()
        except FileNotFoundError:
            return None

    return _cached(keys)


def _in_any(keys: pa.ChunkedArray, key_sets: KeySets, groups: Iterable[int]) -> np.ndarray:
    """Which of ``keys`` appear in the key set of any of ``groups`` (null keys never do).
    One key set in memory at a time."""
    found = np.zeros(len(keys), dtype=bool)
    for h in groups:
        if not len(keys):
            break
        other = key_sets(h)
        if other is not None and len(other):
            found |= _bool_numpy(pc.is_in(keys, value_set=other, skip_nulls=True))
    return found


def _winners(plan: RoundPlan, group: int, own: pa.Table, key_sets: KeySets) -> pa.Table:
    """The rows of ``group``'s partial ``own`` that are their key's latest overall and are
    kept (key, id), sorted by id."""
    keep = ~_bool_numpy(own.column(P_TOMBSTONE))
    if plan.keep_tombstones_since is not None:
        # Kafka's delete.retention.ms: a recent delete stays visible to slow readers.
        published = np.asarray(own.column(P_PUBLISH_TIME).to_numpy(), dtype=np.int64)
        keep |= published >= plan.keep_tombstones_since
    # A key in a later group has a later row there.
    keep &= ~_in_any(own.column(P_KEY), key_sets, range(group + 1, len(plan.groups)))
    # One gather of the kept rows in id order (with long keys, copying keys is the cost: a
    # filter before the sort would copy them twice). Ids are unique, so a sort that is not
    # stable orders them exactly, at a quarter of a stable sort's cost.
    rows = np.flatnonzero(keep)
    ids = np.asarray(own.column(P_ID).to_numpy(), dtype=np.int64)[rows]
    return own.select([P_KEY, P_ID]).take(pa.array(rows[np.argsort(ids)]))


def _write_group(plan: RoundPlan, group: int, own: pa.Table, key_sets: KeySets) -> TaskResult:
    """Resolve group ``group``'s winners (its partial ``own`` against the later key sets)
    and write its part (see :func:`write_part`)."""
    winners = _winners(plan, group, own, key_sets)
    wanted = np.asarray(winners.column(P_ID).to_numpy(), dtype=np.int64)

    def superseded(keys: pa.ChunkedArray) -> np.ndarray:
        # A previous row is replaced by any new row of its key: this group's or a later one's.
        return _in_any(keys, key_sets, range(group, len(plan.groups)))

    return write_part(plan, group, wanted, winners.column(P_KEY), superseded)


def group_write(plan: RoundPlan, group: int) -> TaskResult:
    """Runs in a task: phase two of group ``group`` from the partials phase one wrote, beside
    the task's share of a delta round's probe (if any)."""
    key_sets = _partial_keys(plan)

    def write() -> TaskResult:
        own = _read_partial(plan, group, [P_KEY, P_ID, P_TOMBSTONE] + _publish_time(plan))
        return _write_group(plan, group, own, key_sets)

    written, dead = _beside_probe(plan, group, key_sets, write)
    return replace(written or TaskResult(), dead=dead)
