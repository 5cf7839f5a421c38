"""broker urls: where each instance serves Pulsar's binary protocol

Each instance records its ``pulsar://host:port`` beside its advertised URL, so that a lookup
over the binary protocol answers with the owner's broker URL (null: the instance does not
listen for the protocol, or started before this revision).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("broker_url", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("broker_url")
