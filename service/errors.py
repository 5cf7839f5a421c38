"""Domain exceptions. ``api/`` maps each to one HTTP status; nothing here knows HTTP.

ServiceError
├── InvalidInput          (400) a value the client sent is malformed
├── Unauthenticated       (401) no token, or one that is malformed, wrongly signed or expired
├── Forbidden             (403) the role may not do this
├── NotFound              (404) topic, subscription, ledger
│   ├── UnknownListener         a lookup names an advertised listener the service does not have
│   ├── NoSuchNamespace         the table catalog (``/iceberg``) has no such namespace
│   └── NoSuchTable             the table catalog has no such table
├── NotAllowed            (405) not done for this kind of topic (compacting a non-persistent one)
├── Conflict              (409) exists already, compaction running, consumer active
│   ├── IncompatibleSchema      a schema the topic's compatibility strategy refuses
│   ├── TopicTerminated         the topic was terminated: it takes no more writes
│   └── ProducerBlocked         over a backlog quota whose policy is producer_exception
├── TooLarge              (413) message or request over its size limit
├── DamagedData           (500) a stored file failed a check; the reason names topic, ledger, check
├── NotOwner              (307) another instance owns the topic: ``url`` is where
└── Unavailable           (503) out of a resource for now; try again after ``retry_after`` s
    ├── SealBacklogFull         too many closed ledgers wait to be sealed (back-pressure)
    ├── DescriptorsExhausted    the process hit its open-file limit
    ├── BeingRepaired           a damaged compacted ledger was dropped and is being rebuilt
    ├── OwnershipLost           this instance's lease on the topic lapsed or moved: look it up again
    ├── ProducerHeld            over a backlog quota whose policy is producer_request_hold
    └── StorageUnavailable      the ledger storage (object storage) does not answer
"""

from __future__ import annotations

import errno


class ServiceError(Exception):
    """Base of every error a client can cause; ``reason`` is shown to it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidInput(ServiceError):
    pass


class Unauthenticated(ServiceError):
    pass


class Forbidden(ServiceError):
    pass


class NotFound(ServiceError):
    pass


class UnknownListener(NotFound):
    """A lookup asked for an advertised listener the service does not have (Pulsar refuses
    it with ServiceNotReady over the binary protocol)."""


class NoSuchNamespace(NotFound):
    """The table catalog (``service.table_catalog``) has no namespace of that name, or none
    the role may see (Iceberg's ``NoSuchNamespaceException``)."""


class NoSuchTable(NotFound):
    """The table catalog has no table of that name (Iceberg's ``NoSuchTableException``): no
    topic of that name publishes a table, or the namespace is not a ``tenant.namespace``."""


class NotAllowed(ServiceError):
    """Not done for this kind of thing at all, whatever its state (Pulsar's
    ``NotAllowedException``): a compaction or readCompacted on a non-persistent topic."""


class Conflict(ServiceError):
    pass


class IncompatibleSchema(Conflict):
    """A producer's, consumer's or admin's schema that the topic's schema compatibility strategy
    (or its auto-update and validation policies) refuses: 409 over REST, as Pulsar's schema
    upload answers, and Pulsar's ``IncompatibleSchema`` on the binary protocol."""


class TopicTerminated(Conflict):
    """A write to a terminated topic (Pulsar's ``TopicTerminatedException``): it keeps serving
    reads, and never takes another message. ``TopicTerminatedError`` on the binary protocol."""


class ProducerBlocked(Conflict):
    """A producer of a topic over a backlog quota whose policy is ``producer_exception``
    (Pulsar's ``ProducerBlockedQuotaExceededException``): refused until consumers catch up."""


class TooLarge(ServiceError):
    pass


class DamagedData(ServiceError):
    """A read met a stored file that failed an integrity check (``ledger.checksums``). Not the
    client's doing: a 500 whose reason names the topic, the ledger and the failed check, so
    that no damaged byte is served and the operator knows where to look. The ledger is marked
    damaged in the metadata by then."""

    def __init__(self, reason: str, *, topic: str, ledger_id: int, check: str) -> None:
        super().__init__(reason)
        self.topic = topic
        self.ledger_id = ledger_id
        self.check = check


class NotOwner(ServiceError):
    """Another instance owns the topic; ``url`` is its advertised URL (a redirect, not an error
    of the client's)."""

    def __init__(self, reason: str, url: str, broker_url: str | None = None) -> None:
        super().__init__(reason)
        self.url = url
        # The owner's pulsar://host:port (a lookup's answer), None when it does not listen.
        self.broker_url = broker_url


class CompactionUnavailable(Exception):
    """Compaction cannot run on this machine or cluster (no usable Java, Spark did not start,
    executors that cannot run the tasks or read the storage root). Not a client's error: it
    is shown in ``GET /health`` and as a round's ``lastError``. ``reason`` is one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"compaction unavailable: {reason}")
        self.reason = reason


class Unavailable(ServiceError):
    """The service cannot take the request now, changed nothing for it, and expects to be able
    to in about ``retry_after`` seconds: a client should retry with back-off."""

    def __init__(self, reason: str, retry_after: int = 1) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class SealBacklogFull(Unavailable):
    pass


class DescriptorsExhausted(Unavailable):
    pass


class BeingRepaired(Unavailable):
    """A damaged compacted ledger was dropped; a round rebuilds it from the original ledgers."""


class OwnershipLost(Unavailable):
    """This instance may not write the topic (any more): its lease lapsed, or another instance
    took the topic over. Nothing was acknowledged; the client looks the topic up again."""


class ProducerHeld(Unavailable):
    """A producer of a topic over a backlog quota whose policy is ``producer_request_hold``
    (Pulsar's ``ProducerBlockedQuotaExceededError``): held back until consumers catch up; the
    client retries (its sends wait meanwhile)."""


class StorageUnavailable(Unavailable):
    """The ledger storage (object storage) does not answer: nothing was acknowledged or read;
    the service goes on by itself once it answers again."""


_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def is_descriptor_exhaustion(exc: BaseException) -> bool:
    """Whether ``exc`` is the process or the system running out of file descriptors. pyarrow's
    errors carry no errno, only the OS message."""
    if not isinstance(exc, OSError):
        return False
    return exc.errno in _EXHAUSTED or "Too many open files" in str(exc)
