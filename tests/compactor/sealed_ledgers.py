"""What the compactor tests build their topics from: sealed ledgers' rows as the broker writes
them, and the job of a round over some of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compactor import CompactionJob, CompactionResult
from ledger.entry import Position, is_delete
from ledger.storage import StoragePath

Msg = tuple[str | None, bytes | None]  # key, value (None = tombstone)


def ledger_rows(
    ledger_id: int, messages: Sequence[Msg], properties: Sequence[dict[str, str]] | None = None
) -> list[dict[str, Any]]:
    """Ledger ``ledger_id``'s rows: message ``i`` published at ``1000 * ledger_id + i``, with an
    event time and properties (``{"seq": i}`` unless given) that differ from row to row."""
    return [
        {
            "ledger_id": ledger_id,
            "entry_id": i,
            "key": key,
            "value": value,
            "is_tombstone": is_delete(key, value),
            "properties": list((properties[i] if properties else {"seq": str(i)}).items()),
            "publish_time": 1000 * ledger_id + i,
            "event_time": (7 * ledger_id * 31 + i * 13) % 97,
        }
        for i, (key, value) in enumerate(messages)
    ]


def compaction_job(
    root: Path | StoragePath,
    ledgers: Mapping[int, Path | StoragePath],
    ids: Sequence[int],
    output: int,
    horizon: Position,
    previous: CompactionResult | None = None,
    **kw: Any,
) -> CompactionJob:
    """The job of a round over ledgers ``ids`` of the topic at ``root`` up to ``horizon``, after
    the ``previous`` round's compacted ledger if any, into ledger ``output``."""
    return CompactionJob(
        topic_root=root,  # type: ignore[arg-type]
        inputs=[ledgers[i] for i in ids],  # type: ignore[misc]
        input_ledger_ids=list(ids),
        previous_compacted=previous.directory if previous else None,
        previous_horizon=previous.horizon if previous else None,
        horizon=horizon,
        output_ledger_id=output,
        **kw,
    )
