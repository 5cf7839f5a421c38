"""What a compaction is asked to do, and what it did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ledger.compacted_store import Manifest
from ledger.entry import Position
from ledger.storage import StoragePath, as_storage_path
from ledger.value_columns import ValueSchema


@dataclass(frozen=True)
class CompactionJob:
    """One compaction round of one topic.

    Input: the previous compacted ledger (whole: its records are all at or before
    ``previous_horizon``) plus the rows of the sealed original ledgers ``inputs`` with ids in
    ``(previous_horizon, horizon]``. Output: the compacted ledger ``output_ledger_id``
    under ``topic_root``.

    Files and directories are ``StoragePath`` objects (on a local disk or in a bucket); a
    local ``Path`` given for one is taken as the same file of the local disk's storage.
    """

    topic_root: StoragePath
    inputs: list[StoragePath]
    input_ledger_ids: list[int]
    previous_compacted: StoragePath | None
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
    # Files of the previous compacted ledger (key indexes, deletion vectors) to read from a
    # local copy instead, by the object's name (``str``): the service's verified copies.
    local_copies: Mapping[str, StoragePath] = field(default_factory=dict)
    # The previous compacted ledger's manifest, where the caller holds it (verified when it was
    # read): the round does not read it again.
    previous_manifest: Manifest | None = field(default=None, compare=False, repr=False)
    # The whole-file CRC32C (``"crc32c:xxxxxxxx"``) of input ledgers, by ledger id, where the
    # caller knows it (recorded at sealing): a task that decodes most of such a file checks the
    # whole file against it rather than every page it decodes (``ledger.prefetch``).
    input_checksums: Mapping[int, str] = field(default_factory=dict)
    # A table topic's JSON or Avro schema (its latest version): the value's fields become
    # typed columns of the parts the round writes (``ledger.value_columns``). None otherwise.
    value_schema: ValueSchema | None = None

    def __post_init__(self) -> None:
        # Frozen: the coerced values are set as the dataclass's own __init__ sets them.
        object.__setattr__(self, "topic_root", as_storage_path(self.topic_root))
        object.__setattr__(self, "inputs", [as_storage_path(p) for p in self.inputs])
        if self.previous_compacted is not None:
            object.__setattr__(self, "previous_compacted", as_storage_path(self.previous_compacted))
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
    """The new compacted ledger (``directory``: in place and complete, published by the
    caller's commit) and the run's statistics."""

    horizon: Position
    ledger_id: int
    directory: StoragePath
    entries_read: int
    records_kept: int
    records_removed: int
    bytes_in: int
    bytes_out: int
    phase_one_ms: int
    phase_two_ms: int
    manifest: Manifest = field(repr=False)

    def __post_init__(self) -> None:
        self.directory = as_storage_path(self.directory)
