"""Partitioned topics for the end-to-end tests: made at Pulsar's admin path in ``public/default``."""

from __future__ import annotations

import uuid

import httpx

ADMIN = "/admin/v2/persistent/public/default"


def fresh(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def full(name: str) -> str:
    return f"persistent://public/default/{name}"


def partitioned(http: httpx.Client, n: int, prefix: str = "p") -> str:
    """A new topic of ``n`` partitions; its local name."""
    name = fresh(prefix)
    r = http.put(f"{ADMIN}/{name}/partitions", json=n)
    assert r.status_code == 204, r.text
    return name
