"""A delta round, on the driver: whether an incremental round adds a delta layer, the older parts
whose key indexes its tasks probe (``compactor.probe``), and the older layers' deletion vectors
once the tasks have found the rows that die.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from compactor.result import CompactionJob
from compactor.round_plan import IndexedPart
from ledger import deletion_vectors, prefetch
from ledger.compacted_store import Manifest
from ledger.layers import Deletes, Layer, final_name
from ledger.storage import StoragePath


def _copy_or(job: CompactionJob, path: StoragePath) -> StoragePath:
    """The local copy the job names for ``path`` (a file of the previous compacted ledger), or
    ``path`` itself."""
    return job.local_copies.get(str(path), path)


def adds_a_delta(job: CompactionJob, manifest: Manifest | None) -> bool:
    """Whether an incremental round on top of ``manifest`` writes a delta layer, rather than
    consolidating every layer into a new base: every layer has key indexes, and neither
    the deltas nor the dead rows have reached the job's bounds (``max_deltas``,
    ``consolidation_ratio`` of the stored rows)."""
    if manifest is None or not manifest.layers or job.max_deltas <= 0:
        return False
    return (
        all(layer.indexed for layer in manifest.layers)
        and manifest.deltas < job.max_deltas
        and manifest.dead < job.consolidation_ratio * manifest.rows
    )


def indexed_parts(job: CompactionJob, manifest: Manifest) -> tuple[IndexedPart, ...]:
    """The parts of ``manifest``'s layers whose key indexes a delta round's tasks probe, each
    with its layer and the layer row number of its first row."""
    root = job.previous_compacted.parent  # type: ignore[union-attr]
    return tuple(
        IndexedPart(
            keys=_copy_or(job, root / layer.dir / part.keys),  # type: ignore[operator]
            layer=i,
            first_row=start,
            rows=part.rows,
            checksum=part.keys_checksum,
        )
        for i, layer in enumerate(manifest.layers)
        for part, start in zip(layer.parts, layer.part_starts(), strict=True)
    )


def fold_deletes(
    job: CompactionJob, manifest: Manifest, dead: dict[int, np.ndarray], work: StoragePath
) -> Manifest:
    """The older layers after a delta round: each layer that lost rows gets a new deletion
    vector (its old one's bits and the new ones) written into the round's directory
    ``work``; a layer with no live row left is dropped. Old files are never changed."""
    root = job.previous_compacted.parent  # type: ignore[union-attr]

    def fold(i: int) -> Layer | None:
        """Layer ``i`` as it is after the round (None: no live row left)."""
        layer = manifest.layers[i]
        rows = dead.get(i)
        if rows is None or not len(rows):
            return layer
        if layer.deletes is not None:
            vector = deletion_vectors.read(
                _copy_or(job, root / layer.deletes.dir / layer.deletes.name),
                layer.rows,
                checksum=layer.deletes.checksum,
            )
        else:
            vector = deletion_vectors.empty(layer.rows)
        vector[rows] = True
        count = int(np.count_nonzero(vector))
        if count == layer.dead:
            return layer
        if count == layer.rows:
            return None
        name = f"deletes-{layer.dir}.npy"
        checksum = deletion_vectors.write(work / name, vector)
        deletes = Deletes(dir=final_name(work), name=name, count=count, checksum=checksum)
        return replace(layer, deletes=deletes)

    # On object storage each layer's vector is two round trips (the old one read, the new one
    # stored): the layers are folded at once.
    folded = prefetch.each(fold, range(len(manifest.layers)), at_once=work.local is None)
    layers = [layer for layer in folded if layer is not None]
    return Manifest(layers=tuple(layers))
