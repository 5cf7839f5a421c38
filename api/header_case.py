"""Pulsar's case of the ``X-Pulsar-*`` response header names, on the wire.

HTTP header names are case-insensitive, and uvicorn's httptools protocol writes every name in
lower case; but Pulsar's Java admin client (4.0.7) finds a message's properties by the exact
name ``X-Pulsar-PROPERTY`` among the headers of a message read by id
(``api.routes.message_by_id``). Such a response carries :data:`MARKER`, a header whose value is a
secret of this process; :class:`PulsarHeaderCase` wraps a connection's transport and, in a
response head that has the marker (a write that starts a response and holds it: no payload can,
the secret is never sent), writes the names of :data:`NAMES` as Pulsar writes them and drops the
marker. Every other write passes unchanged, after a comparison of its first five bytes.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

#: The names as Pulsar's broker writes them (PersistentTopicsBase, TopicsImpl's constants).
NAMES = (
    "X-Pulsar-Message-ID",
    "X-Pulsar-PROPERTY",
    "X-Pulsar-publish-time",
    "X-Pulsar-event-time",
    "X-Pulsar-deliver-at-time",
    "X-Pulsar-num-batch-message",
    "X-Pulsar-batch-size",
    "X-Pulsar-null-value",
    "X-Pulsar-Is-Encrypted",
    "X-Pulsar-producer-name",
    "X-Pulsar-sequence-id",
    "X-Pulsar-partition-key",
    "X-Pulsar-partition-key-b64-encoded",
    "X-Pulsar-compression",
    "X-Pulsar-uncompressed-size",
    "X-Pulsar-encryption-algo",
    "X-Pulsar-Base64-encryption-param",
    "X-Pulsar-Base64-encryption-keys",
    "X-Pulsar-uuid",
    "X-Pulsar-num-chunks-from-msg",
    "X-Pulsar-total-chunk-msg-size",
    "X-Pulsar-chunk-id",
    "X-Pulsar-Base64-ordering-key",
    "X-Pulsar-Base64-schema-version-b64encoded",
)
#: The header a response whose X-Pulsar-* names keep Pulsar's case carries (dropped on the wire).
MARKER = (b"x-compactor-pulsar-case", secrets.token_hex(16).encode())
_MARKER_LINE = b"\r\n" + MARKER[0] + b": " + MARKER[1]
_CASE = {n.lower().encode(): n.encode() for n in NAMES}
_LINE = re.compile(rb"\r\n(x-pulsar-[a-z0-9-]+):")


def _restore(m: re.Match[bytes]) -> bytes:
    return b"\r\n" + _CASE.get(m.group(1), m.group(1)) + b":"


def pulsar_case(head: bytes) -> bytes:
    """A response head (status line and headers) with :data:`NAMES` in Pulsar's case and
    without the marker's line; any other head unchanged."""
    at = head.find(_MARKER_LINE)
    if at < 0:
        return head
    end = head.find(b"\r\n\r\n")
    if not 0 <= at < end:
        return head
    head = head[:at] + head[at + len(_MARKER_LINE) :]
    end -= len(_MARKER_LINE)
    return _LINE.sub(_restore, head[:end]) + head[end:]


class PulsarHeaderCase:
    """A transport that writes response heads through :func:`pulsar_case`; everything else is
    the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data[:5] == b"HTTP/":
            data = pulsar_case(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
