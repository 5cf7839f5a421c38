"""Layered compacted ledgers through the service (issue 17): many rounds of deltas and
consolidations against a model, readers' leases on layers shared between ledgers, and a crash
at every step of a round followed by a restart."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from compactor import TwoPhaseCompactor
from ledger.entry import Position
from service.compaction import CompactionService
from service.topics import Broker
from tests.service.test_compaction import (
    NAME,
    Model,
    compacted_files,
    horizon_of,
    only_the_view_s_files_remain,
    produce,
    read,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def topic(broker: Broker):
    broker.settings.max_entries_per_ledger = 9
    broker.settings.compaction_max_deltas = 2
    broker.create_topic(NAME)
    return NAME


def layers(broker: Broker) -> list[str]:
    view = broker.topic(NAME).view
    assert view is not None
    return [layer.kind for layer in view.ledger.manifest.layers]


def rows(broker: Broker, **kw: object) -> list[tuple[Position, str | None, bytes | None]]:
    return [(e.position, e.key, e.value) for e in read(broker, compacted=True, **kw)]  # type: ignore[arg-type]


def random_pairs(rng: random.Random, n: int) -> list[tuple[str | None, bytes | None]]:
    out: list[tuple[str | None, bytes | None]] = []
    for _ in range(n):
        r = rng.random()
        key = None if r < 0.05 else f"key-{rng.randrange(60)}"
        out.append((key, None if 0.05 <= r < 0.2 else rng.randbytes(rng.randrange(1, 8))))
    return out


def test_many_rounds_of_deltas_and_consolidations_match_the_model(broker, compaction, topic) -> None:
    rng = random.Random(17)
    model = Model()
    shapes: list[list[str]] = []
    for _ in range(9):
        pairs = random_pairs(rng, rng.randrange(5, 40))
        model.add(produce(broker, *pairs), pairs)
        assert compaction.compact_now(topic).status == "SUCCESS"
        horizon = horizon_of(broker)
        assert rows(broker, page=7) == model.expected_read_compacted(horizon)
        # Starts inside the compacted range read the same as the model from there.
        for start in [p for p, _, _ in model.compacted(horizon)][::5]:
            assert rows(broker, start=str(start), page=3) == model.expected_read_compacted(horizon, start)
        assert only_the_view_s_files_remain(broker)
        shapes.append(layers(broker))
    # Deltas were added, and consolidated when there were two.
    assert ["base", "delta", "delta"] in shapes
    assert shapes.count(["base"]) >= 2


def test_a_leased_view_keeps_its_layers_until_its_reader_leaves(broker, compaction, topic) -> None:
    produce(broker, *[(f"k{i}", b"1") for i in range(20)])
    compaction.compact_now(topic)
    produce(broker, ("k1", b"2"), ("k2", None))
    compaction.compact_now(topic)
    assert layers(broker) == ["base", "delta"]
    old = broker.topic(NAME).view
    expected = rows(broker)
    with old.lease():
        for round_ in range(3):  # a delta, then a consolidation, then a delta on the new base
            produce(broker, (f"k{3 + round_}", b"3"))
            compaction.compact_now(topic)
        assert layers(broker) == ["base", "delta"]
        # The replaced view still reads everything it had: its base, delta and deletion vector.
        entries, nxt = old.ledger.read(Position(0, 0), 1000)
        assert nxt is None and [(e.position, e.key, e.value) for e in entries] == expected
        assert {f.local for f in old.files} <= compacted_files(broker.topic(NAME).ledger.root)
    # Once it is let go, only the current view's files remain.
    assert only_the_view_s_files_remain(broker)


STEPS = ["phase_one", "phase_two", "manifest", "rename", "before_commit", "after_commit"]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_leaves_the_old_ledger_or_the_new_one(
    broker, compaction, topic, settings, db, spark, tmp_path: Path, step: str
) -> None:
    """The topic's files as a crash at ``step`` would leave them (copied at that moment), then a
    restart: readers see the old ledger or the new one, whole, and nothing else stays."""
    model = Model()
    for pairs in ([(f"k{i}", b"1") for i in range(12)], [("k1", b"2"), ("k2", None), ("k3", b"2")]):
        model.add(produce(broker, *pairs), pairs)
        compaction.compact_now(topic)
    old_horizon = horizon_of(broker)
    assert layers(broker) == ["base", "delta"]
    pairs = [("k3", b"3"), ("k4", None), ("new", b"3")]
    model.add(produce(broker, *pairs), pairs)
    root = broker.topic(NAME).ledger.root
    snapshot = tmp_path / "at-crash"

    def crash(at: str) -> None:
        if at == step:
            shutil.copytree(root, snapshot)
            if at != "after_commit":
                raise RuntimeError(f"crash at {at}")

    compaction.fault_hook = crash
    compaction.compact_now(topic)
    new_horizon = horizon_of(broker)
    compaction.stop()
    broker.stop()
    shutil.rmtree(root)
    shutil.copytree(snapshot, root)

    b2 = Broker(settings=settings, db=db)
    b2.start()
    svc = CompactionService(broker=b2, compactor=lambda: TwoPhaseCompactor(spark, min_part_bytes=0))
    svc.start()
    try:
        expected_horizon = new_horizon if step == "after_commit" else old_horizon
        assert horizon_of(b2) == expected_horizon
        assert rows(b2) == model.expected_read_compacted(expected_horizon)
        assert only_the_view_s_files_remain(b2)
        # And the next round works from there.
        assert svc.compact_now(NAME).status == "SUCCESS"
        assert rows(b2) == model.expected_read_compacted(horizon_of(b2))
        assert only_the_view_s_files_remain(b2)
    finally:
        svc.stop()
        b2.stop()
