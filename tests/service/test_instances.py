"""The instances registry on the metadata database: rows of instances long gone do not pile up."""

from __future__ import annotations

from sqlalchemy import select

from service import models
from service.clock import now_ms
from service.db import Database
from service.instances import InstanceRegistry

DAY_MS = 86_400_000


def test_a_start_drops_the_rows_of_instances_gone_for_a_day_that_hold_no_topic(db: Database) -> None:
    old = now_ms() - 2 * DAY_MS
    with db.session() as s:
        gone = models.Instance(url="http://gone:8080", started_at=old, heartbeat_at=old)
        holder = models.Instance(url="http://holder:8080", started_at=old, heartbeat_at=old)
        recent = models.Instance(url="http://recent:8080", started_at=old, heartbeat_at=now_ms() - 60_000)
        s.add_all([gone, holder, recent])
        s.flush()
        topic = models.Topic(tenant="public", namespace="default", name="t", created_at=old)
        s.add(topic)
        s.flush()
        # A topic still leased to an instance long silent: its row names the owner to take over from.
        s.add(models.TopicLease(topic_id=topic.id, instance_id=holder.id, epoch=1, expires_at=old))
        ids = {"gone": gone.id, "holder": holder.id, "recent": recent.id}

    me = InstanceRegistry(db=db, url="http://me:8080", lease_ms=10_000).register()

    with db.session() as s:
        left = set(s.scalars(select(models.Instance.id)))
    assert left == {ids["holder"], ids["recent"], me}
