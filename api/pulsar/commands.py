"""The registry of command handlers: every command family's table in one, which the listener
hands to each connection (the connection imports none of the families, and they import it).

A command's handler is one dict lookup away for every frame (``PulsarConnection._dispatch``).
"""

from __future__ import annotations

from api.pulsar import connection, consume, lookup, produce, schemas
from api.pulsar.connection import Handler

HANDLERS: dict[int, Handler] = {
    **connection.HANDLERS,
    **lookup.HANDLERS,
    **produce.HANDLERS,
    **consume.HANDLERS,
    **schemas.HANDLERS,
}
