"""Topic administration at Pulsar's admin paths."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Response

from api.deps import (
    BrokerDep,
    CanListTopics,
    CanLookup,
    NonPersistentDep,
    PartitionedDep,
    SchemasDep,
    TenantAdmin,
    TenantsDep,
    TopicDep,
)
from service.errors import NotFound
from service.names import check_part
from service.stats import InternalStats, internal_stats

router = APIRouter(prefix="/admin/v2/persistent", tags=["topics"])
# Pulsar's namespace-wide topic list (the namespaces router's routes are a tenant admin's).
namespace_topics = APIRouter(prefix="/admin/v2/namespaces", tags=["topics"])


@router.get("/{tenant}/{namespace}", response_model=list[str], dependencies=[CanListTopics])
def list_topics(tenant: str, namespace: str, broker: BrokerDep) -> list[str]:
    return broker.list_topics(check_part("tenant", tenant), check_part("namespace", namespace))


@namespace_topics.get("/{tenant}/{namespace}/topics", response_model=list[str], dependencies=[CanListTopics])
def list_namespace_topics(
    tenant: str,
    namespace: str,
    broker: BrokerDep,
    tenants: TenantsDep,
    non_persistent: NonPersistentDep,
    mode: Literal["PERSISTENT", "NON_PERSISTENT", "ALL"] = Query(
        "PERSISTENT",
        description="Which topics: the persistent ones, the non-persistent ones served now, or all",
    ),
    includeSystemTopic: bool = Query(False, description="Accepted as Pulsar's; there are none"),  # noqa: N803
) -> list[str]:
    """The namespace's topics (partitions by their names), as Pulsar's. A Pulsar client given an
    ``http://`` service URL asks this for a pattern (regex) subscription, with the mode of its
    ``RegexSubscriptionMode``; Pulsar's admin clients ask it for a namespace's topics.

    A namespace that does not exist has none: an empty list, as the binary protocol's
    GET_TOPICS_OF_NAMESPACE answers (Pulsar 4.0.7 answers so over the wire in the PERSISTENT
    mode, and 404 here: a pattern consumer then subscribes over either, and finds the topics
    once the namespace has some)."""
    tenant, namespace = check_part("tenant", tenant), check_part("namespace", namespace)
    try:
        tenants.require_namespace(tenant=tenant, namespace=namespace)
    except NotFound:
        return []
    names = [] if mode == "NON_PERSISTENT" else broker.list_topics(tenant, namespace)
    if mode != "PERSISTENT":
        # From a worker thread: list() copies the event loop's keys in one step first.
        names += non_persistent.list(tenant, namespace)
    return names


@router.put(
    "/{tenant}/{namespace}/{topic}", status_code=204, response_class=Response, dependencies=[TenantAdmin]
)
def create_topic(
    name: TopicDep, broker: BrokerDep, tenants: TenantsDep, partitioned: PartitionedDep
) -> Response:
    """Create a topic in a namespace that exists (404 otherwise, as Pulsar); not one named as a
    partitioned topic or as a partition (those are created with their partitioned topic)."""
    tenants.require_namespace(tenant=name.tenant, namespace=name.namespace)
    partitioned.check_topic_name(name)
    broker.create_topic(name)
    return Response(status_code=204)


@router.delete(
    "/{tenant}/{namespace}/{topic}", status_code=204, response_class=Response, dependencies=[TenantAdmin]
)
def delete_topic(name: TopicDep, broker: BrokerDep, tenants: TenantsDep, schemas: SchemasDep) -> Response:
    broker.delete_topic(name)
    tenants.forget_topic(name=name)
    # Its schema goes with it, as Pulsar's (a topic created later under the name starts bare).
    schemas.delete(name)
    return Response(status_code=204)


@router.get("/{tenant}/{namespace}/{topic}/internalStats", dependencies=[CanLookup])
def get_internal_stats(name: TopicDep, broker: BrokerDep) -> dict[str, Any]:
    return internal_stats_json(internal_stats(broker, name))


def internal_stats_json(st: InternalStats) -> dict[str, Any]:
    current = st.ledgers[-1] if st.ledgers else None
    return {
        "entriesAddedCounter": st.entries,
        "numberOfEntries": st.entries,
        "totalSize": st.size,
        "currentLedgerEntries": current.entries if current else 0,
        "currentLedgerSize": current.size_bytes if current else 0,
        "lastConfirmedEntry": str(st.last_confirmed) if st.last_confirmed else None,
        "state": st.state,
        "ledgers": [
            {
                "ledgerId": i.ledger_id,
                "entries": i.entries,
                "size": i.size_bytes,
                "fileSize": i.file_bytes,
                "state": i.state,
                # Integrity (README, "Integrity and repair"): the sealed file's CRC32C, and what
                # damage was found in it (null: none), whether its loss was accepted, and what.
                "checksum": i.checksum,
                "damaged": i.damage,
                "damageAccepted": i.damage_accepted,
                "lostEntries": i.lost.to_text() or None,
            }
            for i in st.ledgers
        ],
        "cursors": {
            c.name: {
                "markDeletePosition": str(c.mark_delete) if c.mark_delete else None,
                "properties": c.properties,
            }
            for c in st.cursors
        },
        "compactedLedger": {
            "ledgerId": st.compacted_ledger.ledger_id,
            "entries": st.compacted_ledger.entries,
            "size": st.compacted_ledger.size,
            # Pulsar's fields: compacted ledgers live on the storage root, never offloaded
            # to tiered storage, and have no replicas to fall short of.
            "offloaded": False,
            "underReplicated": False,
            "checksum": st.compacted_ledger.checksum,
        },
        # A damaged compacted ledger dropped and being rebuilt (null: none).
        "compactedLedgerRepair": st.repair,
        "horizon": str(st.horizon) if st.horizon else None,
    }
