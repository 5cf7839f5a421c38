"""A raw socket on a test server's binary protocol, for the tests that send frames the official
clients never would (or must see exactly what the server answers)."""

from __future__ import annotations

import socket
import struct

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.framing import command, encode
from tests.conftest import Server


def raw(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.broker_port), timeout=10)


def read_frame(s: socket.socket) -> pb.BaseCommand:
    """The next simple frame from the server."""
    head = b""
    while len(head) < 8:
        head += s.recv(8 - len(head))
    total, size = struct.unpack(">II", head)
    body = b""
    while len(body) < total - 4:
        body += s.recv(total - 4 - len(body))
    answer = pb.BaseCommand()
    answer.ParseFromString(body[:size])
    return answer


def connect(s: socket.socket) -> None:
    s.sendall(encode(command(pb.BaseCommand.CONNECT, client_version="raw", protocol_version=21)))
    answer = read_frame(s)
    assert answer.type == pb.BaseCommand.CONNECTED
    assert answer.connected.max_message_size > 0
