"""deduplication: Pulsar's producer deduplication as a policy of a namespace or a topic

A NULL ``deduplication_enabled`` is "not set here", as every policy column: the topic takes
its namespace's, then the service's ``COMPACTOR_BROKER_DEDUPLICATION_ENABLED``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.add_column(sa.Column("deduplication_enabled", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("policies") as batch:
        batch.drop_column("deduplication_enabled")
