"""Pulsar's frames, pure: bytes in, commands out, and back. No sockets, no service.

A frame is ``u32 total_size | u32 command_size | BaseCommand`` (a simple frame), or that
followed by ``u16 magic 0x0e01 | u32 crc32c | u32 metadata_size | MessageMetadata | payload``
(a payload frame: SEND from a producer, MESSAGE to a consumer). The checksum covers everything
after itself. All integers are big-endian. ``total_size`` counts every byte after itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from google.protobuf.message import DecodeError

from api.pulsar import pulsar_api_pb2 as pb

MAGIC_CRC32C = 0x0E01
# Room for a frame's command and metadata beyond the largest message a client may send
# (Pulsar's Commands.MESSAGE_SIZE_FRAME_PADDING).
FRAME_PADDING = 10 * 1024

_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">II")
_PAYLOAD_HEAD = struct.Struct(">HI")


class FrameError(Exception):
    """A frame that breaks the protocol: the connection that sent it is closed."""


class ChecksumMismatch(FrameError):
    """A payload frame whose CRC32C does not match (Pulsar answers ChecksumError)."""


@dataclass(slots=True)
class Frame:
    """One decoded frame: its command, and for a payload frame the message metadata and the
    payload (``metadata`` is None for a simple frame)."""

    command: pb.BaseCommand
    metadata: pb.MessageMetadata | None = None
    payload: bytes = b""
    # The metadata as it came (a batch is stored with it, as sent).
    raw_metadata: bytes = b""


class FrameDecoder:
    """Cuts a byte stream into frames. ``feed`` takes whatever the socket gave and returns the
    whole frames it completes; a partial frame waits for the next bytes. A frame larger than
    ``max_frame_size`` is refused as soon as its size is read, before its body is buffered, so
    a connection holds at most one frame's worth of memory."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        offset = 0
        n = len(buf)
        while n - offset >= 4:
            (total,) = _U32.unpack_from(buf, offset)
            if total > self.max_frame_size:
                raise FrameError(f"frame of {total} bytes is over the limit of {self.max_frame_size}")
            if total < 4:
                raise FrameError(f"frame size {total} is too small to hold a command")
            end = offset + 4 + total
            if end > n:
                break
            frames.append(parse_frame(memoryview(buf)[offset + 4 : end]))
            offset = end
        if offset:
            del buf[:offset]
        return frames


def parse_frame(body: memoryview) -> Frame:
    """One frame without its leading total size."""
    total = len(body)
    (cmd_size,) = _U32.unpack_from(body, 0)
    if cmd_size > total - 4:
        raise FrameError(f"command size {cmd_size} runs past the frame ({total} bytes)")
    command = pb.BaseCommand()
    try:
        command.ParseFromString(body[4 : 4 + cmd_size])
    except DecodeError as e:
        raise FrameError(f"the command does not parse: {e}") from None
    if not command.IsInitialized():
        raise FrameError(
            f"the command lacks required fields: {', '.join(command.FindInitializationErrors())}"
        )
    rest = 4 + cmd_size
    if rest == total:
        return Frame(command)
    if total - rest < _PAYLOAD_HEAD.size + 4:
        raise FrameError("a payload frame too short for its magic, checksum and metadata size")
    magic, checksum = _PAYLOAD_HEAD.unpack_from(body, rest)
    if magic != MAGIC_CRC32C:
        raise FrameError(f"unknown payload magic 0x{magic:04x}")
    checked = body[rest + _PAYLOAD_HEAD.size :]
    if crc32c.crc32c(checked) != checksum:
        raise ChecksumMismatch("the payload's CRC32C does not match")
    (meta_size,) = _U32.unpack_from(checked, 0)
    if meta_size > len(checked) - 4:
        raise FrameError(f"metadata size {meta_size} runs past the frame")
    metadata = pb.MessageMetadata()
    raw = bytes(checked[4 : 4 + meta_size])
    try:
        metadata.ParseFromString(raw)
    except DecodeError as e:
        raise FrameError(f"the message metadata does not parse: {e}") from None
    if not metadata.IsInitialized():
        raise FrameError(f"the message metadata lacks {', '.join(metadata.FindInitializationErrors())}")
    return Frame(command, metadata, bytes(checked[4 + meta_size :]), raw)


def encode(command: pb.BaseCommand) -> bytes:
    """A simple frame."""
    cmd = command.SerializeToString()
    return _HEAD.pack(4 + len(cmd), len(cmd)) + cmd


def encode_payload(command: pb.BaseCommand, metadata: bytes, payload: bytes) -> bytes:
    """A payload frame of ``command`` with serialized ``metadata`` and ``payload``."""
    cmd = command.SerializeToString()
    meta_head = _U32.pack(len(metadata))
    checksum = crc32c.crc32c(payload, crc32c.crc32c(metadata, crc32c.crc32c(meta_head)))
    total = 4 + len(cmd) + _PAYLOAD_HEAD.size + 4 + len(metadata) + len(payload)
    return b"".join(
        (
            _HEAD.pack(total, len(cmd)),
            cmd,
            _PAYLOAD_HEAD.pack(MAGIC_CRC32C, checksum),
            meta_head,
            metadata,
            payload,
        )
    )


def command(kind: int, **fields: object) -> pb.BaseCommand:
    """``BaseCommand(type=kind)`` with the one field its type names set from ``fields``:
    ``command(pb.BaseCommand.PONG)``, ``command(pb.BaseCommand.SUCCESS, request_id=7)``."""
    base = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
    name = FIELD_OF[kind]
    getattr(base, name).SetInParent()
    for key, value in fields.items():
        target = getattr(base, name)
        if isinstance(value, list):
            getattr(target, key).extend(value)
        elif hasattr(value, "SerializeToString"):
            getattr(target, key).CopyFrom(value)
        else:
            setattr(target, key, value)
    return base


def _field_of_type() -> dict[int, str]:
    """Each command type's field of BaseCommand: the field whose number is the type's (Pulsar
    numbers them alike)."""
    by_number = {f.number: f.name for f in pb.BaseCommand.DESCRIPTOR.fields}
    return {v.number: by_number[v.number] for v in pb.BaseCommand.Type.DESCRIPTOR.values}


FIELD_OF: dict[int, str] = _field_of_type()
