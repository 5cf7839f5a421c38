"""The binary protocol's errors: a request refused (``ProtocolError``, with service errors mapped
once for every command to Pulsar's ``ServerError`` codes) or a connection closed for breaking
the protocol (``ProtocolClose``)."""

from __future__ import annotations

from api.pulsar import pulsar_api_pb2 as pb
from service.errors import (
    Conflict,
    Forbidden,
    IncompatibleSchema,
    InvalidInput,
    NotAllowed,
    NotFound,
    NotOwner,
    ProducerBlocked,
    ProducerHeld,
    ServiceError,
    TooLarge,
    TopicTerminated,
    Unauthenticated,
    Unavailable,
)


class ProtocolError(Exception):
    """A request the connection refuses with ``code`` (an ERROR reply, the connection stays)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ProtocolClose(Exception):
    """The client broke the protocol: the connection is closed (after any reply already sent)."""


def server_error(
    e: BaseException, *, not_found: int = pb.TopicNotFound, conflict: int = pb.ConsumerBusy
) -> int:
    """The ServerError for a service exception; ``not_found`` and ``conflict`` say which code a
    missing thing or a conflict means for the command at hand (a subscription, a producer...)."""
    if isinstance(e, ProtocolError):
        return e.code
    if isinstance(e, Unauthenticated):
        return pb.AuthenticationError
    if isinstance(e, Forbidden):
        return pb.AuthorizationError
    if isinstance(e, NotFound):
        return not_found
    if isinstance(e, IncompatibleSchema):
        return pb.IncompatibleSchema
    if isinstance(e, TopicTerminated):
        return pb.TopicTerminatedError
    if isinstance(e, ProducerBlocked):
        return pb.ProducerBlockedQuotaExceededException
    if isinstance(e, ProducerHeld):
        return pb.ProducerBlockedQuotaExceededError
    if isinstance(e, Conflict):
        return conflict
    if isinstance(e, (NotOwner, Unavailable)):
        # The client looks the topic up again and retries (Pulsar's ServiceNotReady).
        return pb.ServiceNotReady
    if isinstance(e, (InvalidInput, TooLarge, NotAllowed)):
        return pb.NotAllowedError
    if isinstance(e, ServiceError):
        return pb.UnknownError
    return pb.PersistenceError
