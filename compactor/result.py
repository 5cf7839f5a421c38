"""What a compaction is asked to do, and what it did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ledger.compacted_store import Manifest
from ledger.entry import Position


@dataclass(frozen=True)
class CompactionJob:
    """One compaction round of one topic.

    Input: the previous compacted ledger (whole: its records are all at or before
    ``previous_horizon``) plus the rows of the sealed original ledgers ``inputs`` with ids in
    ``(previous_horizon, horizon]``. Output: the compacted ledger ``output_ledger_id``
    under ``topic_root``.
    """

    topic_root: Path
    inputs: list[Path]
    input_ledger_ids: list[int]
    previous_compacted: Path | None
    previous_horizon: Position | None
    horizon: Position
    output_ledger_id: int
    retain_null_key: bool = False
    # Which record of a key wins: "offset" (latest id), "eventTime", or "property:<name>".
    strategy: str = "offset"
    # A winning tombstone published within this many ms before ``now_ms`` is kept (0: dropped).
    delete_retention_ms: int = 0
    now_ms: int = 0
    # Layers (``ledger.layers``): an incremental round adds a delta while the previous ledger
    # has fewer than ``max_deltas`` deltas and its dead rows are under ``consolidation_ratio``
    # of its stored rows; otherwise it consolidates every layer into a new base (0: always).
    max_deltas: int = 8
    consolidation_ratio: float = 0.5

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.input_ledger_ids):
            raise ValueError("inputs and input_ledger_ids must have the same length")
        if self.previous_horizon is not None and self.horizon < self.previous_horizon:
            raise ValueError(f"horizon {self.horizon} is before the previous horizon {self.previous_horizon}")
        if self.delete_retention_ms < 0:
            raise ValueError("delete_retention_ms must be >= 0")
        if self.max_deltas < 0 or not 0 < self.consolidation_ratio <= 1:
            raise ValueError("max_deltas must be >= 0 and consolidation_ratio in (0, 1]")
        if self.output_ledger_id <= 0:
            raise ValueError(f"output_ledger_id must be positive, got {self.output_ledger_id}")


@dataclass
class CompactionResult:
    """The new compacted ledger and the run's statistics (the caller commits it)."""

    horizon: Position
    ledger_id: int
    directory: Path
    entries_read: int
    records_kept: int
    records_removed: int
    bytes_in: int
    bytes_out: int
    phase_one_ms: int
    phase_two_ms: int
    manifest: Manifest = field(repr=False)
