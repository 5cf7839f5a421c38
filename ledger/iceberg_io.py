"""Iceberg file locations over the project's storage, and a pyiceberg ``FileIO`` that writes
through it.

An Iceberg table names every file by a location string; here it is what ``str()`` of a
:class:`~ledger.storage.StoragePath` gives: an absolute local path, or ``s3://bucket/key``.
Engines open those locations themselves (DuckDB, Spark, pyiceberg's own FileIO), so a table's
locations must be the real ones, never keys relative to the storage root.

pyiceberg's Avro writers (manifests, manifest lists) and readers need a ``FileIO``;
:class:`StorageFileIO` adapts a :class:`~ledger.storage.Storage`, so that what the table
writer produces is written the way every file of the project is: on a local disk under a
temporary name, fsynced and renamed; on S3 one upload once the file is complete.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import BinaryIO

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream

from ledger.storage import Storage, StoragePath


def location(path: StoragePath) -> str:
    """The location an Iceberg table names ``path`` by."""
    return str(path)


def path_at(storage: Storage, where: str) -> StoragePath:
    """The file of ``storage`` at Iceberg location ``where`` (the inverse of :func:`location`);
    ``ValueError`` for a location outside the storage."""
    if storage.local:
        if where.startswith("file://"):
            where = where[len("file://") :]
        prefix = storage.root.rstrip("/") + "/"
        if not where.startswith(prefix):
            raise ValueError(f"{where!r} is not under the storage root {storage.root!r}")
        return storage.at(where[len(prefix) :])
    for scheme in ("s3://", "s3a://"):
        if where.startswith(scheme):
            rest = where[len(scheme) :]
            break
    else:
        raise ValueError(f"{where!r} is not an s3:// location of {storage.url!r}")
    prefix = storage.root.rstrip("/") + "/"
    if not rest.startswith(prefix):
        raise ValueError(f"{where!r} is not under the storage root s3://{storage.root}")
    return storage.at(rest[len(prefix) :])


class _Input(InputFile):
    def __init__(self, path: StoragePath) -> None:
        super().__init__(location(path))
        self._path = path

    def __len__(self) -> int:
        return self._path.size()

    def exists(self) -> bool:
        return self._path.is_file()

    def open(self, seekable: bool = True) -> InputStream:
        return self._path.open()  # type: ignore[no-any-return]


class _Stream(OutputStream):
    """A file being written: stored whole when closed (``Storage.writer``'s guarantee)."""

    def __init__(self, path: StoragePath) -> None:
        self._context: contextlib.AbstractContextManager[BinaryIO] = path.writer()
        self._out = self._context.__enter__()
        self._closed = False
        self.written = 0

    def write(self, b: bytes) -> int:
        self.written += len(b)
        return self._out.write(b)

    def tell(self) -> int:
        return self.written

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._context.__exit__(None, None, None)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(
        self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None
    ) -> None:
        if self._closed:
            return
        self._closed = True
        # An error: nothing is stored under the name.
        self._context.__exit__(exctype, excinst, exctb)


class _Output(OutputFile):
    def __init__(self, path: StoragePath) -> None:
        super().__init__(location(path))
        self._path = path
        self._stream: _Stream | None = None

    def __len__(self) -> int:
        if self._stream is not None:
            return self._stream.written
        return self._path.size()

    def exists(self) -> bool:
        return self._path.is_file()

    def to_input_file(self) -> InputFile:
        return _Input(self._path)

    def create(self, overwrite: bool = False) -> OutputStream:
        # Table files get unique names: one that exists already is a bug, not a retry.
        if self._path.is_file():
            raise FileExistsError(self.location)
        self._stream = _Stream(self._path)
        return self._stream


class StorageFileIO(FileIO):
    """pyiceberg's view of a :class:`Storage`: locations as :func:`location` makes them."""

    def __init__(self, storage: Storage) -> None:
        super().__init__()
        self.storage = storage

    def new_input(self, location: str) -> InputFile:
        return _Input(path_at(self.storage, location))

    def new_output(self, location: str) -> OutputFile:
        return _Output(path_at(self.storage, location))

    def delete(self, location: str | InputFile | OutputFile) -> None:
        where = location if isinstance(location, str) else location.location
        path_at(self.storage, where).unlink()
