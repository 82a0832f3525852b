"""Snapshots that expire: ``allocations.expires_at``.

- ``allocations``: ``expires_at`` (seconds since the epoch; NULL: kept until deleted), written when a
  snapshot's row settles with the expiry its provider stated; and an index over ``(kind, state,
  expires_at)``, so the sweep every journal-opening command makes (``checkfu.core.expiry``) is one
  indexed read when nothing has expired.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("allocations", sa.Column("expires_at", sa.Float, nullable=True))
    op.create_index("ix_allocations_expiry", "allocations", ["kind", "state", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_allocations_expiry", "allocations")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("expires_at")
