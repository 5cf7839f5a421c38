"""Topic termination with several ``compactor serve`` processes on one PostgreSQL database: the
partitions of a partitioned topic are terminated through one instance, each by its owner, and a
partition stays terminated when another instance takes it over (the state is the database's)."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.e2e.test_several_instances import HEADERS, NS, Cluster, _owner, cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e


def _produce(url: str, topic: str) -> httpx.Response:
    """A REST produce at ``url``, sent on to the owner when redirected (with the token: httpx
    drops it on a redirect to another origin)."""
    body = {"messages": [{"key": "k", "value": base64.b64encode(b"v").decode()}]}
    r = httpx.post(f"{url}/topics/persistent/{topic}", json=body, headers=HEADERS, timeout=30)
    if r.status_code == 307:
        r = httpx.post(r.headers["location"], json=body, headers=HEADERS, timeout=30)
    return r


def test_partitions_are_terminated_by_their_owners_and_stay_so_after_a_takeover(cluster: Cluster) -> None:  # noqa: F811
    a, b = cluster.start(2)
    admin = f"/admin/v2/persistent/{NS}/ending"
    assert httpx.put(f"{a.url}{admin}/partitions", json=4, headers=HEADERS, timeout=30).status_code == 204
    partitions = [f"{NS}/ending-partition-{i}" for i in range(4)]
    owners = [_owner(a, p) for p in partitions]
    assert set(owners) == {a.url, b.url}  # spread over both
    assert _produce(a.url, f"{NS}/ending").status_code == 200
    r = httpx.post(f"{a.url}{admin}/terminate/partitions", headers=HEADERS, timeout=60)
    assert r.status_code == 200, r.text
    assert sorted(r.json()) == ["0", "1", "2", "3"]
    for p in partitions:  # at either instance: refused, whoever owns it
        refused = _produce(b.url, p)
        assert refused.status_code == 409 and "terminated" in refused.json()["reason"], refused.text
    # The owner of partition 0 dies; the survivor takes it over and knows it is terminated.
    owner = a if owners[0] == a.url else b
    survivor = b if owner is a else a
    owner.kill()
    deadline = time.monotonic() + 60
    while True:
        # Redirected to the dead owner (307) until its lease lapses, then served here.
        r = httpx.post(
            f"{survivor.url}/topics/persistent/{partitions[0]}",
            json={"messages": [{"value": "dg=="}]},
            headers=HEADERS,
            timeout=30,
        )
        if r.status_code not in (307, 503):
            break
        assert time.monotonic() < deadline, "the survivor never took the partition over"
        time.sleep(0.1)
    assert r.status_code == 409 and "terminated" in r.json()["reason"], r.text
    stats = httpx.get(f"{survivor.url}/admin/v2/persistent/{partitions[0]}/internalStats", headers=HEADERS)
    assert stats.json()["state"] == "Terminated"
