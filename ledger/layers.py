"""The manifest of a compacted ledger: immutable layers, their parts and deletion vectors.

A compacted ledger is one manifest, ``compacted-{ledger_id:020d}/_manifest.json``, over
**layers**, the way Delta Lake and Iceberg keep a table:

- a **base**: the latest record of every key up to some horizon, as part files;
- zero or more **deltas**, one per later round: the latest record per key of that round's
  new messages, as part files (each delta's ids are above the previous horizon);
- per layer, an optional **deletion vector** (``ledger.deletion_vectors``): the rows a newer
  layer superseded, or that stopped being kept (a tombstone past its retention, a keyless row
  once keyless rows are no longer retained).

Invariants (checked on load where they can be):

- every part's rows are in message-id order, and every part's ids follow the previous part's,
  across layers too: the live rows of the layers, read in layer order, are in message-id order;
- among the live rows, a key appears at most once;
- files are never changed once a manifest names them. A round writes its new parts, key
  indexes and deletion vectors into its own directory and names the older layers' files where
  they are (``dir``: a sibling ``compacted-*`` directory), so several manifests share files.

``_manifest.json`` (version 2)::

    {"version": 2,
     "layers": [
       {"dir": "compacted-00000000000000000007", "kind": "base",
        "parts": [{"name": "part-00000.parquet", "rows": 123, "first": "L:E", "last": "L:E",
                   "size": 4567, "checksum": "crc32c:1a2b3c4d",
                   "keys": "part-00000.keys.arrow", "keys_checksum": "crc32c:..."}, ...],
        "deletes": {"dir": "compacted-00000000000000000009", "name": "deletes-...07.npy", "count": 12,
                    "checksum": "crc32c:..."}},
       {"dir": "compacted-00000000000000000009", "kind": "delta", "parts": [...], "deletes": null}]}

Integrity (``ledger.checksums``): every file a manifest names carries its whole-file CRC32C
(``checksum`` of a part, ``keys_checksum`` of its key index, ``checksum`` of a deletion vector),
and the manifest's own CRC32C is recorded in the metadata database, so the chain database ->
manifest -> files covers every byte of a layered ledger. Manifests written before checksums
carry none (``None`` here): their files are decoded with every check instead.

Entries are dicts so that fields can be added (a reader ignores fields it does not know).
Version 1 (written before layers: ``{"version": 1, "parts": [...]}``) is read as one base
layer in the manifest's own directory, without key indexes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ledger.checksums import MANIFEST, MISSING, IntegrityError, crc32c_bytes
from ledger.entry import Position
from ledger.files import TMP_SUFFIX, fsync_dir
from ledger.storage import StoragePath

MANIFEST_NAME = "_manifest.json"
MANIFEST_VERSION = 2
BASE, DELTA = "base", "delta"
_NAME = re.compile(r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]*$")

# A directory as the caller names it: a local path, or a directory of a storage. Files under
# it are named the same way (a Path under a Path, a StoragePath under a StoragePath).
Where = TypeVar("Where", Path, StoragePath)


def _under(root: Where, *names: str) -> Where:
    for name in names:
        root = root / name
    return root


class CompactedLedgerError(IntegrityError, ValueError):
    """A compacted ledger directory is incomplete or its contents break the contract (its
    manifest or a part does not agree with what the manifest says): damage, too."""

    def __init__(self, path: Path | StoragePath, message: str, check: str = MANIFEST) -> None:
        super().__init__(path, check, message)


def _dir(value: object) -> str:
    # A sibling directory: a plain name, never a path (``..`` cannot match).
    return _name(value)


def _checksum(value: object) -> str | None:
    return str(value) if value is not None else None


def _name(value: object) -> str:
    text = str(value)
    if not _NAME.match(text):
        raise ValueError(f"not a file name: {text!r}")
    return text


@dataclass(frozen=True, slots=True)
class PartInfo:
    """One non-empty part file: its rows hold ids ``first`` .. ``last`` (inclusive), in order;
    ``keys`` names its key index (``ledger.key_index``), if it has one; the checksums are the
    CRC32C of the part and of its key index (None in manifests written before checksums)."""

    name: str
    rows: int
    first: Position
    last: Position
    size: int
    keys: str | None = None
    checksum: str | None = None
    keys_checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "rows": self.rows,
            "first": str(self.first),
            "last": str(self.last),
            "size": self.size,
        }
        if self.checksum is not None:
            out["checksum"] = self.checksum
        if self.keys is not None:
            out["keys"] = self.keys
        if self.keys_checksum is not None:
            out["keys_checksum"] = self.keys_checksum
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PartInfo:
        keys = obj.get("keys")
        return cls(
            name=_name(obj["name"]),
            rows=int(obj["rows"]),
            first=Position.parse(obj["first"]),
            last=Position.parse(obj["last"]),
            size=int(obj["size"]),
            keys=_name(keys) if keys is not None else None,
            checksum=_checksum(obj.get("checksum")),
            keys_checksum=_checksum(obj.get("keys_checksum")),
        )


@dataclass(frozen=True, slots=True)
class Deletes:
    """A layer's deletion vector: file ``name`` in directory ``dir``, ``count`` dead rows, and
    the file's CRC32C (None in manifests written before checksums)."""

    dir: str
    name: str
    count: int
    checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dir": self.dir, "name": self.name, "count": self.count}
        if self.checksum is not None:
            out["checksum"] = self.checksum
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Deletes:
        return cls(
            dir=_dir(obj["dir"]),
            name=_name(obj["name"]),
            count=int(obj["count"]),
            checksum=_checksum(obj.get("checksum")),
        )


