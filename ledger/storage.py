"""Where ledger files are kept, behind one interface: a local directory or an S3-compatible
bucket, chosen by a storage URL (``/data`` or ``file:///data``; ``s3://bucket/prefix``).

Both are pyarrow filesystems (``LocalFileSystem``, ``S3FileSystem``) under one code path; what
differs is how a write becomes durable and visible, which :class:`Storage` hides:

* **local**: a file is written under a temporary name, fsynced, renamed into place and its
  directory fsynced, so a reader sees all of it or nothing, after a crash too;
* **S3**: an object store has no rename, no fsync and no directories. An object is visible
  once its upload completes, and pyarrow completes an upload when its stream is closed, even
  when an exception left it half written (and when a stream is dropped unclosed). So a write
  is kept aside (in memory, then in a temporary file past :data:`SPOOL_BYTES`) until the
  caller's block ends without error, and only then uploaded; an upload that fails is deleted
  (best effort: a key that is published by no metadata is an orphan, which the scrub removes).

Keys are ``/``-separated paths relative to the storage's root; the layout above them is
``ledger.paths``'s. Nothing here is published by being written: the metadata commit that names
a key is what publishes it (so a key is written once, and a writer that may have been fenced
writes under a key of its own).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ledger.files import TMP_SUFFIX, fsync_dir

#: How much of an upload is kept in memory before the rest goes to a temporary file.
SPOOL_BYTES = 64 << 20
#: Read size of an upload from its spool.
_UPLOAD_CHUNK = 8 << 20


class StorageError(Exception):
    """A storage URL or its settings that cannot be used (raised when the storage is made)."""


@dataclass(frozen=True)
class StoredFile:
    """A file (an object) found by :meth:`Storage.list`."""

    key: str
    size: int
    mtime_ms: int | None = None  # when it was last written, where the storage says


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible service; ``None`` leaves a value to AWS's own chain
    (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, the instance's role)."""

    endpoint_url: str | None = None
    region: str | None = None
    # Never in a repr: settings are logged, and shipped to Spark's tasks inside a round's plan.
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)


