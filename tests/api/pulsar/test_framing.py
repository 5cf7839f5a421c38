"""Pulsar's frames, encoded and cut apart without a socket."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import pytest

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import (
    ChecksumMismatch,
    FrameDecoder,
    FrameError,
    command,
    encode,
    encode_payload,
)

PULSAR = Path(__file__).resolve().parents[3] / "api" / "pulsar"


def _send_frame(payload: bytes = b"hello", key: str = "k") -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1, partition_key=key)
    return encode_payload(
        command(pb.BaseCommand.SEND, producer_id=1, sequence_id=3), md.SerializeToString(), payload
    )


def test_a_simple_frame_is_sizes_then_the_command() -> None:
    data = encode(command(pb.BaseCommand.PING))
    total, size = struct.unpack(">II", data[:8])
    assert total == len(data) - 4 and size == len(data) - 8
    frames = FrameDecoder(1024).feed(data)
    assert [f.command.type for f in frames] == [pb.BaseCommand.PING]
    assert frames[0].metadata is None


def test_a_payload_frame_round_trips_with_its_checksum() -> None:
    data = _send_frame(b"value bytes")
    (frame,) = FrameDecoder(1024).feed(data)
    assert frame.command.send.sequence_id == 3
    assert frame.metadata is not None and frame.metadata.partition_key == "k"
    assert frame.payload == b"value bytes"
    # The checksum covers the metadata size, the metadata and the payload (Pulsar's CRC32C).
    cmd_size = struct.unpack(">I", data[4:8])[0]
    magic, checksum = struct.unpack(">HI", data[8 + cmd_size : 14 + cmd_size])
    assert magic == 0x0E01
    assert checksum == crc32c.crc32c(data[14 + cmd_size :])


def test_frames_split_anywhere_and_glued_together_decode_alike() -> None:
    stream = (
        encode(command(pb.BaseCommand.PING)) + _send_frame(b"x" * 100) + encode(command(pb.BaseCommand.PONG))
    )
    for cut in range(1, len(stream)):
        decoder = FrameDecoder(4096)
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [f.command.type for f in frames] == [
            pb.BaseCommand.PING,
            pb.BaseCommand.SEND,
            pb.BaseCommand.PONG,
        ]
        assert frames[1].payload == b"x" * 100
        assert decoder.buffered == 0


def test_a_frame_over_the_limit_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(1000)
    with pytest.raises(FrameError, match="over the limit"):
        decoder.feed(struct.pack(">I", 1001))


def test_a_wrong_checksum_is_a_checksum_mismatch() -> None:
    data = bytearray(_send_frame(b"payload"))
    data[-1] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        FrameDecoder(1024).feed(bytes(data))


@pytest.mark.parametrize(
    "body",
    [
        b"\x00\x00\x00\x05garbage!!",  # a command that is not protobuf
        b"\x00\x00\x00\xff\x08\x12",  # a command size past the frame
        b"\x00\x00\x00\x02\x08\x12\x0e\x01\x00",  # a payload part too short for its header
        b"\x00\x00\x00\x02\x08\x12\xbe\xef\x00\x00\x00\x00\x00\x00\x00\x00",  # an unknown magic
    ],
)
def test_malformed_frames_are_frame_errors(body: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder(1024).feed(struct.pack(">I", len(body)) + body)


def test_a_command_missing_required_fields_is_a_frame_error() -> None:
    # BaseCommand's type is required: an empty command does not parse.
    with pytest.raises(FrameError):
        FrameDecoder(1024).feed(struct.pack(">II", 4, 0))


def test_command_sets_the_field_its_type_names() -> None:
    cmd = command(pb.BaseCommand.SUCCESS, request_id=9)
    assert cmd.HasField("success")
    assert cmd.success.request_id == 9
    flow = command(pb.BaseCommand.FLOW, consumer_id=1, messagePermits=1000)
    assert flow.flow.messagePermits == 1000


def test_the_generated_module_is_current(tmp_path: Path) -> None:
    """`make proto` regenerates api/pulsar/pulsar_api_pb2.py from the .proto: checked in, it must
    be what the .proto gives today."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) regenerates the module")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PULSAR}",
            f"--python_out={tmp_path}",
            "pulsar_api.proto",
        ],
        check=True,
        cwd=PULSAR,
    )
    assert (tmp_path / "pulsar_api_pb2.py").read_text() == (PULSAR / "pulsar_api_pb2.py").read_text()
