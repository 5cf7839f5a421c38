"""Recovery of a write-ahead file on open (:meth:`ledger.wal.WriteAheadLog.open`): create it
if missing, rewrite a torn header, scan its frames, and cut it at the first bad one.

On open, recovery keeps every whole record with a good CRC and the next entry id, and cuts
the file at the first bad one. The cut bytes are kept in a quarantine file next to the log,
never simply thrown away.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from ledger import format as fmt
from ledger.files import O_CLOEXEC, QUARANTINE_SUFFIX, TMP_SUFFIX, fsync_dir, pread_exact, pwrite_all
from ledger.format import CorruptRecordError
from ledger.framed_entries import FrameIndex, check_frame
from ledger.open_log import Recovery

__all__ = ["recover"]

log = logging.getLogger(__name__)

_COPY_CHUNK = 1 << 20


def recover(path: Path, ledger_id: int) -> tuple[int, Recovery, FrameIndex]:
    """Open ledger ``ledger_id``'s write-ahead file at ``path`` for reading and writing,
    creating it if missing, and recover it (see :meth:`ledger.wal.WriteAheadLog.open`): its
    descriptor (the caller's to close), what recovery found and did, and the index of the
    frames it kept."""
    header = fmt.encode_header(ledger_id)
    created = header_rewritten = False
    if not path.exists():
        _create_file(path, header)
        created = True

    fd = os.open(path, os.O_RDWR | O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < fmt.HEADER_SIZE:
            torn = pread_exact(fd, size, 0)
            if not (header.startswith(torn) or torn.count(0) == len(torn)):
                raise CorruptRecordError(
                    path, 0, f"file is {size} bytes, shorter than a header, and not a torn header"
                )
            os.close(fd)
            fd = -1
            log.warning("%s: torn file header (%d bytes), rewriting it", path, size)
            _create_file(path, header)
            header_rewritten = True
            fd = os.open(path, os.O_RDWR | O_CLOEXEC)
            size = fmt.HEADER_SIZE
        found_id = fmt.decode_header(pread_exact(fd, fmt.HEADER_SIZE, 0), path)
        if found_id != ledger_id:
            raise CorruptRecordError(
                path, len(fmt.MAGIC), f"file belongs to ledger {found_id}, expected ledger {ledger_id}"
            )

        scan = _scan(fd, path, ledger_id, size)
        quarantine: Path | None = None
        good_end = scan.index.bounds[-1]
        if scan.reason is not None:
            quarantine = _quarantine(fd, path, good_end, size)
            os.ftruncate(fd, good_end)
            log.warning(
                "%s: bad record at offset %d (%s); kept %d entries, moved %d bytes to %s",
                path,
                good_end,
                scan.reason,
                scan.index.entries,
                size - good_end,
                quarantine,
            )
        # Entries found on open count as acknowledged, but a previous process running
        # under "never" may have left them in the page cache only.
        os.fsync(fd)
        recovery = Recovery(
            entries=scan.index.entries,
            truncated_bytes=size - good_end if scan.reason is not None else 0,
            quarantine_path=quarantine,
            truncated_at=good_end if scan.reason is not None else None,
            reason=scan.reason,
            created=created,
            header_rewritten=header_rewritten,
        )
        return fd, recovery, scan.index
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


@dataclass(slots=True)
class _Scan:
    index: FrameIndex
    reason: str | None  # why the frame at bounds[-1] was rejected; None if the file ended cleanly


def _scan(fd: int, path: Path, ledger_id: int, size: int) -> _Scan:
    """Walk the frames after the header; stop at the end of the file or the first bad frame."""
    index = FrameIndex(array("q", [fmt.HEADER_SIZE]))
    offset = fmt.HEADER_SIZE
    reason: str | None = None
    with open(fd, "rb", buffering=_COPY_CHUNK, closefd=False) as f:
        f.seek(offset)
        while offset < size:
            head = f.read(fmt.FRAME_HEADER_SIZE)
            if len(head) < fmt.FRAME_HEADER_SIZE:
                reason = f"torn frame header ({len(head)} of {fmt.FRAME_HEADER_SIZE} bytes)"
                break
            length, crc = fmt.decode_frame_header(head)
            real = length & ~fmt.BATCH_FRAME
            if not fmt.body_length_is_sane(real):
                reason = f"implausible frame length {length}"
                break
            if offset + fmt.FRAME_HEADER_SIZE + real > size:
                reason = f"frame of {real} bytes runs past the end of the file ({size})"
                break
            body = f.read(real)
            checked = check_frame(body, length, crc, ledger_id, index.entries)
            if isinstance(checked, str):
                reason = checked
                break
            offset += fmt.FRAME_HEADER_SIZE + real
            index.add_checked(offset, checked)
    return _Scan(index, reason)


def _create_file(path: Path, header: bytes) -> None:
    """Put a file holding only ``header`` at ``path``, crash-safely (tmp, fsync, rename)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, header, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _quarantine(fd: int, path: Path, start: int, end: int) -> Path:
    """Copy bytes ``[start, end)`` of the log into a new quarantine file; return its path."""
    target = path.with_name(f"{path.name}{QUARANTINE_SUFFIX}-{time.time_ns()}")
    tmp = target.with_name(target.name + TMP_SUFFIX)
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        pos = start
        while pos < end:
            chunk = os.pread(fd, min(_COPY_CHUNK, end - pos), pos)
            if not chunk:
                break
            pwrite_all(out, chunk, pos - start)
            pos += len(chunk)
        os.fsync(out)
    finally:
        os.close(out)
    os.replace(tmp, target)
    # The quarantine file must be durable before the log is truncated, or a crash in between
    # could lose the bytes in both places.
    fsync_dir(path.parent)
    return target