@dataclass(frozen=True, slots=True)
class LayerFile:
    """One file a manifest names: in directory ``dir`` (a sibling ``compacted-*``), with its
    recorded CRC32C (None: written before checksums) and, for a part, its size."""

    dir: str
    name: str
    checksum: str | None
    size: int | None = None

    def path(self, topic_root: Where) -> Where:
        return _under(topic_root, self.dir, self.name)


@dataclass(frozen=True, slots=True)
class Layer:
    """Parts written by one round (in directory ``dir``), and the rows of them now dead."""

    dir: str
    kind: str
    parts: tuple[PartInfo, ...]
    deletes: Deletes | None = None

    @property
    def rows(self) -> int:
        """Rows stored, dead ones included."""
        return sum(p.rows for p in self.parts)

    @property
    def dead(self) -> int:
        return self.deletes.count if self.deletes is not None else 0

    @property
    def live(self) -> int:
        return self.rows - self.dead

    @property
    def indexed(self) -> bool:
        """Whether every part has a key index (a round can then find superseded rows)."""
        return all(p.keys is not None for p in self.parts)

    def part_starts(self) -> list[int]:
        """The layer row number of each part's first row (rows are numbered across parts)."""
        out, at = [], 0
        for p in self.parts:
            out.append(at)
            at += p.rows
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": self.dir,
            "kind": self.kind,
            "parts": [p.to_json() for p in self.parts],
            "deletes": self.deletes.to_json() if self.deletes is not None else None,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Layer:
        kind = str(obj["kind"])
        if kind not in (BASE, DELTA):
            raise ValueError(f"unknown layer kind {kind!r}")
        deletes = obj.get("deletes")
        return cls(
            dir=_dir(obj["dir"]),
            kind=kind,
            parts=tuple(PartInfo.from_json(p) for p in obj["parts"]),
            deletes=Deletes.from_json(deletes) if deletes is not None else None,
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """The layers of a compacted ledger, in reading (= message-id) order."""

    layers: tuple[Layer, ...]

    @property
    def parts(self) -> tuple[PartInfo, ...]:
        """Every part of every layer, in reading order (see :meth:`part_paths` for where)."""
        return tuple(p for layer in self.layers for p in layer.parts)

    @property
    def entries(self) -> int:
        """Live records: what a reader sees."""
        return sum(layer.live for layer in self.layers)

    @property
    def rows(self) -> int:
        """Stored rows, dead ones included."""
        return sum(layer.rows for layer in self.layers)

    @property
    def dead(self) -> int:
        return sum(layer.dead for layer in self.layers)

    @property
    def deltas(self) -> int:
        return sum(1 for layer in self.layers if layer.kind == DELTA)

    @property
    def size_bytes(self) -> int:
        """Bytes of the part files (dead rows included: they are on disk)."""
        return sum(p.size for p in self.parts)

    @property
    def first_position(self) -> Position | None:
        """The first stored id (dead or not); ``CompactedLedger`` has the first live one."""
        parts = self.parts
        return parts[0].first if parts else None

    @property
    def last_position(self) -> Position | None:
        parts = self.parts
        return parts[-1].last if parts else None

    def part_paths(self, topic_root: Where) -> list[Where]:
        """Where every part is, in reading order (``topic_root``: the directory holding the
        topic's ``compacted-*`` directories)."""
        return [_under(topic_root, layer.dir, p.name) for layer in self.layers for p in layer.parts]

    def files(self) -> set[str]:
        """Every file the manifest names, as ``dir/name`` relative to the topic root (the
        manifest file itself is not among them)."""
        out: set[str] = set()
        for layer in self.layers:
            for p in layer.parts:
                out.add(f"{layer.dir}/{p.name}")
                if p.keys is not None:
                    out.add(f"{layer.dir}/{p.keys}")
            if layer.deletes is not None:
                out.add(f"{layer.deletes.dir}/{layer.deletes.name}")
        return out

    def checked_files(self) -> list[LayerFile]:
        """Every file the manifest names with its recorded checksum, in reading order: each
        layer's parts and their key indexes, then its deletion vector (what a scrub verifies)."""
        out: list[LayerFile] = []
        for layer in self.layers:
            for p in layer.parts:
                out.append(LayerFile(layer.dir, p.name, p.checksum, p.size))
                if p.keys is not None:
                    out.append(LayerFile(layer.dir, p.keys, p.keys_checksum))
            if layer.deletes is not None:
                out.append(LayerFile(layer.deletes.dir, layer.deletes.name, layer.deletes.checksum))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "layers": [layer.to_json() for layer in self.layers]}

    @classmethod
    def from_json(cls, obj: dict[str, Any], *, own_dir: str) -> Manifest:
        version = obj.get("version")
        if version == 1:
            parts = tuple(PartInfo.from_json(p) for p in obj["parts"])
            return cls(layers=(Layer(dir=own_dir, kind=BASE, parts=parts),) if parts else ())
        if version != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {version!r}")
        return cls(layers=tuple(Layer.from_json(layer) for layer in obj["layers"]))

    @classmethod
    def load(cls, directory: Path | str | StoragePath, *, checksum: str | None = None) -> Manifest:
        """Read ``directory/_manifest.json`` (a local directory or one of a storage); raises
        :class:`CompactedLedgerError` if missing or bad, or if ``checksum`` is given and the
        file's CRC32C is not it."""
        directory = directory if isinstance(directory, StoragePath) else Path(directory)
        path = directory / MANIFEST_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CompactedLedgerError(
                path, "no manifest: the compacted ledger is incomplete", MISSING
            ) from None
        if checksum is not None and (actual := crc32c_bytes(data)) != checksum:
            raise CompactedLedgerError(path, f"recorded {checksum}, the manifest has {actual}")
        try:
            manifest = cls.from_json(json.loads(data.decode("utf-8")), own_dir=final_name(directory))
        except (ValueError, KeyError, TypeError) as e:
            raise CompactedLedgerError(path, f"bad manifest: {e}") from e
        check_order(path, manifest.parts)
        for layer in manifest.layers:
            if layer.dead > layer.rows or layer.dead < 0:
                raise CompactedLedgerError(path, f"layer {layer.dir}: {layer.dead} dead of {layer.rows} rows")
        return manifest

    def write(self, directory: Path | StoragePath) -> None:
        """Write the manifest into ``directory`` durably and atomically: on a local disk under a
        temporary name, fsynced, renamed, and the directory fsynced; on object storage (no
        rename) uploaded whole once written, or not at all. The files it names must be
        durable already."""
        local = directory.local if isinstance(directory, StoragePath) else Path(directory)
        check_order(directory, self.parts)
        if local is None:
            assert isinstance(directory, StoragePath)
            with (directory / MANIFEST_NAME).writer() as out:
                out.write(self._text().encode("utf-8"))
            return
        path = local / MANIFEST_NAME
        tmp = path.with_name(path.name + TMP_SUFFIX)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(self._text())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(local)

    def _text(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def with_layer(self, layer: Layer | None) -> Manifest:
        """This manifest plus ``layer`` on top (``None`` or a layer without parts: unchanged)."""
        if layer is None or not layer.parts:
            return self
        return replace(self, layers=(*self.layers, layer))


def final_name(directory: Path | str | StoragePath) -> str:
    """The name a compacted ledger directory has once in place (without the temporary suffix)."""
    name = directory.name if isinstance(directory, StoragePath) else Path(directory).name
    return name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name


def check_order(where: Path | StoragePath, parts: Iterable[PartInfo]) -> None:
    """Every part non-empty, with a sane range, each starting after the previous one ends."""
    prev: PartInfo | None = None
    for p in parts:
        if p.rows <= 0 or p.last < p.first:
            raise CompactedLedgerError(where, f"part {p.name}: bad range {p.first}..{p.last} ({p.rows} rows)")
        if prev is not None and not prev.last < p.first:
            raise CompactedLedgerError(
                where, f"part {p.name} starts at {p.first}, not after {prev.name} which ends at {prev.last}"
            )
        prev = p
