"""Service configuration: one pydantic-settings class read from ``COMPACTOR_*`` variables.

Why one module: every setting is a field of the one class pydantic-settings reads from the
environment, and the validators that check settings against each other (security, TLS ports,
listeners, storage) must see them all; the checks of a kind live beside their job
(``service.tls``, ``service.listeners``, ``service.basic_auth``) and are called from here."""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ledger.storage import S3Settings, Storage, StorageError, open_storage
from service.listeners import Listener, parse_listeners
from service.schema_compat import Strategy
from service.tls import check_tls_settings

FsyncPolicy = Literal["always", "interval", "never"]
#: What the row-group cache holds by default on object storage (``Settings.cache_bytes``).
OBJECT_STORAGE_CACHE_BYTES = 256 * 1024 * 1024


class Settings(BaseSettings):
    """Everything an operator can set. Defaults give a single-process service with embedded
    storage: SQLite and ledger files under ``./data``, Spark in ``local[*]`` mode."""

    model_config = SettingsConfigDict(env_prefix="COMPACTOR_", extra="ignore")

    data_dir: Path = Field(default=Path("./data"), description="Storage root for ledger files.")
    storage_url: str = Field(
        default="",
        description="Where sealed and compacted ledgers are kept: a local directory (a path or file://) "
        "or S3-compatible object storage (s3://bucket/prefix); data_dir when empty.",
    )
    s3_endpoint_url: str = Field(
        default="", description="The S3 endpoint (http(s)://host:port); AWS's own when empty."
    )
    s3_region: str = Field(default="", description="The S3 region; AWS_REGION or us-east-1 when empty.")
    s3_access_key_id: str = Field(
        default="", description="S3 credentials; AWS's chain (AWS_ACCESS_KEY_ID, ~/.aws, a role) when empty."
    )
    s3_secret_access_key: SecretStr = Field(
        default=SecretStr(""), description="The secret of s3_access_key_id."
    )
    cache_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Hot decoded row groups of sealed and compacted ledgers kept in memory, in bytes, "
        "for every topic together (ledger.row_group_cache); when unset, 256 MiB on object storage and "
        "0 (none: the page cache does it) on a local disk.",
    )
    local_copies_bytes: int = Field(
        default=1024 * 1024 * 1024,
        ge=0,
        description="On object storage with Spark in local mode: the sealed ledgers this instance "
        "uploaded (and the older layers' files its delta rounds verified), also kept on its own disk "
        "(under data_dir/local-copies) for its compaction rounds to read instead of the bucket, in "
        "bytes, least recently used out first (ledger.local_copies); 0 keeps none.",
    )
    database_url: str = Field(
        default="", description="SQLAlchemy URL of the metadata store; SQLite under data_dir when empty."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    advertised_url: str = Field(
        default="",
        description="The URL other instances redirect clients to for this instance's topics; "
        "http(s)://host:port from host and port when empty.",
    )
    broker_service_port: int = Field(
        default=6650,
        ge=0,
        le=65535,
        description="Port of Pulsar's binary protocol (pulsar://host:port) on the same host as REST; "
        "0 turns it off (Pulsar's brokerServicePort).",
    )
    # NoDecode: Pulsar's form (name:pulsar://host:port,...), parsed by the validator.
    advertised_listeners: Annotated[dict[str, Listener], NoDecode] = Field(
        default_factory=dict,
        description="Names under which clients of different networks reach the binary protocol: "
        "name:pulsar://host:port, comma-separated (Pulsar's advertisedListeners). A client asking "
        "for a listener by name gets its URL; one asking for a name not here is refused.",
    )
    internal_listener_name: str = Field(
        default="",
        description="The listener a client that names none is answered (and other instances send "
        "clients to); the first of advertised_listeners when empty (Pulsar's internalListenerName).",
    )
    allow_auto_topic_creation: bool = Field(
        default=True,
        description="Create a topic on its first use by a producer or consumer of the binary protocol, "
        "or a lookup of it (HTTP or binary), in a namespace that exists (Pulsar's allowAutoTopicCreation).",
    )
    enable_non_persistent_topics: bool = Field(
        default=True,
        description="Serve non-persistent topics (non-persistent://): held in memory, delivered to the "
        "consumers connected now, stored nowhere (Pulsar's enableNonPersistentTopics).",
    )
    max_partitions_per_topic: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="The most partitions a partitioned topic may have (Pulsar's "
        "maxNumPartitionsPerPartitionedTopic; each partition is a topic with its own files).",
    )
    broker_deduplication_enabled: bool = Field(
        default=False,
        description="Pulsar's producer deduplication for topics whose namespace or topic policy does "
        "not say (Pulsar's brokerDeduplicationEnabled).",
    )
    backlog_quota_check_enabled: bool = Field(
        default=True,
        description="Check backlog quotas periodically: disconnect the producers of a topic over a "
        "producer_* quota, evict the backlog over a consumer_backlog_eviction one (Pulsar's "
        "backlogQuotaCheckEnabled). Producers are checked as they connect either way.",
    )
    backlog_quota_check_interval_in_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How often backlog quotas are checked (Pulsar's backlogQuotaCheckIntervalInSeconds).",
    )
    backlog_quota_default_limit_bytes: int = Field(
        default=-1,
        ge=-1,
        description="The destination_storage backlog quota of topics whose topic and namespace set none, "
        "in bytes; -1: none (Pulsar's backlogQuotaDefaultLimitBytes).",
    )
    backlog_quota_default_limit_second: int = Field(
        default=-1,
        ge=-1,
        description="The message_age backlog quota of topics whose topic and namespace set none, in "
        "seconds; -1: none (Pulsar's backlogQuotaDefaultLimitSecond).",
    )
    backlog_quota_default_retention_policy: Literal[
        "producer_request_hold", "producer_exception", "consumer_backlog_eviction"
    ] = Field(
        default="producer_request_hold",
        description="What the default backlog quotas do when exceeded (Pulsar's "
        "backlogQuotaDefaultRetentionPolicy).",
    )
    schema_compatibility_strategy: Strategy = Field(
        default="FULL",
        description="How a topic's new schema must relate to its existing ones when neither the "
        "topic nor its namespace says (Pulsar's schemaCompatibilityStrategy): ALWAYS_COMPATIBLE, "
        "ALWAYS_INCOMPATIBLE, BACKWARD, FORWARD, FULL or a _TRANSITIVE form.",
    )
    is_allow_auto_update_schema_enabled: bool = Field(
        default=True,
        description="Whether a producer may add a new schema version to a topic (checked against "
        "the strategy) when its namespace does not say (Pulsar's isAllowAutoUpdateSchemaEnabled); "
        "false: only schemas uploaded by an admin.",
    )
    is_schema_validation_enforced: bool = Field(
        default=False,
        description="Refuse a producer without a schema on a topic that has one, when the topic or "
        "its namespace does not say (Pulsar's isSchemaValidationEnforced).",
    )
    ownership_lease_ms: int = Field(
        default=10_000,
        ge=500,
        le=600_000,
        description="How long a topic's owner holds it without renewing (several instances on "
        "PostgreSQL); another instance takes the topic over when it lapses.",
    )

    fsync: FsyncPolicy = "always"
    fsync_interval_ms: int = Field(default=100, ge=1)
    wal: Literal["local", "object"] = Field(
        default="local",
        description="Where an open ledger's write-ahead log is: 'local' (a file in data_dir, "
        "fsynced per fsync policy) or 'object' (group-committed objects in the ledger storage: no "
        "local disk, and any instance can take over any topic with every acknowledged message).",
    )
    wal_flush_ms: int = Field(
        default=100,
        ge=1,
        le=60_000,
        description="COMPACTOR_WAL=object: how long appended messages wait to be stored together "
        "(one object for every topic of the instance); an acknowledgement waits up to this long.",
    )
    wal_flush_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="COMPACTOR_WAL=object: store the waiting messages at once when they reach this size.",
    )

    max_entries_per_ledger: int = Field(default=50_000, ge=1, le=2**32 - 1)
    max_ledger_size_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    max_ledger_age_ms: int = Field(default=4 * 60 * 60 * 1000, ge=1)

    max_message_size: int = Field(default=5 * 1024 * 1024, ge=1)
    max_chunked_message_size: int = Field(
        default=128 * 1024 * 1024,
        ge=1,
        le=2**31 - 1,
        description="Largest whole message a producer may send in chunks (Pulsar has no broker bound).",
    )
    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    max_read_messages: int = Field(default=10_000, ge=1, description="Cap on one read page.")

    consumer_timeout_ms: int = Field(
        default=30_000, ge=1, description="A consumer silent this long is detached; its messages redelivered."
    )
    worker_threads: int = Field(
        default=200, ge=8, description="Threads serving blocking requests and long polls."
    )
    keep_alive_seconds: int = Field(
        default=65, ge=1, description="Idle HTTP keep-alive; longer than clients' pools keep connections."
    )

    # Bounds on descriptors and memory (README, "Limits").
    max_open_ledger_files: int = Field(
        default=256,
        ge=4,
        description="Sealed-ledger files kept open for reads (an LRU, closed on eviction); "
        "at most a quarter of the descriptor limit.",
    )
    ledger_read_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Decoded row groups the open sealed-ledger readers keep, in bytes, all together.",
    )
    ledger_file_idle_ms: int = Field(
        default=60_000, ge=1, description="A sealed-ledger file no read used for this long is closed."
    )
    max_pending_seals_per_topic: int = Field(
        default=16, ge=1, description="Closed ledgers of one topic waiting to be sealed before produce waits."
    )
    max_pending_seals: int = Field(
        default=64,
        ge=1,
        description="Closed ledgers of all topics waiting to be sealed before a produce waits.",
    )
    seal_wait_ms: int = Field(
        default=5_000,
        ge=0,
        description="How long a produce waits for the seal backlog to drain before it answers 503.",
    )
    seal_cache_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        description="Payload bytes kept in memory for sealing, all ledgers together (beyond: read back).",
    )
    max_unacked_messages_per_consumer: int = Field(
        default=50_000,
        ge=0,
        description="Delivered, unacknowledged messages a consumer may hold before receive delivers "
        "no more (Pulsar's maxUnackedMessagesPerConsumer; 0 = unbounded). Exclusive and Failover "
        "consumers count deliveries: a Pulsar batch delivered whole is one.",
    )

    spark_master: str = "local[*]"
    spark_driver_memory: str = "2g"
    spark_ui: bool = False
    spark_shuffle_partitions: int | None = Field(default=None, ge=1)
    spark_warmup: bool = Field(
        default=True,
        description="Start Spark, and run a throw-away compaction round, in the background at start-up.",
    )
    spark_warmup_jobs: int = Field(
        default=150,
        ge=0,
        description="With warm-up on: empty Spark jobs run after the warm-up round, so that the JVM has "
        "compiled the path every round's job takes before the first rounds (0: none).",
    )
    spark_python: str | None = Field(
        default=None, description="The executors' Python interpreter on a cluster (spark.pyspark.python)."
    )
    spark_archives: str | None = Field(
        default=None, description="Archives unpacked beside each executor (spark.archives): a packed venv."
    )
    # NoDecode: the variable may be `k=v,k=v` as well as JSON; the validator parses both.
    spark_conf: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description="Any other spark.* settings: a JSON object or k=v,k=v."
    )
    spark_probe_timeout_seconds: float = Field(
        default=120.0, gt=0, description="How long the start-up probe of a cluster's executors may take."
    )

    compaction_monitor_interval_seconds: float = Field(default=60.0, gt=0)
    compaction_workers: int = Field(default=1, ge=1)
    compaction_threshold: int = Field(default=0, ge=0, description="Service-wide default, bytes; 0 = off.")
    compaction_max_deltas: int = Field(
        default=8,
        ge=0,
        description="A round adds a delta layer to the compacted ledger while it has fewer deltas than "
        "this; otherwise it consolidates the layers into a new base (0: every round rewrites).",
    )
    compaction_consolidation_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A round consolidates the compacted ledger's layers into a new base once this share "
        "of its stored rows is dead (superseded by newer layers).",
    )
    retain_null_key: bool = False

    # Compacted topics as Iceberg tables (README, "Query compacted topics as tables").
    table_default: bool = Field(
        default=False,
        description="Whether a topic's compaction rounds commit its Iceberg table when neither its "
        "policy nor its namespace's sets `table`.",
    )
    table_s3_access_key_id: str = Field(
        default="",
        description="The S3 key the Iceberg REST catalog hands to engines, with a table, to read the "
        "bucket (give a read-only key); empty: none is handed out, engines bring their own.",
    )
    table_s3_secret_access_key: SecretStr = Field(
        default=SecretStr(""), description="The secret of table_s3_access_key_id."
    )
    table_snapshots_kept: int = Field(
        default=10, ge=1, description="Table snapshots kept per table (the current one always is)."
    )
    table_snapshot_max_age_seconds: float = Field(
        default=5 * 24 * 60 * 60.0,
        gt=0,
        description="A table snapshot older than this is expired (the current one never is), as "
        "Iceberg's history.expire.max-snapshot-age-ms.",
    )

    # Integrity (README, "Integrity and repair"): the background scrubber verifies every file
    # against its recorded checksum once per interval, reading at most this many bytes/s.
    scrub_interval_seconds: float = Field(
        default=24 * 60 * 60.0, ge=0, description="Seconds between background scrubs; 0 = off."
    )
    scrub_bytes_per_second: int = Field(
        default=16 * 1024 * 1024, ge=0, description="The background scrub's read rate; 0 = unbounded."
    )

    # Security, as Pulsar's broker.conf names it (authenticationEnabled, tokenSecretKey, ...).
    authentication_enabled: bool = Field(
        default=False, description="Require credentials on every route but /health (and on the wire)."
    )
    authentication_providers: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("token",),
        description="Comma list of token, basic, tls (or Pulsar's AuthenticationProvider* class names).",
    )
    basic_auth_conf: str | None = Field(
        default=None,
        description="The basic provider's htpasswd file: a path, file:///path, data:;base64,... or base64 "
        "(Pulsar's basicAuthConf / pulsar.auth.basic.conf).",
    )
    anonymous_user_role: str | None = Field(
        default=None,
        description="The role of a client that sends no credentials (Pulsar's anonymousUserRole).",
    )
    authorization_enabled: bool = Field(
        default=False, description="Check the role's permissions (needs authentication)."
    )
    superuser_roles: Annotated[frozenset[str], NoDecode] = Field(
        default=frozenset(), description="Roles that may do everything; comma-separated."
    )
    token_secret_key: str | None = Field(
        default=None, description="HS256 key: file:///path or data:;base64,... (Pulsar's tokenSecretKey)."
    )
    token_public_key: str | None = Field(
        default=None, description="RS256/ES256 public key, same forms (Pulsar's tokenPublicKey)."
    )
    token_auth_claim: str = Field(default="sub", min_length=1, description="The claim that holds the role.")
    token_cache_size: int = Field(default=10_000, ge=0, description="Verified tokens kept; 0: verify each.")
    authorization_cache_seconds: float = Field(
        default=5.0, ge=0, description="How stale permissions changed by another instance may be."
    )
    authenticate_metrics_endpoint: bool = False
    allow_unauthenticated: bool = Field(
        default=False, description="Serve without authentication on an address that is not loopback."
    )
    # TLS, as Pulsar's broker.conf names it (tlsCertificateFilePath, brokerServicePortTls, ...).
    tls_cert_file: Path | None = Field(
        default=None, description="The server's certificate chain, PEM (Pulsar's tlsCertificateFilePath)."
    )
    tls_key_file: Path | None = Field(
        default=None, description="The server's private key, PEM (Pulsar's tlsKeyFilePath)."
    )
    broker_service_port_tls: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of Pulsar's binary protocol over TLS (pulsar+ssl://host:port), beside the plain "
        "one; unset: none; 0: any free port (Pulsar's brokerServicePortTls).",
    )
    web_service_port_tls: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of HTTPS beside the plain HTTP port, the same API; unset: none (then the TLS "
        "certificate alone turns the HTTP port into HTTPS); 0: any free port (Pulsar's webServicePortTls).",
    )
    tls_trust_certs_file_path: Path | None = Field(
        default=None,
        description="The CA certificates (PEM) client certificates are checked against; without it no "
        "client certificate is asked for (Pulsar's tlsTrustCertsFilePath).",
    )
    tls_require_trusted_client_cert_on_connect: bool = Field(
        default=False,
        description="Refuse a TLS handshake without a client certificate signed by a trusted CA; when "
        "false one is still asked for and checked if sent (Pulsar's tlsRequireTrustedClientCertOnConnect).",
    )
    # NoDecode: Pulsar's form (TLSv1.3,TLSv1.2), parsed by the validator.
    tls_protocols: Annotated[frozenset[str], NoDecode] = Field(
        default=frozenset(),
        description="TLS versions accepted, comma-separated (TLSv1.2, TLSv1.3); every one Python's "
        "OpenSSL offers from TLSv1.2 up when empty (Pulsar's tlsProtocols).",
    )
    tls_ciphers: Annotated[frozenset[str], NoDecode] = Field(
        default=frozenset(),
        description="Cipher suites of TLSv1.2, comma-separated OpenSSL names (ECDHE-RSA-AES256-GCM-SHA384); "
        "OpenSSL's defaults when empty (Pulsar's tlsCiphers, which takes Java's names).",
    )

    @field_validator("schema_compatibility_strategy", mode="before")
    @classmethod
    def _strategy_upper(cls, v: Any) -> Any:
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("spark_master")
    @classmethod
    def _spark_master(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("spark_master must not be empty (local[*], spark://host:7077, ...)")
        if v.startswith("sc://"):
            # The Arrow path schedules its tasks through SparkContext (RDDs, addPyFile), which
            # a Spark Connect client does not have (README, "Running on a Spark cluster").
            raise ValueError(
                "Spark Connect (sc://) cannot run the compactor's tasks, which need a SparkContext: "
                "use the cluster's master URL (spark://, yarn, k8s://)"
            )
        return v

    @field_validator("spark_python", "spark_archives")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v.strip() or None if v is not None else None

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_conf(cls, v: Any) -> dict[str, str]:
        if v is None or v == "":
            return {}
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("{"):
                try:
                    v = json.loads(text)
                except ValueError as e:
                    raise ValueError(f"spark_conf is not valid JSON: {e}") from None
            else:
                pairs = [p.strip() for p in text.split(",") if p.strip()]
                bad = [p for p in pairs if "=" not in p]
                if bad:
                    raise ValueError(f"spark_conf must be a JSON object or k=v,k=v; {bad[0]!r} has no '='")
                v = dict(p.split("=", 1) for p in pairs)
        if not isinstance(v, dict):
            raise ValueError("spark_conf must be a JSON object or k=v,k=v")
        out: dict[str, str] = {}
        for key, value in v.items():
            key = str(key).strip()
            if not key.startswith("spark."):
                raise ValueError(f"spark_conf takes spark.* settings only, not {key!r}")
            if isinstance(value, dict | list) or value is None:
                raise ValueError(f"spark_conf: {key} must be a string, number or boolean")
            out[key] = str(value).lower() if isinstance(value, bool) else str(value).strip()
        return out

    @field_validator("superuser_roles", "tls_protocols", "tls_ciphers", mode="before")
    @classmethod
    def _comma_separated(cls, v: object) -> object:
        if isinstance(v, str):
            return frozenset(r.strip() for r in v.split(",") if r.strip())
        return v

    @field_validator("authentication_providers", mode="before")
    @classmethod
    def _providers(cls, v: object) -> object:
        from service.authentication import parse_providers

        if isinstance(v, str | list | tuple):
            return parse_providers(v)
        return v

    @field_validator("anonymous_user_role", "basic_auth_conf")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return v.strip() or None if v is not None else None

    @field_validator("advertised_listeners", mode="before")
    @classmethod
    def _listeners(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                return parse_listeners(v)
            except ValueError as e:
                raise ValueError(f"advertised_listeners: {e}") from None
        return v

    @model_validator(mode="after")
    def _internal_listener(self) -> Settings:
        self.internal_listener_name = self.internal_listener_name.strip()
        listeners = self.advertised_listeners
        if not listeners:
            if self.internal_listener_name:
                raise ValueError("internal_listener_name needs advertised_listeners, which is empty")
            return self
        if self.broker_service_port == 0:
            raise ValueError(
                "advertised_listeners name URLs of the binary protocol, which is off (broker_service_port=0)"
            )
        for name, listener in listeners.items():
            if listener.broker_url_tls is not None and self.broker_service_port_tls is None:
                # Pulsar refuses pulsar+ssl:// without brokerServicePortTls (MultipleListenerValidator).
                raise ValueError(
                    f"advertised_listeners: listener {name!r} has a pulsar+ssl:// URL, but the binary "
                    "protocol is not served over TLS (COMPACTOR_BROKER_SERVICE_PORT_TLS is not set)"
                )
        if not self.internal_listener_name:
            self.internal_listener_name = next(iter(listeners))
        elif self.internal_listener_name not in listeners:
            raise ValueError(
                f"internal_listener_name {self.internal_listener_name!r} is not one of advertised_listeners "
                f"({', '.join(listeners)})"
            )
        return self

    @field_validator("storage_url", "s3_endpoint_url", "s3_region", "s3_access_key_id")
    @classmethod
    def _stripped(cls, v: str) -> str:
        return v.strip()

    @model_validator(mode="after")
    def _storage(self) -> Settings:
        if not self.storage_url:
            self.storage_url = str(self.data_dir)
        # Checked here, so that a URL of another kind is refused before anything starts; the
        # bucket itself is probed when the service starts (``check_storage``).
        self.ledger_storage()
        return self

    def ledger_storage(self) -> Storage:
        """The storage of sealed and compacted ledgers (``StorageError`` for a bad URL)."""
        s3 = S3Settings(
            endpoint_url=self.s3_endpoint_url or None,
            region=self.s3_region or None,
            access_key=self.s3_access_key_id or None,
            secret_key=self.s3_secret_access_key.get_secret_value() or None,
        )
        try:
            return open_storage(self.storage_url, s3 if s3 != S3Settings() else None)
        except StorageError as e:
            raise ValueError(str(e)) from None

    def row_group_cache_bytes(self) -> int:
        """What the row-group cache may hold: ``cache_bytes`` if set, else
        :data:`OBJECT_STORAGE_CACHE_BYTES` on object storage and 0 on a local disk."""
        if self.cache_bytes is not None:
            return self.cache_bytes
        return 0 if self.ledger_storage().local else OBJECT_STORAGE_CACHE_BYTES

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'metadata.db'}"
        return self

    @model_validator(mode="after")
    def _advertised(self) -> Settings:
        url = self.advertised_url.strip().rstrip("/")
        if not url:
            host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            # The certificate alone (no port of its own for HTTPS) makes the one port HTTPS.
            https = self.tls_cert_file is not None and self.web_service_port_tls is None
            url = f"{'https' if https else 'http'}://{host}:{self.port}"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
            raise ValueError(f"advertised_url must be http(s)://host:port, not {self.advertised_url!r}")
        self.advertised_url = url
        return self

    @model_validator(mode="after")
    def _security(self) -> Settings:
        if self.authentication_enabled:
            self._check_providers()
        if self.authorization_enabled and not self.authentication_enabled:
            raise ValueError("authorization needs authentication (COMPACTOR_AUTHENTICATION_ENABLED=true)")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both COMPACTOR_TLS_CERT_FILE and COMPACTOR_TLS_KEY_FILE")
        for f in (self.tls_cert_file, self.tls_key_file, self.tls_trust_certs_file_path):
            if f is not None and not f.is_file():
                raise ValueError(f"TLS file {f} does not exist")
        return self

    def _check_providers(self) -> None:
        """Each configured provider has what it needs (read now: a bad key or file stops
        ``serve`` before it starts)."""
        providers = self.authentication_providers
        if not providers:
            raise ValueError("authentication needs at least one of COMPACTOR_AUTHENTICATION_PROVIDERS")
        if "token" in providers:
            if not (self.token_secret_key or self.token_public_key):
                raise ValueError(
                    "authentication needs COMPACTOR_TOKEN_SECRET_KEY or COMPACTOR_TOKEN_PUBLIC_KEY for the "
                    "token provider (or leave token out of COMPACTOR_AUTHENTICATION_PROVIDERS)"
                )
            # Imported here: the JWT and cryptography libraries load only where tokens are used.
            from service.tokens import read_key

            for name in ("token_secret_key", "token_public_key"):
                value = getattr(self, name)
                if value:
                    try:
                        read_key(value)
                    except ValueError as e:
                        raise ValueError(f"{name}: {e}") from None
        if "basic" in providers:
            if self.basic_auth_conf is None:
                raise ValueError("the basic provider needs COMPACTOR_BASIC_AUTH_CONF (an htpasswd file)")
            from service.basic_auth import load

            try:
                load(self.basic_auth_conf, warn=False)  # the service warns once, when it loads the file
            except ValueError as e:
                raise ValueError(f"basic_auth_conf: {e}") from None

    @property
    def open_to_anyone(self) -> bool:
        """Whether a client without credentials may do everything: authentication off, or an
        anonymous role that authorization does not bound (off, or the role a superuser)."""
        if not self.authentication_enabled:
            return True
        role = self.anonymous_user_role
        return role is not None and (not self.authorization_enabled or role in self.superuser_roles)

    @model_validator(mode="after")
    def _tls_ports(self) -> Settings:
        # The contexts the listeners will use, built now: a bad file, protocol or cipher is
        # refused at start, in one line.
        check_tls_settings(self)
        return self

    @property
    def broker_service_url(self) -> str | None:
        """``pulsar://host:port`` of the binary protocol: the internal listener's with advertised
        listeners, else the advertised URL's host and the broker service port (None when the port
        is 0: off)."""
        if self.broker_service_port == 0:
            return None
        if self.advertised_listeners:  # the internal listener's, as Pulsar's broker advertises it
            return self.advertised_listeners[self.internal_listener_name].broker_url
        return f"pulsar://{self._advertised_host()}:{self.broker_service_port}"

    @property
    def broker_service_url_tls(self) -> str | None:
        """``pulsar+ssl://host:port`` of the binary protocol over TLS (the internal listener's
        with advertised listeners), None when it is off. With port 0, the port bound once the
        listener has started (``BrokerListener`` records it in ``broker_service_port_tls``)."""
        if self.broker_service_port_tls is None:
            return None
        if self.advertised_listeners:
            return self.advertised_listeners[self.internal_listener_name].broker_url_tls
        return f"pulsar+ssl://{self._advertised_host()}:{self.broker_service_port_tls}"

    @property
    def web_service_url_tls(self) -> str | None:
        """``https://host:port`` of the REST API: the HTTPS port's, or the one port's when the
        certificate alone makes it HTTPS; None without TLS."""
        if self.web_service_port_tls is not None:
            return f"https://{self._advertised_host()}:{self.web_service_port_tls}"
        return self.advertised_url if self.advertised_url.startswith("https://") else None

    def _advertised_host(self) -> str:
        host = urlsplit(self.advertised_url).hostname or self.host
        return f"[{host}]" if ":" in host else host

    def exposure_refusal(self) -> str | None:
        """Why ``serve`` must not start as configured, or None: without authentication the
        service listens on loopback only, unless the operator says otherwise."""
        if not self.open_to_anyone or self.allow_unauthenticated or _is_loopback(self.host):
            return None
        if self.authentication_enabled:
            return (
                f"refusing to serve on {self.host} with the anonymous role {self.anonymous_user_role!r} "
                "unbounded: a client without credentials could read and delete every topic. Turn "
                "authorization on (COMPACTOR_AUTHORIZATION_ENABLED=true) with an anonymous role that is "
                "not a superuser, unset COMPACTOR_ANONYMOUS_USER_ROLE, listen on 127.0.0.1, or set "
                "COMPACTOR_ALLOW_UNAUTHENTICATED=true if the network itself is trusted."
            )
        return (
            f"refusing to serve on {self.host} without authentication: anyone who reaches the port "
            "could read and delete every topic. Enable authentication "
            "(COMPACTOR_AUTHENTICATION_ENABLED=true with COMPACTOR_TOKEN_SECRET_KEY or "
            "COMPACTOR_TOKEN_PUBLIC_KEY), listen on 127.0.0.1, or set COMPACTOR_ALLOW_UNAUTHENTICATED=true "
            "if the network itself is trusted."
        )

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @model_validator(mode="after")
    def _seal_bounds(self) -> Settings:
        if self.max_pending_seals_per_topic > self.max_pending_seals:
            raise ValueError(
                f"max_pending_seals_per_topic ({self.max_pending_seals_per_topic}) exceeds "
                f"max_pending_seals ({self.max_pending_seals})"
            )
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def several_instances(self) -> bool:
        """Whether topics are owned through leases (any database but SQLite): several
        instances may share the database and the storage root."""
        return not self.is_sqlite


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
