"""Integrity of layered compacted ledgers (issues 14 and 17 together), on a real server: a
delta round's manifest carries the checksum of every file it names; a damaged deletion vector
or key index -- in the ledger's own directory or an older layer's -- is found by the scrub, by a
``readCompacted`` read or by the next round, is never served or used, and the ledger is rebuilt
from the original ledgers."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger.storage import StoragePath
from tests.conftest import Server
from tests.e2e.test_integrity import PER_LEDGER, Topic, flip, latest_values, wait_rebuilt

pytestmark = pytest.mark.e2e

ENV = {
    "COMPACTOR_MAX_ENTRIES_PER_LEDGER": str(PER_LEDGER),
    # No background scrub: each test decides who meets the damage first.
    "COMPACTOR_SCRUB_INTERVAL_SECONDS": "0",
    # Rounds here meet the damage in the objects themselves, never in a verified local copy
    # (tests/service/test_local_copies.py has those).
    "COMPACTOR_LOCAL_COPIES_BYTES": "0",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("layered-integrity") / "data", env=ENV)
    s.start()
    yield s
    s.stop()


def overwrite(topic: Topic, keys: list[str]) -> None:
    """New values for ``keys``, one message at a time (ledgers roll over every PER_LEDGER)."""
    for i, key in enumerate(keys):
        value = f"{key}-new-{i}-".encode() * 20
        message = {"key": key, "value": base64.b64encode(value).decode()}
        r = httpx.post(topic.data, json={"messages": [message]})
        assert r.status_code == 200, r.text
        topic.sent[r.json()["messageIds"][0]] = value
    topic.wait_sealed()


def layered(srv: Server, name: str) -> tuple[Topic, int, StoragePath, dict[str, Any]]:
    """A topic compacted twice: a base, then a delta whose deletion vector marks the rows of
    the base that the new values of k0 and k1 superseded. Returns the topic, the delta's
    ledger id, its directory and its manifest."""
    topic = Topic(srv, name).create()
    assert topic.compact()["status"] == "SUCCESS"
    overwrite(topic, ["k0", "k1", "k0", "k1", "k0"])
    assert topic.compact()["status"] == "SUCCESS"
    ledger_id = topic.internal()["compactedLedger"]["ledgerId"]
    directory = topic.root / f"compacted-{ledger_id:020d}"
    manifest = json.loads((directory / "_manifest.json").read_bytes())
    assert [layer["kind"] for layer in manifest["layers"]] == ["base", "delta"], manifest
    return topic, ledger_id, directory, manifest


def assert_rebuilt_and_intact(topic: Topic, old: int) -> None:
    wait_rebuilt(topic, old)
    assert topic.wait_compaction()["status"] == "SUCCESS"
    runs = httpx.get(f"{topic.admin}/compactionRuns").json()
    assert runs[0]["trigger"] == "repair"
    got, answer = topic.read_all(compacted=True)
    assert answer.status_code == 200, answer.text
    topic.assert_values_intact(got)
    assert {m["key"]: base64.b64decode(m["value"]) for m in got} == latest_values(topic)
    # The rebuild is one new base: the dropped ledger's layers, damaged file included, are gone.
    current = topic.internal()["compactedLedger"]["ledgerId"]
    assert [d.name for d in topic.root.dirs() if d.name.startswith("compacted-")] == [
        f"compacted-{current:020d}"
    ]


def assert_never_served_then_rebuilt(topic: Topic, old: int) -> None:
    """A readCompacted read after the damage was found: the rebuilt ledger's rows, or 503
    naming the dropped ledger while it is rebuilt; then the rebuild."""
    r = topic.read(compacted=True, page=100)
    if r.status_code == 200:  # the repair round already committed
        topic.assert_values_intact(r.json()["messages"])
    else:
        assert r.status_code == 503, r.text
        assert f"compacted ledger {old} of {topic.full}" in r.json()["reason"]
    assert_rebuilt_and_intact(topic, old)


def test_a_delta_round_s_manifest_carries_the_checksum_of_every_file_it_names(srv: Server) -> None:
    topic, _, _, manifest = layered(srv, "checksums")
    base, delta = manifest["layers"]
    assert base["dir"] != delta["dir"]  # the base's files stay where the first round wrote them
    assert base["deletes"]["dir"] == delta["dir"] and base["deletes"]["checksum"].startswith("crc32c:")
    for layer in manifest["layers"]:
        for part in layer["parts"]:
            assert part["checksum"].startswith("crc32c:") and part["keys_checksum"].startswith("crc32c:")
    report = topic.scrub()
    assert report["status"] == "CLEAN", report
    # Every sealed ledger, and of the compacted ledger: the manifest, each part and its key
    # index in both layers, and the base's deletion vector.
    parts = len(base["parts"]) + len(delta["parts"])
    assert report["filesChecked"] == len(topic.ledgers()) + 1 + 2 * parts + 1, report
    got, answer = topic.read_all(compacted=True)
    assert answer.status_code == 200
    assert {m["key"] for m in got} == {f"k{i}" for i in range(5)}
    topic.assert_values_intact(got)


def test_a_damaged_deletion_vector_read_by_read_compacted_answers_the_damage_reason(srv: Server) -> None:
    topic, old, directory, manifest = layered(srv, "deletes-read")
    vector = directory / manifest["layers"][0]["deletes"]["name"]
    flip(vector, vector.size() - 1)  # the bits of the base's last rows

    r = topic.read(compacted=True, page=100)
    assert r.status_code == 503, r.text  # not a 500, and never rows the vector got wrong
    reason = r.json()["reason"]
    assert f"compacted ledger {old} of {topic.full} is damaged" in reason, reason
    assert "file checksum failed" in reason, reason
    assert_rebuilt_and_intact(topic, old)


def test_a_damaged_deletion_vector_is_found_by_the_scrub_and_never_served(srv: Server) -> None:
    topic, old, directory, manifest = layered(srv, "deletes-scrub")
    vector = directory / manifest["layers"][0]["deletes"]["name"]
    flip(vector, vector.size() - 1)

    report = topic.scrub()
    assert report["status"] == "DAMAGED", report
    finding = report["findings"][0]
    assert f"compacted ledger {old} of {topic.full} is damaged ({vector.name})" in finding, finding
    assert "file checksum failed" in finding, finding
    assert_never_served_then_rebuilt(topic, old)


def test_a_damaged_key_index_of_an_older_layer_is_found_by_the_scrub(srv: Server) -> None:
    topic, old, _, manifest = layered(srv, "keys-scrub")
    base = manifest["layers"][0]
    index = topic.root / base["dir"] / base["parts"][0]["keys"]
    flip(index, index.size() // 2)

    report = topic.scrub()
    assert report["status"] == "DAMAGED", report
    finding = report["findings"][0]
    # The file is in the base's directory; the ledger dropped is the one whose manifest names it.
    assert f"compacted ledger {old} of {topic.full} is damaged ({base['dir']}/{index.name})" in finding
    assert "file checksum failed" in finding, finding
    assert_never_served_then_rebuilt(topic, old)


def test_a_round_never_probes_a_damaged_key_index(srv: Server) -> None:
    topic, old, _, manifest = layered(srv, "keys-round")
    base = manifest["layers"][0]
    index = topic.root / base["dir"] / base["parts"][0]["keys"]
    flip(index, index.size() // 2)
    overwrite(topic, ["k2", "k3", "k2", "k3"])

    assert httpx.put(f"{topic.admin}/compaction").status_code == 204
    # The round fails before its Spark work and a repair round follows at once: read the
    # failed round from the history rather than the status, which may show the repair already.
    deadline = time.monotonic() + 180
    failed: dict[str, Any] | None = None
    while failed is None and time.monotonic() < deadline:
        runs = httpx.get(f"{topic.admin}/compactionRuns").json()
        failed = next((r for r in runs if r["trigger"] != "repair" and r["status"] == "ERROR"), None)
        time.sleep(0.1)
    assert failed is not None, runs
    line = failed["error"]
    assert "\n" not in line and f"compacted ledger {old} of {topic.full} is damaged" in line, line
    assert f"{base['dir']}/{index.name}" in line and "file checksum failed" in line, line
    assert_rebuilt_and_intact(topic, old)
