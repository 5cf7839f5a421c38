"""The compactor writing a table topic's typed value columns (``CompactionJob.value_schema``) on
both backends of ``ledger.storage`` (the bucket of ``.ci/s3`` skipped without it): full, delta
and consolidating rounds give the same compacted ledgers as without the columns -- the rows a
readCompacted reader sees, the manifests' lines (on object storage, as the tasks described
their parts) -- and every part they write has the columns, decoded from its values."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest

from compactor import CompactionResult, TwoPhaseCompactor
from ledger.entry import Position
from ledger.manifest_writer import describe_parts
from ledger.schema import COLUMNS
from ledger.value_columns import DECODE_FAILED, VALUE_SCHEMA_KEY, ValueSchema
from tests.compactor.test_object_storage import Topic, compactor, reference, seen, topic  # noqa: F401

pytestmark = pytest.mark.spark

SCHEMA = ValueSchema(
    "JSON",
    json.dumps(
        {
            "type": "record",
            "name": "V",
            "fields": [{"name": "n", "type": "long"}, {"name": "key", "type": "string"}],
        }
    ).encode(),
)


def _messages(rng: random.Random, n: int) -> list[tuple[str | None, bytes | None]]:
    out: list[tuple[str | None, bytes | None]] = []
    for _ in range(n):
        r = rng.random()
        key = None if r < 0.05 else f"k{rng.randrange(30)}"
        value = json.dumps({"n": rng.randrange(1000), "key": "inner"}).encode() if r < 0.8 else b"oops"
        out.append((key, None if r > 0.9 else value))
    return out


def test_typed_rounds_equal_the_rounds_without_the_columns(
    topic: Topic,  # noqa: F811
    reference: Topic,  # noqa: F811
    compactor: TwoPhaseCompactor,  # noqa: F811
) -> None:
    rng = random.Random(52)
    typed: list[CompactionResult] = []
    plain: list[CompactionResult] = []
    for lid in range(1, 5):
        batch = _messages(rng, 40)
        kw = {"max_deltas": 2, "consolidation_ratio": 1.0, "retain_null_key": True}
        for t, out, schema in ((topic, typed, SCHEMA), (reference, plain, None)):
            t.seal(lid, batch)
            previous = out[-1] if out else None
            out.append(
                compactor.compact(t.job(100 + lid, Position(lid, 39), previous, value_schema=schema, **kw))
            )
    assert [[layer.kind for layer in r.manifest.layers] for r in typed] == [
        ["base"],
        ["base", "delta"],
        ["base", "delta", "delta"],
        ["base"],
    ]
    names = [*COLUMNS, "n", "value_key", DECODE_FAILED]
    for got, want in zip(typed, plain, strict=True):
        assert seen(got.directory) == seen(want.directory)
        assert [(la.rows, la.dead) for la in got.manifest.layers] == [
            (la.rows, la.dead) for la in want.manifest.layers
        ]
        newest = got.manifest.layers[-1]
        assert newest.parts == describe_parts(got.directory, kind=newest.kind).parts
        for part in newest.parts:
            with (got.directory / part.name).open() as source:
                f = pq.ParquetFile(source)
                assert f.schema_arrow.names == names
                assert f.metadata.metadata[VALUE_SCHEMA_KEY] == SCHEMA.digest.encode()
                rows = f.read().to_pylist()
            for row in rows:
                decoded = row["value"] not in (None, b"", b"oops")
                assert row[DECODE_FAILED] is (row["value"] == b"oops")
                assert (row["n"] is not None) is decoded
                assert row["n"] == (json.loads(row["value"])["n"] if decoded else None)
