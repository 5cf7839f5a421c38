"""The service's own stats (Pulsar's ``/admin/v2/broker-stats``): its bounded resources."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import BrokerDep, Superuser
from service.stats import resource_stats

router = APIRouter(prefix="/admin/v2/broker-stats", tags=["stats"])


# Pulsar's broker-stats are a superuser's.
@router.get("/resources", dependencies=[Superuser])
def resources(broker: BrokerDep) -> dict[str, Any]:
    """Open descriptors and the limit, the seal backlog, the cache of open sealed-ledger files,
    the cache of hot row groups."""
    st = resource_stats(broker)
    b, f, g = st.seal_backlog, st.ledger_files, st.row_groups
    return {
        "openDescriptors": st.open_descriptors,
        "descriptorLimit": {"soft": st.descriptor_limit.soft, "hard": st.descriptor_limit.hard},
        "descriptorExhaustions": st.descriptor_exhaustions,
        "sealBacklog": {
            "pending": b.pending,
            "limit": b.limit,
            "perTopicLimit": b.per_topic_limit,
            "waitingProducers": b.waiting_producers,
            "refusedProducers": b.refused,
            "cacheBytes": b.cache_bytes,
            "cacheLimitBytes": b.cache_limit,
            "failingSeals": st.seal_failures,
        },
        "ledgerFileCache": {
            "open": f.open,
            "inUse": f.in_use,
            "limit": f.max_open,
            "cachedBytes": f.cached_bytes,
            "limitBytes": f.max_bytes,
            "hits": f.hits,
            "misses": f.misses,
            "evictions": f.evictions,
        },
        "rowGroupCache": {
            "entries": g.entries,
            "cachedBytes": g.cached_bytes,
            "limitBytes": g.max_bytes,
            "hits": g.hits,
            "misses": g.misses,
            "evictions": g.evictions,
        },
    }
