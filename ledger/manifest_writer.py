"""What a compaction round ends with: the part files it wrote described as a layer (their
rows, id ranges, sizes, checksums and key indexes: :func:`describe_parts`), and the manifest
over them written (:func:`write_manifest`). The layout of a compacted ledger is in
:mod:`ledger.compacted_store`, which reads it; the manifest's in :mod:`ledger.layers`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ledger import key_index, prefetch
from ledger.checksums import READ_OPTIONS, file_checksum
from ledger.entry import Position
from ledger.layers import BASE, DELTA, Layer, Manifest, PartInfo, check_order, final_name
from ledger.schema import ENTRY_ID, LEDGER_ID
from ledger.storage import StoragePath, as_storage_path

__all__ = ["PART_GLOB", "describe_parts", "write_manifest"]

PART_GLOB = "part-*.parquet"
_PART_NUMBER = re.compile(r"^part-(\d+)")
_ID_COLUMNS = [LEDGER_ID, ENTRY_ID]


def _part_sort_key(name: str) -> tuple[int, str]:
    # Spark names parts part-00000-..., part-00001-...; past 99999 the number grows a digit,
    # so order by the number first and the name second.
    m = _PART_NUMBER.match(name)
    return (int(m.group(1)) if m else -1, name)


def _id_at(pf: pq.ParquetFile, row_group: int, row: int) -> Position:
    ids = pf.read_row_group(row_group, columns=_ID_COLUMNS)
    return Position(ids.column(0)[row].as_py(), ids.column(1)[row].as_py())


def _describe_part(path: StoragePath, size: int, *, indexed: bool) -> PartInfo | None:
    """The manifest line of one part (``size`` bytes): its checksum (the whole file read once),
    its id range from the id columns of its first and last row group, and its key index with
    that file's checksum, if one was written beside it (``indexed``)."""
    checksum = file_checksum(path)
    with pq.ParquetFile(path.fs_path, filesystem=path.fs, **READ_OPTIONS) as pf:  # type: ignore[arg-type]
        meta = pf.metadata
        non_empty = [i for i in range(meta.num_row_groups) if meta.row_group(i).num_rows > 0]
        if not non_empty:
            return None
        first_rg, last_rg = non_empty[0], non_empty[-1]
        first = _id_at(pf, first_rg, 0)
        last = _id_at(pf, last_rg, meta.row_group(last_rg).num_rows - 1)
    keys = key_index.index_name(path.name)
    return PartInfo(
        name=path.name,
        rows=meta.num_rows,
        first=first,
        last=last,
        size=size,
        keys=keys if indexed else None,
        checksum=checksum,
        keys_checksum=file_checksum(path.parent / keys) if indexed else None,
    )


def describe_parts(
    directory: Path | str | StoragePath, *, kind: str = BASE, described: Mapping[str, PartInfo] | None = None
) -> Layer:
    """The part files of ``directory`` as one layer (in file-name order, empty parts left out),
    named by the directory's final name. Raises :class:`CompactedLedgerError` if the parts'
    id ranges are not strictly increasing. ``described``: parts' lines as their writers made
    them, by name, used for a part whose file and key index have the sizes the line says
    (the others are read to be described)."""
    directory = as_storage_path(directory)
    # One listing for the names and sizes (on object storage, one request instead of two per part).
    selector = pafs.FileSelector(directory.fs_path, recursive=False, allow_not_found=True)
    sizes = {
        found.base_name: int(found.size)
        for found in directory.fs.get_file_info(selector)
        if found.type == pafs.FileType.File
    }
    names = sorted((n for n in sizes if fnmatch.fnmatchcase(n, PART_GLOB)), key=_part_sort_key)

    def describe(name: str) -> PartInfo | None:
        known = (described or {}).get(name)
        if known is not None and known.size == sizes[name] and known.keys in sizes:
            return known
        return _describe_part(directory / name, sizes[name], indexed=key_index.index_name(name) in sizes)

    # On object storage each part costs round trips (its bytes for the checksum, its footer,
    # its key index): the parts are described at once.
    found = prefetch.each(describe, names, at_once=directory.local is None)
    parts = [info for info in found if info is not None]
    check_order(directory, parts)
    return Layer(dir=final_name(directory), kind=kind, parts=tuple(parts))


def write_manifest(
    directory: Path | str | StoragePath,
    *,
    below: Manifest | None = None,
    described: Mapping[str, PartInfo] | None = None,
) -> Manifest:
    """Describe the part files of ``directory`` as a layer (see :func:`describe_parts`) and
    write the manifest atomically (see :meth:`Manifest.write`): a base layer alone, or with
    ``below`` (the layers this round keeps, with their deletion vectors) the new layer as a
    delta on top of them.

    The part files, key indexes and deletion vectors must already be durable (the caller
    fsyncs them on a local disk; an object is durable once uploaded).
    """
    directory = as_storage_path(directory)
    if below is None:
        manifest = Manifest(layers=()).with_layer(describe_parts(directory, described=described))
    else:
        kind = DELTA if below.layers else BASE
        manifest = below.with_layer(describe_parts(directory, kind=kind, described=described))
    manifest.write(directory)
    return manifest
