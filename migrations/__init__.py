"""Alembic environment and revisions: the only place the metadata schema is created.

The top layer (``compactor serve``, ``compactor db upgrade``, the app at start-up) applies them
with ``upgrade``; the service below never imports this package.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent

__all__ = ["MIGRATIONS_DIR", "alembic_config", "upgrade"]


def alembic_config(url: str) -> Config:
    """Alembic's configuration for the database at ``url``, with this package's revisions."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.set_main_option(
        "file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(hour).2d%%(minute).2d-%%(rev)s_%%(slug)s"
    )
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Apply pending migrations to the database at ``url`` (a SQLite file's folder is made
    first); the schema is created only this way."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), revision)
