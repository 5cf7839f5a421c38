"""Service configuration: one pydantic-settings class read from ``COMPACTOR_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

FsyncPolicy = Literal["always", "interval", "never"]


class Settings(BaseSettings):
    """Everything an operator can set. Defaults give a single-process service with embedded
    storage: SQLite and ledger files under ``./data``, Spark in ``local[*]`` mode."""

    model_config = SettingsConfigDict(env_prefix="COMPACTOR_", extra="ignore")

    data_dir: Path = Field(default=Path("./data"), description="Storage root for ledger files.")
    database_url: str = Field(
        default="", description="SQLAlchemy URL of the metadata store; SQLite under data_dir when empty."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)

    fsync: FsyncPolicy = "always"
    fsync_interval_ms: int = Field(default=100, ge=1)

    max_entries_per_ledger: int = Field(default=50_000, ge=1, le=2**32 - 1)
    max_ledger_size_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    max_ledger_age_ms: int = Field(default=4 * 60 * 60 * 1000, ge=1)

    max_message_size: int = Field(default=5 * 1024 * 1024, ge=1)
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

    spark_master: str = "local[*]"
    spark_driver_memory: str = "2g"
    spark_ui: bool = False
    spark_shuffle_partitions: int | None = Field(default=None, ge=1)
    spark_warmup: bool = Field(
        default=True,
        description="Start Spark, and run a throw-away compaction round, in the background at start-up.",
    )

    compaction_monitor_interval_seconds: float = Field(default=60.0, gt=0)
    compaction_workers: int = Field(default=1, ge=1)
    compaction_threshold: int = Field(default=0, ge=0, description="Service-wide default, bytes; 0 = off.")
    retain_null_key: bool = False

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'metadata.db'}"
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
