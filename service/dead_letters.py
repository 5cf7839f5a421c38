"""Dead letters: a message redelivered more than a consumer's ``maxRedeliverCount`` times is
written to the dead letter topic and acknowledged on its own (Pulsar's ``DeadLetterPolicy``).

The dead letter topic is ``{topic}-{subscription}-DLQ`` in the topic's namespace unless the
policy names another topic of that namespace. The service writes it itself, creating the topic
if it does not exist; the message keeps its key, value, properties and event time, and gains
Pulsar's ``REAL_TOPIC`` (the topic it came from) and ``ORIGIN_MESSAGE_ID`` (its id there).
Attaching a consumer with a policy needs the produce permission on the dead letter topic
(``api.routes.consumers``): the role could otherwise write where it may not.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ledger.entry import Entry, Position, Record
from service.errors import Conflict, InvalidInput, NotFound
from service.names import PREFIX, TopicName, check_part
from service.topics import Broker

REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
DLQ_SUFFIX = "-DLQ"


@dataclass(frozen=True)
class DeadLetterPolicy:
    max_redeliver_count: int
    topic: TopicName


def dead_letter_topic(topic: TopicName, subscription: str, given: str | None) -> TopicName:
    """The dead letter topic of ``subscription`` on ``topic``: ``given`` (a topic name, or
    ``persistent://`` / ``tenant/namespace/`` with the topic's own namespace), else Pulsar's
    default. 400 for a name that is not a topic of the same namespace."""
    if given is None:
        name = f"{topic.topic}-{subscription}{DLQ_SUFFIX}"
        try:
            return TopicName.of(topic.tenant, topic.namespace, name)
        except InvalidInput:
            raise InvalidInput(
                f"the default dead letter topic {name!r} is not a valid topic name; give deadLetterTopic"
            ) from None
    text = given.removeprefix(PREFIX)
    if "/" not in text:
        return TopicName.of(topic.tenant, topic.namespace, check_part("topic", text))
    dlq = TopicName.parse(text)
    if (dlq.tenant, dlq.namespace) != (topic.tenant, topic.namespace):
        raise InvalidInput(
            f"the dead letter topic must be in the namespace {topic.tenant}/{topic.namespace}, not {dlq}"
        )
    if dlq == topic:
        raise InvalidInput("the dead letter topic must not be the topic itself")
    return dlq


def make_policy(
    topic: TopicName, subscription: str, max_redeliver_count: int, given: str | None
) -> DeadLetterPolicy:
    if max_redeliver_count < 1:
        raise InvalidInput("maxRedeliverCount must be at least 1")
    return DeadLetterPolicy(max_redeliver_count, dead_letter_topic(topic, subscription, given))


def dead_letter_record(topic: TopicName, entry: Entry) -> Record:
    props = dict(entry.properties)
    props[REAL_TOPIC] = str(topic)
    props[ORIGIN_MESSAGE_ID] = str(Position(entry.ledger_id, entry.entry_id))
    return Record(key=entry.key, value=entry.value, properties=props, event_time=entry.event_time)


def write_dead_letters(broker: Broker, topic: TopicName, dlq: TopicName, entries: list[Entry]) -> None:
    """Store ``entries`` on ``dlq`` (created if missing), durably, before they are acknowledged."""
    try:
        broker.topic(dlq)
    except NotFound:  # created on first use, as Pulsar's DLQ producer has it auto-created
        with contextlib.suppress(Conflict):  # created meanwhile
            broker.create_topic(dlq)
    broker.produce(dlq, [dead_letter_record(topic, e) for e in entries])
