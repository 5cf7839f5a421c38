"""``python -m tests.benchmarks.batch_codec``: CPU microseconds per batch member (issue 48).

A batch of 1,000 members of 100-byte values, without a key and with a 10-character key: the
produce path's check (``check_batch``) and the rows sealing makes (``batch_table``), in C and in
Python, against the per-record path (``to_records``, then ``records_to_table``); and the same
members as 100 batches of 10, where ``batches_table`` makes one table of them all. The way back,
the stored members encoded as a consumer's batch (``encode_batch_payload``, and all of
``batch_message``, which a consumer of members to rebuild pays), in C and in Python. CPU time of
this process (the best of several runs), so that other load on the machine counts little.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.messages import batch_message, to_records
from ledger import batch_codec
from ledger.batch_codec import Batch
from ledger.batch_decoder import batch_table, batches_table, check_batch
from ledger.batch_encoder import encode_batch_payload
from ledger.entry import Entry, record_size
from ledger.schema import records_to_table

MEMBERS = 1000
VALUE = bytes(range(100))


def payload(n: int, keyed: bool) -> bytes:
    parts = []
    for i in range(n):
        md = pb.SingleMessageMetadata(payload_size=len(VALUE), sequence_id=i)
        if keyed:
            md.partition_key = f"key-{i:06d}"  # 10 characters
        meta = md.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, VALUE]
    return b"".join(parts)


def members(n: int, keyed: bool) -> list[Entry]:
    """A stored batch's members, as a read of a sealed ledger gives them."""
    return [
        Entry(1, i, f"key-{i:06d}" if keyed else None, VALUE, {}, 1, None, i, n, "p", i, None, None, None)
        for i in range(n)
    ]


def per_member(call: Callable[[], object], members: int, budget: float = 0.3) -> float:
    """CPU microseconds per member: the best of 5 runs of as many calls as fill ``budget``."""
    call()
    start = time.process_time()
    call()
    once = max(time.process_time() - start, 1e-6)
    calls = max(1, int(budget / 5 / once))
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - start) / calls)
    return best / members * 1e6


def _table_of(b: Batch) -> object:
    return batch_table(
        1,
        b.first_entry,
        b.num_messages,
        b.payload,
        publish_time=b.publish_time,
        producer_name=b.producer_name,
        first_sequence_id=b.first_sequence_id,
        deliver_at_time=b.deliver_at_time,
        ordering_key=b.ordering_key,
        schema_version=b.schema_version,
    )


def main() -> None:
    print(f"CPU us per member; batches of {MEMBERS} members of {len(VALUE)}-byte values")
    print(f"{'':44} {'no key':>8} {'10-char key':>12}")
    rows: dict[str, list[float]] = {}
    for keyed in (False, True):
        data = payload(MEMBERS, keyed)
        md = pb.MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=MEMBERS
        )

        def per_record_check(data: bytes = data, md: pb.MessageMetadata = md) -> object:
            return [record_size(r.key, r.value, r.properties) for r in to_records(md, data, len(data))]

        def per_record_table(data: bytes = data, md: pb.MessageMetadata = md) -> object:
            recs = to_records(md, data, len(data))
            for r in recs:
                r.publish_time = 1
            return records_to_table(1, recs, 0)

        def table(data: bytes = data) -> object:
            return batch_table(
                1,
                0,
                MEMBERS,
                data,
                publish_time=1,
                producer_name="p",
                first_sequence_id=0,
                deliver_at_time=None,
                ordering_key=None,
                schema_version=None,
            )

        stored = members(MEMBERS, keyed)
        small = payload(10, keyed)
        hundred = [Batch(10 * i, 10, small, 1, "p", 0, None, None, None) for i in range(100)]
        cases: dict[str, Callable[[], object]] = {
            "per record: to_records + record_size": per_record_check,
            "per record: to_records + records_to_table": per_record_table,
        }
        for native in (True, False):
            name = "C" if native else "Python"
            with batch_codec.use_native(native):
                rows.setdefault(f"check_batch ({name})", []).append(
                    per_member(lambda data=data: check_batch(data, MEMBERS), MEMBERS)
                )
                rows.setdefault(f"batch_table ({name})", []).append(per_member(table, MEMBERS))
                rows.setdefault(f"100 x 10: batch_table each ({name})", []).append(
                    per_member(lambda hundred=hundred: [_table_of(b) for b in hundred], MEMBERS)
                )
                rows.setdefault(f"100 x 10: batches_table ({name})", []).append(
                    per_member(lambda hundred=hundred: batches_table(1, hundred), MEMBERS)
                )
                rows.setdefault(f"encode_batch_payload ({name})", []).append(
                    per_member(lambda stored=stored: encode_batch_payload(stored, MEMBERS), MEMBERS)
                )
                rows.setdefault(f"batch_message ({name})", []).append(
                    per_member(lambda stored=stored: batch_message(stored), MEMBERS)
                )
        for label, call in cases.items():
            rows.setdefault(label, []).append(per_member(call, MEMBERS))
    for label, (plain, keyed_) in rows.items():
        print(f"{label:44} {plain:8.3f} {keyed_:12.3f}")


if __name__ == "__main__":
    main()
