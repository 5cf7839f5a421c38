"""Encrypted messages as the service stores and sends them (``api.pulsar.encryption``): the
context and the ciphertext go back to consumers byte for byte, an encrypted batch keeps its
positions and is never split, and what is not a context the service wrote stays a property."""

from __future__ import annotations

import pytest

from api.pulsar import encryption
from api.pulsar import pulsar_api_pb2 as pb
from api.pulsar.errors import ProtocolError
from api.pulsar.messages import check_batch, entry_frame, stored_message, to_batch, to_records
from api.schemas import to_records as rest_records
from ledger.batches import appended_table, batch_entries
from ledger.entry import ENCRYPTION_PROPERTY, BatchEntry, Entry, Record
from ledger.parquet_store import table_to_items
from service.errors import InvalidInput

CIPHERTEXT = bytes(range(256)) * 2


def _metadata(batch: int | None = None) -> pb.MessageMetadata:
    md = pb.MessageMetadata(
        producer_name="p",
        sequence_id=40,
        publish_time=0,
        partition_key="k",
        compression=pb.LZ4,
        uncompressed_size=900,
        encryption_algo="",
        encryption_param=b"iv-of-twelve",
    )
    md.encryption_keys.add(
        key="client-rsa.pem", value=b"encrypted data key", metadata=[pb.KeyValue(key="a", value="b")]
    )
    md.properties.add(key="p", value="1")
    if batch is not None:
        md.num_messages_in_batch = batch
    return md


def _stored_batch(n: int) -> tuple[pb.MessageMetadata, object]:
    md = _metadata(n)
    batch = to_batch(md, md.SerializeToString(), CIPHERTEXT)
    check_batch(batch, 10_000)
    return md, batch


def test_an_encrypted_message_goes_back_with_its_context_and_ciphertext_unchanged() -> None:
    md = _metadata()
    (record,) = to_records(md, CIPHERTEXT, 10_000)
    assert record.value == CIPHERTEXT  # not decompressed: it cannot be
    assert record.key == "k" and set(record.properties) == {"p", ENCRYPTION_PROPERTY}
    entry = Entry(3, 9, record.key, record.value, record.properties, 123, None, None, None, "p", 40)
    metadata, payload = entry_frame(entry)
    sent = pb.MessageMetadata.FromString(metadata)
    assert payload == CIPHERTEXT
    assert list(sent.encryption_keys) == list(md.encryption_keys)
    assert (sent.encryption_algo, sent.encryption_param) == ("", b"iv-of-twelve")
    assert (sent.compression, sent.uncompressed_size) == (pb.LZ4, 900)
    assert [(kv.key, kv.value) for kv in sent.properties] == [("p", "1")]
    assert not sent.HasField("num_messages_in_batch")


def test_a_keyed_message_declared_empty_deletes_its_key_and_still_goes_out_encrypted() -> None:
    """Pulsar's compactor takes an encrypted message whose uncompressed size is 0 for a delete."""
    md = _metadata()
    md.uncompressed_size = 0
    (record,) = to_records(md, b"sixteen byte tag", 10_000)
    assert record.value == b"" and record.is_tombstone
    entry = Entry(3, 9, record.key, record.value, record.properties, 123, None)
    metadata, payload = entry_frame(entry)
    assert payload == b"sixteen byte tag"
    assert pb.MessageMetadata.FromString(metadata).encryption_keys


def test_no_producer_may_set_the_services_own_property() -> None:
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=0)
    md.properties.add(key=ENCRYPTION_PROPERTY, value="forged")
    with pytest.raises(ProtocolError, match="the service's own"):
        to_records(md, b"v", 10_000)
    with pytest.raises(InvalidInput, match="the service's own"):
        rest_records([{"key": "k", "value": "dg==", "properties": {ENCRYPTION_PROPERTY: "forged"}}])


def test_a_property_of_that_name_the_service_did_not_write_stays_a_property() -> None:
    """(Stored before the service kept the name for itself.)"""
    entry = Entry(3, 9, "k", b"v", {ENCRYPTION_PROPERTY: "not a context"}, 123, None)
    metadata, payload = entry_frame(entry)
    sent = pb.MessageMetadata.FromString(metadata)
    assert [(kv.key, kv.value) for kv in sent.properties] == [(ENCRYPTION_PROPERTY, "not a context")]
    assert not sent.encryption_keys and payload == b"v"


def test_an_encrypted_batch_is_stored_as_its_members_with_the_ciphertext_in_the_first() -> None:
    md, batch = _stored_batch(4)
    members = batch_entries(5, 10, batch)  # type: ignore[arg-type]
    assert [(m.entry_id, m.batch_index, m.batch_size) for m in members] == [(10 + i, i, 4) for i in range(4)]
    first, rest = members[0], members[1:]
    assert (first.key, first.value, first.sequence_id) == ("k", CIPHERTEXT, 40)
    ctx = encryption.context(first.properties[ENCRYPTION_PROPERTY])
    assert ctx is not None and ctx.num_messages_in_batch == 4
    # The others are empty: no key, a null value (compaction always drops them).
    assert all((m.key, m.value, m.properties) == (None, None, {ENCRYPTION_PROPERTY: ""}) for m in rest)
    assert [m.sequence_id for m in rest] == [41, 42, 43]
    # A consumer of the stored batch gets the metadata as sent and the ciphertext.
    batch.publish_time = 77  # type: ignore[attr-defined]
    metadata, payload = stored_message(batch)  # type: ignore[arg-type]
    sent = pb.MessageMetadata.FromString(metadata)
    assert payload == CIPHERTEXT and sent.publish_time == 77
    md.publish_time = 77
    assert sent == md


def test_a_sealed_encrypted_batch_is_read_back_as_members_never_as_a_rebuilt_batch() -> None:
    _, encrypted = _stored_batch(3)
    plain_md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=0, num_messages_in_batch=2)
    plain = to_batch(
        plain_md, plain_md.SerializeToString(), b"\x00\x00\x00\x02\x18\x01a\x00\x00\x00\x02\x18\x01b"
    )
    check_batch(plain, 10_000)
    table = appended_table(5, [Record("r", b"x"), encrypted, plain])  # type: ignore[list-item]
    items = table_to_items(table)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Entry", "Entry", "Entry", "Entry", "BatchEntry"]
    assert isinstance(items[-1], BatchEntry) and items[-1].entry_id == 4


def test_members_of_an_encrypted_batch_go_as_one_message_with_an_ack_set() -> None:
    _, batch = _stored_batch(4)
    members = batch_entries(5, 10, batch)  # type: ignore[arg-type]
    first = members[0]
    mid, metadata, payload, ack_set = encryption.batch_message([members[0], members[2]], first, 2)
    assert (mid.ledgerId, mid.entryId, mid.partition) == (5, 10, 2)
    assert payload == CIPHERTEXT and ack_set == [0b0101]
    sent = pb.MessageMetadata.FromString(metadata)
    assert sent.num_messages_in_batch == 4 and sent.partition_key == "k" and sent.encryption_keys
    # A read that began after the first member: the ciphertext is the first member's still.
    assert encryption.batch_message(members[3:], first, -1)[2:] == (CIPHERTEXT, [0b1000])
    # The first member alone (a compacted ledger keeps nothing else): the batch whole.
    assert encryption.batch_message([first], first, -1)[3] == []
