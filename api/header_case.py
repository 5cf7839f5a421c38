"""Pulsar's case of the ``X-Pulsar-*`` response header names, on the wire.

HTTP header names are case-insensitive, and uvicorn's httptools protocol writes every name in
lower case; but Pulsar's Java admin client (4.0.7) finds a message's properties by the exact
name ``X-Pulsar-PROPERTY`` among the headers of a message read by id
(``api.routes.message_by_id``). :class:`PulsarHeaderCase` wraps a connection's transport and
writes the names of :data:`NAMES` as Pulsar writes them, in a response's header block only
(a write that starts a response and has such a header); every other write passes unchanged.
"""

from __future__ import annotations

import asyncio
import re
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
_CASE = {n.lower().encode(): n.encode() for n in NAMES}
_LINE = re.compile(rb"\r\n(x-pulsar-[a-z0-9-]+):")
_MARK = b"\r\nx-pulsar-"


def _restore(m: re.Match[bytes]) -> bytes:
    return b"\r\n" + _CASE.get(m.group(1), m.group(1)) + b":"


class PulsarHeaderCase:
    """A transport whose response header blocks name :data:`NAMES` in Pulsar's case; everything
    else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data[:5] == b"HTTP/" and _MARK in data:
            raw = bytes(data)
            end = raw.find(b"\r\n\r\n")
            if end > 0:
                data = _LINE.sub(_restore, raw[:end]) + raw[end:]
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
