"""Phase one of the Arrow path: each group's **partial**, which its task writes for the others.

Each task (:func:`group_latest`, one per group: ``compactor.arrow_phases.phase_one``) reads the
narrow columns (ids, key, tombstone flag, publish time when delete retention needs it) of its
group's new segments and finds each key's last row there, i.e. its latest id within the group
(Arrow's ordered ``last`` aggregation over rows in id order, folded every few million rows so
memory is bounded by the keys). It writes that **partial** -- key, id, tombstone flag -- to the
round's scratch directory as an Arrow IPC file. Keys are compared exactly; nothing is hashed
into an id.

A partial is put in place whole (a task may be waiting for it: :func:`_write_partial`); it is
read memory-mapped on a local disk, and whole, in one request, from object storage
(:func:`_read_partial`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from compactor.round_plan import RoundPlan, _attempt_path
from compactor.segments import _bool_numpy, _chunks, _opened_ahead
from ledger.schema import ENTRY_ID, IS_TOMBSTONE, KEY, LEDGER_ID, PUBLISH_TIME

# Columns of a partial (phase one's output per group).
P_KEY, P_ID, P_TOMBSTONE, P_PUBLISH_TIME = KEY, "id", "tombstone", "publish_time"
# Phase one's running aggregate without delete retention: ``id << 1 | tombstone``, for ids
# below this bound (ledger ids below 2**30).
_ENCODED = "id_tombstone"
_ENCODABLE_IDS = 1 << 62
# Fold the running per-key winners with the rows read since, past this many rows.
_FOLD_ROWS = 2_000_000


def _partial_schema(with_publish_time: bool) -> pa.Schema:
    fields = [pa.field(P_KEY, pa.string()), pa.field(P_ID, pa.int64()), pa.field(P_TOMBSTONE, pa.bool_())]
    if with_publish_time:
        fields.append(pa.field(P_PUBLISH_TIME, pa.int64()))
    return pa.schema(fields)


def _latest_encoded(schema: pa.Schema, tables: Iterator[pa.Table]) -> pa.Table:
    """Each key's greatest encoded id over ``tables`` (``schema``: key, encoded id), as one
    streaming hash aggregation: each chunk is folded into one hash table as it is decoded, so
    memory holds the keys' winners and a chunk, not every chunk of the group (which, with
    long keys, is hundreds of megabytes the kernel must first hand over, and costs more to
    get than to aggregate)."""
    batches = (batch for table in tables for batch in table.to_batches())
    reader = pa.RecordBatchReader.from_batches(schema, batches)
    plan = acero.Declaration.from_sequence(
        [
            acero.Declaration("record_batch_reader_source", acero.RecordBatchReaderSourceNodeOptions(reader)),
            acero.Declaration(
                "aggregate",
                acero.AggregateNodeOptions([(_ENCODED, "hash_max", None, _ENCODED)], keys=[P_KEY]),
            ),
        ]
    )
    return plan.to_table(use_threads=False).select([P_KEY, _ENCODED]).cast(schema)


def _partial(plan: RoundPlan, group: int) -> tuple[pa.Table, int]:
    """Group ``group``'s partial -- each key's latest row among the group's new segments
    (key, id, tombstone flag[, publish time]), plus every live keyless row when keyless rows
    are retained (key null: they are never deduplicated) -- and how many rows it read."""
    retention = plan.keep_tombstones_since is not None
    schema = _partial_schema(retention)
    columns = [LEDGER_ID, ENTRY_ID, KEY, IS_TOMBSTONE] + ([PUBLISH_TIME] if retention else [])
    segments = [s for s in plan.groups[group] if not s.previous]
    # Without delete retention, a key's latest row is its greatest ``id << 1 | tombstone``:
    # one column and a plain hash "max", which costs half of the ordered "last" of each column.
    encoded = not retention and all(s.hi < _ENCODABLE_IDS for s in segments)
    folding = pa.schema([pa.field(P_KEY, pa.string()), pa.field(_ENCODED, pa.int64())]) if encoded else schema
    keyless: list[pa.Table] = []
    rows_read = 0

    def narrow() -> Iterator[pa.Table]:
        """The rows to aggregate, chunk by chunk (keyless rows kept aside on the way)."""
        nonlocal rows_read
        for segment, opened in _opened_ahead(segments, columns):
            for table, ids in _chunks(segment, columns, opened=opened):
                rows_read += table.num_rows
                keys = table.column(KEY)
                tombstone = table.column(IS_TOMBSTONE)
                if keys.null_count and plan.retain_null_key:
                    live = _bool_numpy(keys.is_null()) & ~_bool_numpy(tombstone)
                    keyless.append(
                        pa.table(
                            [keys, pa.array(ids, pa.int64()), tombstone]
                            + ([table.column(PUBLISH_TIME)] if retention else []),
                            schema=schema,
                        ).filter(pa.array(live))
                    )
                # Keyless rows stay in: they aggregate into one group of key null, dropped once
                # at the end -- cheaper than filtering them out of every chunk.
                if encoded:
                    yield pa.table(
                        [keys, pa.array((ids << 1) | _bool_numpy(tombstone), pa.int64())], schema=folding
                    )
                else:
                    yield pa.table(
                        [keys, pa.array(ids, pa.int64()), tombstone]
                        + ([table.column(PUBLISH_TIME)] if retention else []),
                        schema=schema,
                    )

    folded: pa.Table | None
    if encoded:
        folded = _latest_encoded(folding, narrow())
    else:
        folded = None
        pending: list[pa.Table] = []
        pending_rows = 0

        def fold(tables: list[pa.Table]) -> pa.Table:
            # Rows in id order and one thread: "last" is each key's row with the latest id.
            rows = pa.concat_tables(tables)
            agg = rows.group_by(P_KEY, use_threads=False).aggregate([(n, "last") for n in schema.names[1:]])
            return pa.table(
                [agg.column(P_KEY), *(agg.column(f"{n}_last") for n in schema.names[1:])], schema=schema
            )

        for rows in narrow():
            pending.append(rows)
            pending_rows += rows.num_rows
            if pending_rows >= _FOLD_ROWS:
                folded = fold([folded, *pending] if folded is not None else pending)
                pending, pending_rows = [], 0
        if pending:
            folded = fold([folded, *pending] if folded is not None else pending)
    if folded is not None and folded.column(P_KEY).null_count:
        folded = folded.filter(pc.is_valid(folded.column(P_KEY)))
    if encoded and folded is not None:
        v = np.asarray(folded.column(_ENCODED).to_numpy(), dtype=np.int64)
        folded = pa.table(
            [folded.column(P_KEY), pa.array(v >> 1, pa.int64()), pa.array((v & 1).astype(bool))],
            schema=schema,
        )
    parts = ([folded] if folded is not None else []) + keyless
    return (pa.concat_tables(parts) if parts else schema.empty_table()), rows_read


def group_latest(plan: RoundPlan, group: int) -> int:
    """Runs in a task: write group ``group``'s partial (see :func:`_partial`) to the scratch
    directory. Returns how many rows it read."""
    partial, rows_read = _partial(plan, group)
    _write_partial(plan, group, partial)
    return rows_read


def _write_partial(plan: RoundPlan, group: int, partial: pa.Table) -> None:
    """``partial`` as group ``group``'s partial file, seen whole or not at all (a reader may
    be waiting for it: see ``arrow_phases._latest_then_write``)."""
    schema = partial.schema
    target = plan.partial_path(group)
    local = target.local
    if local is None:
        with target.writer() as out, pa.ipc.new_file(out, schema) as writer:
            writer.write_table(partial)
        return
    tmp = _attempt_path(local, plan.scratch_dir)
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(partial)
    os.replace(tmp, local)  # scratch: no fsync, a crash discards the round


def _read_partial(plan: RoundPlan, group: int, columns: list[str]) -> pa.Table:
    """Group ``group``'s partial (``FileNotFoundError`` if it has none): memory-mapped on a
    local disk, read whole in one request from object storage."""
    path = plan.partial_path(group)
    local = path.local
    if local is None:
        return pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all().select(columns)
    with pa.memory_map(str(local)) as source:
        return pa.ipc.open_file(source).read_all().select(columns)
