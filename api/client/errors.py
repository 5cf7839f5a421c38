"""The exception tree of the client (drawn in the package's docstring), and the status -> error
map of the one place responses are decoded (``_core._decode``)."""

from __future__ import annotations


class ClientError(Exception):
    """Base of every error this client raises; ``reason`` says what went wrong."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransportError(ClientError):
    """No HTTP answer: the connection was refused or reset, the name did not resolve, or the
    request timed out (``Client(timeout=...)``). The original httpx error is ``__cause__``."""


class Timeout(ClientError):
    """Nothing arrived in time: ``receive``/``read_next`` with ``timeout_millis``, or a
    ``wait_for_compaction`` past its ``timeout`` (as Pulsar's ``pulsar.Timeout``)."""


class AlreadyClosed(ClientError):
    """A client, producer, consumer, reader or table view was used after ``close()``."""


class ServerError(ClientError):
    """The server answered with an error status; ``reason`` is its JSON ``"reason"``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status

    def __str__(self) -> str:
        return f"{self.reason} (HTTP {self.status})"


class BadRequest(ServerError):
    """400 or 422: a malformed name, message id, body or query."""


class AuthenticationError(ServerError):
    """401: no token was sent, or the server did not accept it (malformed, wrongly signed, expired)."""


class AuthorizationError(ServerError):
    """403: the token's role may not do this (its reason names the role and the action)."""


class NotFound(ServerError):
    """404: no such tenant, namespace, topic, subscription or consumer."""


class Conflict(ServerError):
    """409: the thing exists already, or a compaction of the topic is running."""


class ConsumerBusy(Conflict):
    """409 on attaching a consumer: the (exclusive) subscription has an active consumer."""


class TooLarge(ServerError):
    """413: a message over ``maxMessageSize`` or a request over ``maxRequestBytes``."""


class Unavailable(ServerError):
    """503: the server is out of a resource for now (its seal backlog is full, or it ran out of
    file descriptors) and changed nothing; raised once the client's retries are used up."""


_ERRORS: dict[int, type[ServerError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: AuthorizationError,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: BadRequest,
    503: Unavailable,
}
