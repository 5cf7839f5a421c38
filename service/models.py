"""Metadata tables (SQLAlchemy 2.x). The schema is created only by the Alembic migrations."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments INTEGER PRIMARY KEY; BigInteger elsewhere.
IdType = BigInteger().with_variant(Integer(), "sqlite")

# Ledger states.
OPEN = "OPEN"
CLOSED = "CLOSED"
BUILDING = "BUILDING"  # a compacted ledger being written; not yet committed
DELETED = "DELETED"

ORIGINAL = "ORIGINAL"
COMPACTED = "COMPACTED"


class Base(DeclarativeBase):
    pass


class Topic(Base):
    """A topic ``persistent://tenant/namespace/name``."""

    __tablename__ = "topics"
    __table_args__ = (UniqueConstraint("tenant", "namespace", "name", name="uq_topics_name"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    namespace: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[int] = mapped_column(BigInteger)
    # Set once the topic is terminated (Pulsar's terminate): the id of its last message, for
    # ever; entry -1 when it had none. NULL: it takes writes.
    terminated_ledger: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    terminated_entry: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Ledger(Base):
    """An original ledger (a segment of the topic's log) or a compacted ledger.

    Ids come from one increasing sequence for both kinds (``sqlite_autoincrement`` keeps
    SQLite from reusing the ids of deleted rows).
    """

    __tablename__ = "ledgers"
    __table_args__ = (
        Index("ix_ledgers_topic", "topic_id", "kind", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    entries: Mapped[int] = mapped_column(BigInteger, default=0)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    file_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    closed_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    first_publish_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_publish_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Integrity (ledger.checksums; README "Integrity and repair"). ``checksum``: the sealed
    # file's CRC32C, or a compacted ledger's manifest's ("crc32c:xxxxxxxx"); NULL for files
    # written before checksums, until the scrubber records one.
    checksum: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The first damage found ("<check> failed: <detail>"), and when; NULL while intact.
    damage: Mapped[str | None] = mapped_column(Text, nullable=True)
    damaged_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When an operator accepted losing the damaged entries (skip-damaged); the entry ranges
    # lost ("a-b,c-d"); the CRC32C of the copy of the intact rows compactions read from then.
    damage_accepted_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lost_entries: Mapped[str | None] = mapped_column(Text, nullable=True)
    salvage_checksum: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # When the scrubber last found the file intact.
    verified_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The epoch of the topic's owner that opened it (0 for a single instance): an owner appends
    # only to a ledger of its own epoch, and seals an older epoch's open ledger when it takes over.
    epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The epoch of the owner that sealed it, which names its sealed file (ledger.paths): an
    # owner that takes a topic over seals the old owner's open ledger under a name of its own,
    # so a fenced-off old owner's late upload never replaces the file this row publishes.
    sealed_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class Instance(Base):
    """A running (or once running) service instance: where clients reach it, and when it last
    said it was alive. Each process start registers a new row."""

    __tablename__ = "instances"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(String(512))
    started_at: Mapped[int] = mapped_column(BigInteger)
    heartbeat_at: Mapped[int] = mapped_column(BigInteger)
    # pulsar://host:port of its binary protocol; None when it does not listen for it.
    broker_url: Mapped[str | None] = mapped_column(String(512), nullable=True)


class TopicLease(Base):
    """Who owns a topic (Pulsar's bundle ownership): ``instance_id`` holds it until
    ``expires_at`` (ms, the database's clock) unless it renews; every takeover raises ``epoch``.
    ``instance_id`` is NULL for a topic nobody has owned yet."""

    __tablename__ = "topic_leases"
    __table_args__ = (Index("ix_topic_leases_instance", "instance_id"),)

    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"), primary_key=True)
    instance_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[int] = mapped_column(BigInteger, default=0)


class Cursor(Base):
    """A durable subscription cursor. ``__compaction`` is the compactor's own cursor."""

    __tablename__ = "cursors"
    __table_args__ = (UniqueConstraint("topic_id", "name", name="uq_cursors_name"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    # Mark-delete position: every entry at or before it is consumed. (-1, -1) = nothing yet.
    mark_delete_ledger: Mapped[int] = mapped_column(BigInteger, default=-1)
    mark_delete_entry: Mapped[int] = mapped_column(BigInteger, default=-1)
    created_at: Mapped[int] = mapped_column(BigInteger)


class CursorProperty(Base):
    """Named long values attached to a cursor's mark-delete position (as Pulsar's)."""

    __tablename__ = "cursor_properties"

    cursor_id: Mapped[int] = mapped_column(ForeignKey("cursors.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(256), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class CursorAck(Base):
    """An id acknowledged individually beyond the cursor's mark-delete position."""

    __tablename__ = "cursor_acks"

    cursor_id: Mapped[int] = mapped_column(ForeignKey("cursors.id", ondelete="CASCADE"), primary_key=True)
    ledger_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    entry_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)


class CompactionRun(Base):
    """One compaction of a topic: its trigger, horizon, statistics and outcome."""

    __tablename__ = "compaction_runs"
    __table_args__ = (Index("ix_compaction_runs_topic", "topic_id", "id"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"))
    trigger: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[int] = mapped_column(BigInteger)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    horizon_ledger: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    horizon_entry: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compacted_ledger_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    entries_read: Mapped[int] = mapped_column(BigInteger, default=0)
    records_kept: Mapped[int] = mapped_column(BigInteger, default=0)
    records_removed: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_in: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_out: Mapped[int] = mapped_column(BigInteger, default=0)
    phase_one_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    phase_two_ms: Mapped[int] = mapped_column(BigInteger, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ScrubRun(Base):
    """One scrub of a topic: every file verified against its recorded checksum.

    ``status`` is ``CLEAN`` (nothing damaged), ``DAMAGED`` (``findings`` holds one line per
    damaged file) or ``ERROR`` (the scrub itself failed); ``checksums_recorded`` counts files
    written before checksums whose checksum this scrub recorded."""

    __tablename__ = "scrub_runs"
    __table_args__ = (Index("ix_scrub_runs_topic", "topic_id", "id"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"))
    trigger: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[int] = mapped_column(BigInteger)
    finished_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    files_checked: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes_checked: Mapped[int] = mapped_column(BigInteger, default=0)
    damaged_files: Mapped[int] = mapped_column(BigInteger, default=0)
    checksums_recorded: Mapped[int] = mapped_column(BigInteger, default=0)
    findings: Mapped[str | None] = mapped_column(Text, nullable=True)


class Policy(Base):
    """Compaction, retention, deduplication and schema policy of a namespace (``topic == ""``) or a
    topic.

    A NULL column means "not set here": the topic inherits the namespace's, then the service's.
    """

    __tablename__ = "policies"
    __table_args__ = (UniqueConstraint("tenant", "namespace", "topic", name="uq_policies_scope"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    namespace: Mapped[str] = mapped_column(String(128))
    topic: Mapped[str] = mapped_column(String(128), default="")
    compaction_threshold: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_cleanable_dirty_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_compaction_lag_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_compaction_lag_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    delete_retention_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    retain_null_key: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    compaction_strategy: Mapped[str | None] = mapped_column(String(256), nullable=True)
    retention_time_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    retention_size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    deduplication_enabled: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Pulsar's SchemaCompatibilityStrategy name (never UNDEFINED: that is NULL, "not set here").
    schema_compatibility_strategy: Mapped[str | None] = mapped_column(String(32), nullable=True)
    is_allow_auto_update_schema: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    schema_validation_enforced: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Whether compaction rounds commit the topic's Iceberg table (the API's ``table``).
    table_enabled: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class BacklogQuota(Base):
    """One backlog quota (Pulsar's ``BacklogQuota``) of a namespace (``topic == ""``) or a topic,
    for one quota type: ``destination_storage`` (bytes) or ``message_age`` (seconds)."""

    __tablename__ = "backlog_quotas"
    __table_args__ = (
        UniqueConstraint("tenant", "namespace", "topic", "quota_type", name="uq_backlog_quotas_scope"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128))
    namespace: Mapped[str] = mapped_column(String(128))
    topic: Mapped[str] = mapped_column(String(128), default="")
    quota_type: Mapped[str] = mapped_column(String(32))
    limit_size: Mapped[int] = mapped_column(BigInteger)
    limit_time: Mapped[int] = mapped_column(BigInteger)
    policy: Mapped[str] = mapped_column(String(32))


class Tenant(Base):
    """A tenant, as Pulsar's: the roles that administer it and the clusters it may use."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    # JSON arrays of strings: read and written whole, never queried into.
    admin_roles: Mapped[str] = mapped_column(Text, default="[]")
    allowed_clusters: Mapped[str] = mapped_column(Text, default="[]")
    created_at: Mapped[int] = mapped_column(BigInteger)


class Namespace(Base):
    """A namespace ``tenant/name``: topics are created only in one that exists (as Pulsar)."""

    __tablename__ = "namespaces"

    tenant: Mapped[str] = mapped_column(
        String(128), ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class Permission(Base):
    """The actions (``produce``, ``consume``) a role is granted on a namespace (``topic == ""``)
    or on one topic of it."""

    __tablename__ = "permissions"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    topic: Mapped[str] = mapped_column(String(128), primary_key=True)
    role: Mapped[str] = mapped_column(String(256), primary_key=True)
    # Comma-separated, sorted: "consume", "produce" or "consume,produce".
    actions: Mapped[str] = mapped_column(String(64))


class Schema(Base):
    """One version of a topic's schema (Pulsar's schema registry): versions 0, 1, 2, ... in the
    order they were first declared, never changed once written."""

    __tablename__ = "schemas"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    topic: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    # Pulsar's type name (JSON, AVRO, STRING, PROTOBUF, ...).
    type: Mapped[str] = mapped_column(String(32))
    data: Mapped[bytes] = mapped_column(LargeBinary)
    # A JSON object of strings: read and written whole, never queried into.
    properties: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[int] = mapped_column(BigInteger)


class PartitionedTopic(Base):
    """A partitioned topic ``tenant/namespace/name`` of ``partitions`` partitions, each an
    ordinary topic ``{name}-partition-{i}`` (Pulsar's partitioned-topic metadata)."""

    __tablename__ = "partitioned_topics"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    partitions: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # The properties it was created with, a JSON object of strings read and written whole (NULL:
    # created without any, as Pulsar's metadata then has none).
    properties: Mapped[str | None] = mapped_column(Text, nullable=True)


class WalChunk(Base):
    """Where entries of an open ledger are stored with ``COMPACTOR_WAL=object``: entries
    ``[first_entry, first_entry + entries)`` of ``ledger_id`` are ``byte_length`` bytes at
    ``byte_offset`` of the write-ahead object ``object_key`` (a key of the ledger storage).

    Recorded by the flush that stored the object, fenced like every change to the topic's log;
    removed once the ledger is sealed, and an object goes when no chunk names it."""

    __tablename__ = "wal_chunks"
    __table_args__ = (
        Index("ix_wal_chunks_ledger", "ledger_id", "first_entry"),
        Index("ix_wal_chunks_object", "object_key"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    ledger_id: Mapped[int] = mapped_column(ForeignKey("ledgers.id", ondelete="CASCADE"))
    first_entry: Mapped[int] = mapped_column(BigInteger)
    entries: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str] = mapped_column(String(512))
    byte_offset: Mapped[int] = mapped_column(BigInteger)
    byte_length: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)


class TopicTable(Base):
    """The Iceberg table of a compacted topic (``service.tables``): the catalog's row.

    One per table: a non-partitioned topic's, or a partitioned topic's (``name`` is then the
    partitioned topic's; its partitions' rounds commit into it). ``metadata_location`` names the
    table's current metadata file; a commit replaces it only if ``version`` is still the one it
    read (compare-and-swap: rounds of several partitions, or several instances, commit one
    after the other, never over each other).
    """

    __tablename__ = "topic_tables"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    metadata_location: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class TableCommitState(Base):
    """How a topic's (a partition's) table commits fare: rounds compacted since its last
    committed snapshot (the table's lag) and the last commit's error, for the compaction status,
    the metrics and the dashboard. A row only for topics whose rounds commit a table."""

    __tablename__ = "table_commit_states"

    topic_id: Mapped[int] = mapped_column(ForeignKey("topics.id", ondelete="CASCADE"), primary_key=True)
    lag_rounds: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The snapshot the topic's last committed round made, and that round's compacted ledger.
    snapshot_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ledger_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger, default=0)
