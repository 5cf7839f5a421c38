"""``python -m tests.benchmarks.sealed_reads``: CPU microseconds per member of a consumer's read
of a sealed ledger of Pulsar batches.

A ledger of 100,000 members in batches of 400 (100-byte values, 10-character keys, as
``tests.benchmarks.batch_codec`` makes them), sealed as the service seals it. Before:
``SealedLedger.read`` (an ``Entry`` per member), and then each batch's members encoded back as a
consumer's payload (``encode_batch_payload``, what the binary protocol did with them). After:
``SealedLedger.read_batches`` (one ``BatchEntry`` per whole batch, encoded from the Arrow
buffers), in C and in Python. Two shapes: the whole ledger in one read with its row groups
already decoded (the encoding alone), and a pass over it in pages of 1,000 entries with a fresh
reader (row groups decoded as the pages reach them; a page cuts batches, whose members stay
entries). CPU time of this process, the best of several runs.
"""

from __future__ import annotations

import gc
import struct
import tempfile
import time
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

from api.pulsar import pulsar_api_pb2 as pb
from ledger import batch_codec
from ledger.batch_codec import Batch
from ledger.batch_decoder import batches_table
from ledger.batch_encoder import encode_batch_payload
from ledger.entry import Entry
from ledger.parquet_store import SealedLedger, seal_table

MEMBERS = 400
BATCHES = 250
VALUE = bytes(range(100))
PAGE = 1000


def payload(n: int) -> bytes:
    parts = []
    for i in range(n):
        md = pb.SingleMessageMetadata(payload_size=len(VALUE), sequence_id=i, partition_key=f"key-{i:06d}")
        meta = md.SerializeToString()
        parts += [struct.pack(">I", len(meta)), meta, VALUE]
    return b"".join(parts)


def seal_ledger(path: Path) -> None:
    data = payload(MEMBERS)
    batches = [
        Batch(k * MEMBERS, MEMBERS, data, 1_700_000_000_000, "p", k * MEMBERS, None, None, None)
        for k in range(BATCHES)
    ]
    seal_table(batches_table(1, batches), path)


def encoded(entries: list[Entry]) -> list[object]:
    """What the protocol made of a read: each batch's members as one payload, the rest alone."""
    out: list[object] = []
    for _, members in groupby(entries, key=lambda e: e.entry_id - (e.batch_index or 0)):
        group = list(members)
        n = group[0].batch_size
        out.append(encode_batch_payload(group, n) if n else group[0])
    return out


def best(call: Callable[[], object], runs: int = 5) -> float:
    """CPU seconds of the fastest of ``runs`` calls (after one to warm up)."""
    call()
    times = []
    for _ in range(runs):
        gc.collect()  # not the garbage of the run before
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    total = MEMBERS * BATCHES
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.parquet"
        seal_ledger(path)
        warm = SealedLedger(path, ledger_id=1)

        def pages(read: Callable[[SealedLedger, int, int], object]) -> Callable[[], object]:
            def run() -> object:
                ledger = SealedLedger(path, ledger_id=1)
                try:
                    for start in range(0, total, PAGE):
                        read(ledger, start, PAGE)  # sent and dropped, as a consumer's page is
                    return None
                finally:
                    ledger.close()

            return run

        cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
            "read (an Entry per member)": (
                lambda: warm.read(0, total),
                pages(SealedLedger.read),
            ),
            "read + encode_batch_payload per batch": (
                lambda: encoded(warm.read(0, total)),
                pages(lambda ledger, start, n: encoded(ledger.read(start, n))),
            ),
        }
        for native in (True, False):
            name = "C" if native else "Python"

            def with_codec(call: Callable[[], object], native: bool = native) -> Callable[[], object]:
                def run() -> object:
                    with batch_codec.use_native(native):
                        return call()

                return run

            cases[f"read_batches ({name})"] = (
                with_codec(lambda: warm.read_batches(0, total)),
                with_codec(pages(SealedLedger.read_batches)),
            )
        print(f"CPU us per member; {BATCHES} batches of {MEMBERS} members of {len(VALUE)}-byte values")
        print(f"{'':40} {'one read, decoded':>18} {f'pages of {PAGE}, cold':>20}")
        for label, (whole, paged) in cases.items():
            a = best(whole) / total * 1e6
            b = best(paged, runs=3) / total * 1e6
            print(f"{label:40} {a:18.3f} {b:20.3f}")
        warm.close()


if __name__ == "__main__":
    main()
