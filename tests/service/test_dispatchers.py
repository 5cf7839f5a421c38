"""Key_Shared's building blocks as Pulsar has them: the sticky-key hash and the auto-split
hash ranges (a new consumer halves the biggest range; a leaving one hands its range on)."""

from __future__ import annotations

from service.dispatchers import RANGE_SIZE, HashRangeAutoSplitSelector, murmur3_32, sticky_hash


def test_murmur3_matches_the_reference_vectors() -> None:
    # MurmurHash3_x86_32 reference values (seed 0): what Pulsar's Murmur3_32Hash computes.
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert 0 <= sticky_hash("any key") < RANGE_SIZE
    assert sticky_hash(None) == sticky_hash("NONE_KEY")  # keyless messages share Pulsar's NONE_KEY


def test_ranges_split_and_merge_as_pulsars_auto_split_selector() -> None:
    sel = HashRangeAutoSplitSelector()
    sel.add("c1")
    assert sel.ranges("c1") == [(0, RANGE_SIZE)]
    sel.add("c2")  # 0 -> 32768 (c2) -> 65536 (c1), Pulsar's own example
    assert sel.ranges("c2") == [(0, 32768)] and sel.ranges("c1") == [(32769, RANGE_SIZE)]
    sel.add("c3")  # the biggest range is c2's (one more slot than c1's): it is halved
    assert sel.ranges("c3") == [(0, 16384)] and sel.ranges("c2") == [(16385, 32768)]
    assert sel.select(0) == "c3" and sel.select(20000) == "c2" and sel.select(RANGE_SIZE - 1) == "c1"
    sel.remove("c2")  # its range goes to the next one up
    assert sel.ranges("c1") == [(16385, RANGE_SIZE)]
    sel.remove("c1")  # the top range goes to the one below
    assert sel.ranges("c3") == [(0, RANGE_SIZE)]
    assert {sel.select(s) for s in range(0, RANGE_SIZE, 997)} == {"c3"}


def test_every_slot_has_exactly_one_consumer_as_consumers_come_and_go() -> None:
    sel = HashRangeAutoSplitSelector()
    live: list[str] = []
    for i in range(40):
        if live and i % 3 == 2:
            sel.remove(live.pop(i % len(live)))
        else:
            live.append(f"c{i}")
            sel.add(live[-1])
        covered = sorted(r for c in live for r in sel.ranges(c))
        assert covered[0][0] == 0 and covered[-1][1] == RANGE_SIZE
        assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:], strict=False))