class Storage:
    """The files of one storage root; safe to share between threads (pyarrow's filesystems
    are). Made by :func:`open_storage`."""

    def __init__(
        self, url: str, fs: pafs.FileSystem, root: str, *, local: bool, s3: S3Settings | None = None
    ) -> None:
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/")
        self.local = local
        self.s3 = s3

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def __reduce__(self) -> tuple[object, tuple[str, S3Settings | None]]:
        # Spark ships a round's storage to its tasks: they open it again from its URL and
        # settings (once per process, see open_storage), never from a pickled connection.
        return (open_storage, (self.url, self.s3))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Storage) and (self.url, self.s3) == (other.url, other.s3)

    def __hash__(self) -> int:
        return hash((self.url, self.s3))

    def at(self, key: str = "") -> StoragePath:
        """``key`` (a file or a directory; ``""``: the root) as a :class:`StoragePath`."""
        return StoragePath(self, key.strip("/"))

    def local_path(self, key: str) -> Path | None:
        """Where ``key`` is on this machine's disk (None on object storage)."""
        return Path(self._prefix(key)) if self.local else None

    # ------------------------------------------------------------------ names

    def path(self, key: str) -> str:
        """The filesystem path of ``key`` (what pyarrow and Spark's tasks open)."""
        key = key.strip("/")
        if not key or any(part in ("", ".", "..") for part in key.split("/")):
            raise ValueError(f"invalid storage key {key!r}")
        if self.local:
            return f"{self.root}/{key}"  # "" is the file system's root
        return f"{self.root}/{key}" if self.root else key

    def _prefix(self, prefix: str) -> str:
        """The path of a directory's key; ``""`` is the root."""
        return self.path(prefix) if prefix.strip("/") else (self.root or "/" if self.local else self.root)

    def _key(self, path: str) -> str:
        return path[len(self.root) + 1 :] if self.root or self.local else path

    # ------------------------------------------------------------------ reading

    def open(self, key: str) -> pa.NativeFile:
        """``key`` for random access (a Parquet reader's source); ``FileNotFoundError`` if
        there is none."""
        return self.fs.open_input_file(self.path(key))

    def read(self, key: str) -> bytes:
        with self.open(key) as f:
            return f.read()  # type: ignore[no-any-return]

    def size(self, key: str) -> int | None:
        """The size of ``key`` in bytes; None if there is none."""
        info = self.fs.get_file_info(self.path(key))
        return None if info.type != pafs.FileType.File else int(info.size)

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def list(self, prefix: str) -> list[StoredFile]:
        """Every file under ``prefix`` (a directory's key; ``""``: the root), at any depth,
        by key."""
        selector = pafs.FileSelector(self._prefix(prefix), recursive=True, allow_not_found=True)
        found = [
            StoredFile(self._key(i.path), int(i.size), None if i.mtime_ns is None else i.mtime_ns // 10**6)
            for i in self.fs.get_file_info(selector)
            if i.type == pafs.FileType.File
        ]
        return sorted(found, key=lambda f: f.key)

    # ------------------------------------------------------------------ writing

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as ``key``, durable and whole when this returns."""
        with self.writer(key) as out:
            out.write(data)

    @contextlib.contextmanager
    def writer(self, key: str) -> Iterator[BinaryIO]:
        """A stream to write ``key`` with: stored, durable and whole, when the block ends
        without an error; nothing under ``key`` when it raises."""
        if self.local:
            with self._local_writer(self.path(key)) as out:
                yield out
            return
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            yield spool  # type: ignore[misc]
            spool.seek(0)
            self._upload(self.path(key), spool)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _local_writer(self, path: str) -> Iterator[BinaryIO]:
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(Path(parent))

    def _upload(self, path: str, source: IO[bytes]) -> None:
        try:
            with self.fs.open_output_stream(path) as out:
                while chunk := source.read(_UPLOAD_CHUNK):
                    out.write(chunk)
        except BaseException:
            # pyarrow completes a cut-off upload with the parts it sent: take it back.
            with contextlib.suppress(Exception):
                self.fs.delete_file(path)
            raise

    # ------------------------------------------------------------------ deleting

    def delete(self, key: str) -> None:
        """Remove ``key`` if it exists."""
        path = self.path(key)
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            return
        if self.local:
            fsync_dir(Path(os.path.dirname(path)))

    def delete_prefix(self, prefix: str) -> None:
        """Remove every file under ``prefix`` (a directory's key; ``""``: everything), and
        the directory."""
        path = self._prefix(prefix)
        if not prefix.strip("/") and not self.local:
            # The root itself stays: pyarrow would delete the bucket, or keep the prefix's marker.
            for found in self.list(prefix):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.delete_file(self.path(found.key))
            return
        # On S3 this removes the objects under the prefix and pyarrow's zero-byte markers of
        # the directories it emulates (which deleting the files one by one would leave).
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(path)


_OPENED: dict[tuple[str, S3Settings | None], Storage] = {}
_OPENED_LOCK = threading.Lock()


def open_storage(url: str, s3: S3Settings | None = None) -> Storage:
    """The storage a URL names: a local directory (a path, or ``file://``) or an S3 bucket
    with an optional prefix (``s3://bucket/prefix``). ``StorageError`` for a URL of another
    kind; an S3 bucket that cannot be reached is found by :func:`check_storage`.

    One :class:`Storage` per URL and settings in a process: a Spark task unpickles its round's
    storage many times, and an S3 client is costly to make (its connections are reused)."""
    with _OPENED_LOCK:
        found = _OPENED.get((url, s3))
        if found is None:
            found = _OPENED[(url, s3)] = _open(url, s3)
        return found


def _open(url: str, s3: S3Settings | None) -> Storage:
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        root = os.path.abspath(parsed.path if parsed.scheme else url)
        return Storage(url, pafs.LocalFileSystem(), root, local=True)
    if parsed.scheme != "s3":
        raise StorageError(f"storage URL {url!r}: a local path, file:// or s3://bucket/prefix")
    if not parsed.netloc:
        raise StorageError(f"storage URL {url!r} names no bucket (s3://bucket/prefix)")
    given, s3 = s3, s3 or S3Settings()
    options: dict[str, object] = {
        "region": s3.region or os.environ.get("AWS_REGION") or "us-east-1",
        # An upload smaller than a part is one PutObject (not a multipart upload of three
        # requests), and an output stream is opened without a request.
        "allow_delayed_open": True,
    }
    if s3.endpoint_url:
        endpoint = urlparse(s3.endpoint_url)
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise StorageError(f"S3 endpoint {s3.endpoint_url!r}: an http:// or https:// URL")
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
    if s3.access_key or s3.secret_key:
        options.update(access_key=s3.access_key, secret_key=s3.secret_key)
    try:
        fs = pafs.S3FileSystem(**options)  # type: ignore[arg-type]
    except (pa.ArrowException, ValueError) as e:
        raise StorageError(f"storage URL {url!r}: {e}") from None
    root = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
    return Storage(url, fs, root, local=False, s3=given)


@dataclass(frozen=True, slots=True)
class StoragePath:
    """A file or a directory of a :class:`Storage`, used as ``pathlib.Path`` is: joined with
    ``/``, named, read, written and deleted, on whichever backend holds it. Picklable (a
    Spark task gets its files so). ``str()`` names it for people: the local path, or
    ``s3://bucket/key``.

    Writing is all-or-nothing (see the module's docstring). A file that a writer must produce
    on local disk first (a Parquet writer that spills, Spark's own output) is written to
    :meth:`staging` and made this file by :meth:`publish`: on a local disk an fsync and a
    rename beside it, on object storage an upload."""

    storage: Storage
    key: str

    # ------------------------------------------------------------------ names

    def __truediv__(self, name: str) -> StoragePath:
        return StoragePath(self.storage, f"{self.key}/{name}" if self.key else name)

    def __str__(self) -> str:
        return self.fs_path if self.storage.local else f"s3://{self.fs_path}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StoragePath:
        return StoragePath(self.storage, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def with_name(self, name: str) -> StoragePath:
        return self.parent / name

    @property
    def fs(self) -> pafs.FileSystem:
        return self.storage.fs

    @property
    def fs_path(self) -> str:
        """The path pyarrow's filesystem (:attr:`fs`) knows it by."""
        return self.storage._prefix(self.key)

    @property
    def local(self) -> Path | None:
        """Where it is on this machine's disk; None on object storage."""
        return Path(self.fs_path) if self.storage.local else None

    # ------------------------------------------------------------------ reading

    def open(self) -> pa.NativeFile:
        """For random access (a Parquet reader's source); ``FileNotFoundError`` if missing."""
        return self.storage.open(self.key)

    def read_bytes(self) -> bytes:
        return self.storage.read(self.key)

    def size(self) -> int:
        """Its size in bytes; ``FileNotFoundError`` if there is no such file."""
        found = self.storage.size(self.key)
        if found is None:
            raise FileNotFoundError(str(self))
        return found

    def exists(self) -> bool:
        """Whether it is a file, or a directory holding one."""
        return self.storage.exists(self.key) or self.is_dir()

    def is_file(self) -> bool:
        return self.storage.exists(self.key)

    def is_dir(self) -> bool:
        info = self.fs.get_file_info(self.fs_path)
        if info.type == pafs.FileType.Directory:
            return self.storage.local or bool(self.storage.list(self.key))
        return False

    def files(self) -> list[StoragePath]:
        """The files directly in this directory, by name."""
        selector = pafs.FileSelector(self.fs_path, recursive=False, allow_not_found=True)
        found = [self / i.base_name for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File]
        return sorted(found, key=lambda p: p.name)

    def dirs(self) -> list[StoragePath]:
        """The directories directly in this directory, by name."""
        selector = pafs.FileSelector(self.fs_path, recursive=False, allow_not_found=True)
        found = [
            self / i.base_name for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.Directory
        ]
        return sorted(found, key=lambda p: p.name)

    # ------------------------------------------------------------------ writing

    def writer(self) -> contextlib.AbstractContextManager[BinaryIO]:
        """:meth:`Storage.writer` of this file."""
        return self.storage.writer(self.key)

    def write_bytes(self, data: bytes | bytearray | memoryview) -> None:
        self.storage.put(self.key, data)

    def staging(self) -> Path:
        """A local file to write this file's bytes to, then :meth:`publish` (or
        :meth:`unstage`): beside it on a local disk, named after it (a rename then moves it;
        a writer that crashed left its staging file there, which the next one overwrites and
        recovery sweeps), in the temporary directory otherwise."""
        local = self.local
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
            return local.with_name(local.name + TMP_SUFFIX)
        fd, name = tempfile.mkstemp(prefix="compactor-", suffix=TMP_SUFFIX)
        os.close(fd)
        return Path(name)

    def publish(
        self, staged: Path, *, synced: bool = False, keep: Callable[[StoragePath, Path], bool] | None = None
    ) -> None:
        """Make the staged file this file, durable and whole (``synced``: its bytes were
        fsynced already); the staged file is gone afterwards, whether this succeeds or not,
        unless ``keep`` (asked once an upload to object storage succeeded) takes it."""
        kept = False
        try:
            local = self.local
            if local is not None:
                if not synced:
                    with open(staged, "rb") as f:
                        os.fsync(f.fileno())
                os.replace(staged, local)
                fsync_dir(local.parent)
                return
            with open(staged, "rb") as f:
                self.storage._upload(self.fs_path, f)
            kept = keep is not None and keep(self, staged)
        finally:
            if not kept:
                unstage(staged)

    def unlink(self, missing_ok: bool = True) -> None:
        if not missing_ok and not self.is_file():
            raise FileNotFoundError(str(self))
        self.storage.delete(self.key)

    def rmdir(self) -> None:
        """Remove this directory if it is empty (on S3: the zero-byte marker pyarrow leaves
        for a directory whose last file it deleted)."""
        local = self.local
        if local is not None:
            with contextlib.suppress(OSError):  # not empty, or gone
                local.rmdir()
        elif not self.storage.list(self.key):
            with contextlib.suppress(OSError):
                self.fs.delete_dir(self.fs_path)

    def delete_tree(self) -> None:
        """Remove this directory and everything in it (nothing if there is none)."""
        self.storage.delete_prefix(self.key)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is object storage failing to answer (the endpoint down or refusing,
    a request timing out, the service busy), not a file's bytes being bad nor a file missing:
    pyarrow raises those as an ``OSError`` without errno, naming the AWS error."""
    return isinstance(exc, OSError) and exc.errno is None and "AWS Error" in str(exc)


def as_storage_path(path: Path | str | StoragePath) -> StoragePath:
    """``path`` as a :class:`StoragePath`: one already is; a local path is a file of the local
    disk's root storage (so its ``str()`` is the absolute path it was)."""
    if isinstance(path, StoragePath):
        return path
    return open_storage("/").at(os.path.abspath(path).lstrip("/"))


def unstage(staged: Path) -> None:
    """Remove a staged file that will not be published."""
    with contextlib.suppress(OSError):
        os.unlink(staged)


def check_storage(storage: Storage) -> None:
    """Write, read back and delete a probe object under the root: ``StorageError`` in one
    line when the storage cannot be used (no such bucket, credentials refused, endpoint down)."""
    key = f"probe-{uuid.uuid4().hex}"
    try:
        storage.put(key, b"probe")
        if storage.read(key) != b"probe":
            raise StorageError(f"{storage.url}: a probe object read back differs from what was written")
        storage.delete(key)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"{storage.url} cannot be used: {first}") from None
