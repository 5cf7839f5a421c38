"""Pulsar's topic lookup, one verb for both edges (the binary protocol's ``LOOKUP`` and the
REST path ``/lookup/v2/topic/...``): the URLs a client is sent to for a topic.

The owner answers: this instance for a topic it holds, takes now, or that does not exist yet;
with several instances, the one holding the topic's lease.

A lookup of a topic that does not exist yet, in a namespace that does, creates it here as a
producer or consumer would (``service.auto_topics``: ``allowAutoTopicCreation``; a partition of a
partitioned topic whatever it says), so that the topic an admin tool or a client has just looked
up is there for its next call; with auto-creation off the lookup is refused as Pulsar refuses it
(the topic not found). The name of a partitioned topic is answered, never created (its
partitions are the topics). A namespace that does not exist is not found, whatever the topic.
Pulsar 4.0.7 answers the same lookups without creating the topic: it appears with its first
producer or consumer there, which are served here as before. A client may name an advertised listener
(:mod:`service.listeners`): a name the service does not have is refused (``UnknownListener``),
and one it has is answered by the owner itself, since only the owner knows its listeners' URLs
(``NotOwner``: the binary protocol redirects the client to the owner, REST answers 307).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.auto_topics import topic_for_use
from service.errors import NotFound, NotOwner, UnknownListener
from service.listeners import unknown_listener_reason
from service.names import TopicName
from service.partitions import PartitionedTopics
from service.tenants import TenantService
from service.topics import Broker


@dataclass(frozen=True)
class Lookup:
    """Where the topic's owner serves it (Pulsar's ``LookupData``)."""

    http_url: str  # its REST URL (http:// or https://)
    broker_url: str | None  # its binary protocol (pulsar://), None when it does not serve it
    broker_url_tls: str | None = None  # pulsar+ssl://, when it serves the binary protocol over TLS
    http_url_tls: str | None = None  # its HTTPS URL, when it serves HTTPS


def lookup_topic(
    *,
    broker: Broker,
    tenants: TenantService,
    partitioned: PartitionedTopics,
    name: TopicName,
    listener: str | None = None,
    persistent: bool = True,
) -> Lookup:
    """The owner's URLs for ``name``, those of the advertised listener ``listener`` if one is
    named. ``UnknownListener`` for a listener the service does not have; ``NotOwner`` when a
    listener is named and another instance owns the topic. A non-persistent topic
    (``persistent`` false) has no owner but the instance asked: it is served where it is used
    (with several instances, each serves its own; see docs/concepts.md)."""
    settings = broker.settings
    chosen = None
    listener = (listener or "").strip()
    if listener:
        chosen = settings.advertised_listeners.get(listener)
        if chosen is None:
            raise UnknownListener(unknown_listener_reason(listener, list(settings.advertised_listeners)))
    try:
        if persistent:
            _existing_or_created(broker, tenants, partitioned, name)
        else:
            tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    except NotOwner as e:
        if chosen is not None:
            raise  # the owner answers for its own listeners
        return Lookup(e.url, e.broker_url)
    https = settings.web_service_url_tls
    if chosen is not None:
        return Lookup(settings.advertised_url, chosen.broker_url, chosen.broker_url_tls, https)
    # Both URLs, as Pulsar's broker answers: a client on TLS (pulsar+ssl:// or https://) takes
    # the TLS one, any other the plain one (pulsar-client-cpp's lookup services choose so).
    tls = settings.broker_service_url_tls
    return Lookup(settings.advertised_url, settings.broker_service_url, tls, https)


def _existing_or_created(
    broker: Broker, tenants: TenantService, partitioned: PartitionedTopics, name: TopicName
) -> None:
    """The persistent topic ``name`` exists once this returns (or is a partitioned topic's
    name); ``NotFound`` for a namespace that does not exist, or a topic auto-creation may not
    make; ``NotOwner`` when another instance owns it."""
    try:
        broker.topic(name)
        return
    except NotFound:
        pass
    tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    if partitioned.get(name) is not None:
        return
    topic_for_use(
        broker=broker,
        tenants=tenants,
        partitioned=partitioned,
        name=name,
        create=broker.settings.allow_auto_topic_creation,
    )
