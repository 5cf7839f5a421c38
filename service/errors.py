"""Domain exceptions. ``api/`` maps each to one HTTP status; nothing here knows HTTP.

ServiceError
├── InvalidInput          (400) a value the client sent is malformed
├── NotFound              (404) topic, subscription, ledger
├── Conflict              (409) exists already, compaction running, consumer active
└── TooLarge              (413) message or request over its size limit
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error a client can cause; ``reason`` is shown to it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidInput(ServiceError):
    pass


class NotFound(ServiceError):
    pass


class Conflict(ServiceError):
    pass


class TooLarge(ServiceError):
    pass
