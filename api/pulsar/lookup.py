"""Where a topic lives: PARTITIONED_METADATA, LOOKUP and GET_TOPICS_OF_NAMESPACE.

A ``non-persistent://`` topic is looked up as a persistent one is (the same permission rule);
it is never partitioned here (its partitioned metadata answers 0) and is served where it is
asked for. GET_TOPICS_OF_NAMESPACE answers each of Pulsar's modes: PERSISTENT the namespace's
persistent topics (partitions by their names), NON_PERSISTENT the non-persistent topics served
now, ALL both (what a pattern consumer's ``RegexSubscriptionMode`` asks for). A namespace that does
not exist has no topics: an empty list in every mode (Pulsar 4.0.7 answers so in the PERSISTENT
mode, the one the Go client's and, by default, the Java client's pattern consumers ask for, and
MetadataError in the others), so that a pattern consumer may subscribe before its namespace has
topics, or exists.

LOOKUP of a topic that does not exist yet, in a namespace that does, creates it where
``allowAutoTopicCreation`` lets producers and consumers create topics (``service.lookup``);
with it off, and for a namespace that does not exist, the answer is Pulsar's TopicNotFound.
"""

from __future__ import annotations

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.connection import Handler, PulsarConnection
from api.pulsar.errors import ProtocolError, server_error
from api.pulsar.framing import Frame
from api.pulsar.non_persistent import topic_name as non_persistent_name
from service.authorization import Rule
from service.errors import NotFound, NotOwner, ServiceError, UnknownListener
from service.lookup import lookup_topic
from service.names import TopicName, check_part
from service.non_persistent import is_non_persistent


def _named(
    conn: PulsarConnection, topic: str
) -> tuple[TopicName | None, ServiceError | ProtocolError | None]:
    """The topic a lookup names, if the role may look it up; else the refusal."""
    try:
        name = non_persistent_name(topic) if is_non_persistent(topic) else conn.topic_name(topic)
        conn.authorize(Rule.PRODUCE_OR_CONSUME, name)
    except (ServiceError, ProtocolError) as e:
        return None, e
    return name, None


async def partitioned_metadata(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.partitionMetadata
    name, refused = _named(conn, req.topic)
    answer = pb.CommandPartitionedTopicMetadataResponse
    partitions = 0
    if name is not None and not is_non_persistent(req.topic):
        try:
            # N for a partitioned topic (the client then uses its partitions), else 0.
            partitions = await conn.call(conn.ctx.partitioned.partitions, name)
        except ServiceError as e:
            refused = e
    if refused is not None:
        fields: dict[str, object] = {
            "response": answer.Failed,
            "error": server_error(refused),
            "message": str(refused),
        }
    else:
        fields = {"response": answer.Success, "partitions": partitions}
    conn.send(pb.BaseCommand.PARTITIONED_METADATA_RESPONSE, request_id=req.request_id, **fields)


async def lookup(conn: PulsarConnection, frame: Frame) -> None:
    """The broker URL of the topic's owner: this instance, or with several instances the one
    holding its lease (the client connects there directly); the URL of the advertised listener
    the client names, if it names one (``service.lookup``)."""
    req = frame.command.lookupTopic
    name, refused = _named(conn, req.topic)
    answer = pb.CommandLookupTopicResponse
    fields: dict[str, object] = {}
    if name is not None:
        try:
            found = await conn.call(
                lookup_topic,
                broker=conn.ctx.broker,
                tenants=conn.ctx.tenants,
                partitioned=conn.ctx.partitioned,
                name=name,
                listener=req.advertised_listener_name,
                persistent=not is_non_persistent(req.topic),
            )
        except UnknownListener as e:
            # Pulsar's error: the client's C++ core fails the lookup for it (not a missing topic).
            refused = ProtocolError(pb.ServiceNotReady, e.reason)
        except NotOwner as e:
            # A listener named and the topic owned elsewhere: the owner knows its listeners.
            # The client connects to it and asks again there (Pulsar's Redirect).
            if e.broker_url is None:
                refused = _no_binary(name)
            elif conn.tls:  # instances record only their plain URL: no TLS address to send to
                refused = _no_binary(name, tls=True)
            else:
                fields = {"response": answer.Redirect, "brokerServiceUrl": e.broker_url}
                fields["authoritative"] = True
        except ServiceError as e:
            refused = e
        else:
            # Both URLs the owner has: the client takes brokerServiceUrlTls when it is on TLS.
            urls = {"brokerServiceUrl": found.broker_url, "brokerServiceUrlTls": found.broker_url_tls}
            if not conn.tls and found.broker_url is None:
                refused = _no_binary(name)
            elif conn.tls and found.broker_url_tls is None:
                refused = _no_binary(name, tls=True)
            else:
                fields = {"response": answer.Connect, "authoritative": True}
                fields.update({k: v for k, v in urls.items() if v is not None})
    if refused is not None:
        fields = {"response": answer.Failed, "error": server_error(refused), "message": str(refused)}
    conn.send(pb.BaseCommand.LOOKUP_RESPONSE, request_id=req.request_id, **fields)


def _no_binary(name: TopicName, *, tls: bool = False) -> ProtocolError:
    what = "Pulsar's binary protocol over TLS" if tls else "Pulsar's binary protocol"
    return ProtocolError(pb.ServiceNotReady, f"the owner of {name} does not serve {what}")


async def topics_of_namespace(conn: PulsarConnection, frame: Frame) -> None:
    req = frame.command.getTopicsOfNamespace
    request_id = req.request_id

    async def work() -> None:
        tenant, _, namespace = req.namespace.partition("/")
        try:
            check_part("tenant", tenant)
            check_part("namespace", namespace)
        except ServiceError as e:
            raise ProtocolError(pb.NotAllowedError, f"invalid namespace {req.namespace!r}: {e}") from None
        if conn.ctx.authorizer is not None and conn.role is not None:
            conn.ctx.authorizer.check(
                role=conn.role,
                rule=Rule.NAMESPACE_PRODUCE_OR_CONSUME,
                tenant=tenant,
                namespace=namespace,
                topic=None,
            )
        topics: list[str] = []
        try:
            await conn.call(conn.ctx.tenants.require_namespace, tenant=tenant, namespace=namespace)
        except NotFound:
            # None: an empty list (see the module's note), whatever the mode.
            conn.send(pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE, request_id=request_id, topics=topics)
            return
        mode = req.mode
        if mode != pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            topics += await conn.call(conn.ctx.broker.list_topics, tenant, namespace)
        if mode != pb.CommandGetTopicsOfNamespace.PERSISTENT:
            topics += conn.ctx.non_persistent.list(tenant, namespace)
        conn.send(pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE, request_id=request_id, topics=topics)

    await conn.request(request_id, work, not_found=pb.MetadataError)


HANDLERS: dict[int, Handler] = {
    pb.BaseCommand.PARTITIONED_METADATA: partitioned_metadata,
    pb.BaseCommand.LOOKUP: lookup,
    pb.BaseCommand.GET_TOPICS_OF_NAMESPACE: topics_of_namespace,
}
