"""Interleaved A/B of what integrity checks cost, on one generated workload: decoding every row
group of every sealed ledger (consume's work) with page checksum verification off and on, the
whole-file CRC32C pass a round runs over inputs not yet verified, and sealing's write and
read-back. Alternating runs in one process, so that a shared machine's load hits both sides;
times are CPU seconds of the process (``time.process_time``), which another process's load
inflates far less than wall-clock time.

``python -m tests.benchmarks.integrity [MESSAGES]`` (default 1,000,000); figures on stdout.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from ledger.checksums import file_checksum
from ledger.parquet_store import verify_written
from tests.benchmarks.workload import WorkloadSpec, generate

RUNS = 9


def timed(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def decode_all(files: list[Path], verify: bool) -> None:
    for path in files:
        with pq.ParquetFile(path, page_checksum_verification=verify) as f:
            for rg in range(f.num_row_groups):
                f.read_row_group(rg)


def main(messages: int) -> None:
    spec = WorkloadSpec(messages, max(1, messages // 10))
    root = Path(tempfile.mkdtemp())
    work = generate(root / "t", spec)
    files = [p for _, p in work.ledgers]
    mb = work.parquet_bytes / 1e6
    print(f"{spec.label}: {len(files)} ledgers, {mb:.0f} MB")

    off: list[float] = []
    on: list[float] = []
    for _ in range(RUNS):
        off.append(timed(lambda: decode_all(files, False)))
        on.append(timed(lambda: decode_all(files, True)))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(
        f"decode every row group: verification off {m_off:.3f} s, on {m_on:.3f} s ({(m_on / m_off - 1):+.1%})"
    )

    crc = statistics.median(timed(lambda: [file_checksum(p) for p in files]) for _ in range(RUNS))
    print(f"whole-file CRC32C of every input: {crc:.3f} s ({mb / crc:.0f} MB/s)")

    table = pq.read_table(files[0])
    out = root / "x.parquet"
    plain: list[float] = []
    checked: list[float] = []
    back: list[float] = []
    for _ in range(RUNS):
        for flag, into in ((False, plain), (True, checked)):
            into.append(
                timed(
                    lambda flag=flag: pq.write_table(
                        table, out, row_group_size=8192, compression="zstd", write_page_checksum=flag
                    )
                )
            )
        back.append(timed(lambda: verify_written(out, table)))
    print(
        f"seal one ledger ({table.num_rows} rows): write {statistics.median(plain) * 1000:.1f} ms, "
        f"with page checksums {statistics.median(checked) * 1000:.1f} ms, "
        f"read back and compare {statistics.median(back) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
