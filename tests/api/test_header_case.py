"""Pulsar's case of X-Pulsar-* header names on the wire (``api.header_case``), bytes in, bytes out."""

from __future__ import annotations

from api.header_case import MARKER, pulsar_case

MARKER_LINE = MARKER[0] + b": " + MARKER[1] + b"\r\n"


def _head(*lines: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(lines) + b"\r\n"


def test_a_marked_head_gets_pulsars_names_and_loses_its_marker() -> None:
    head = _head(
        b"content-length: 5\r\n", b"x-pulsar-property: {}\r\n", b"x-pulsar-message-id: 1:0\r\n", MARKER_LINE
    )
    out = pulsar_case(head + b"hello")
    assert (
        out
        == _head(b"content-length: 5\r\n", b"X-Pulsar-PROPERTY: {}\r\n", b"X-Pulsar-Message-ID: 1:0\r\n")
        + b"hello"
    )
    assert MARKER[1] not in out


def test_anything_unmarked_is_written_as_it_is() -> None:
    plain = _head(b"x-pulsar-property: {}\r\n")
    assert pulsar_case(plain) == plain
    # A payload that looks like a response head is no head: it holds no marker (a secret).
    body = b"HTTP/1.1 200 OK\r\nx-pulsar-property: {}\r\n\r\n"
    assert pulsar_case(body) == body
    # Names Pulsar does not write, and the body after the head, are left alone.
    head = _head(b"x-pulsar-other: 1\r\n", MARKER_LINE) + b"\r\nx-pulsar-property: in the body"
    assert pulsar_case(head) == _head(b"x-pulsar-other: 1\r\n") + b"\r\nx-pulsar-property: in the body"
