# The C extension ledger/_batch_codec.c; ledger/batch_codec.py is its interface.
from collections.abc import Sequence
from typing import Any

def check(
    payload: bytes | bytearray | memoryview, count: int, max_members: int, first_sequence_id: int, /
) -> int: ...
def decode(ledger_id: int, batches: Sequence[tuple[Any, ...]], max_members: int, /) -> tuple[Any, ...]: ...
