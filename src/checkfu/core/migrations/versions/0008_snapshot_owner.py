"""A snapshot being taken is journaled before its provider is asked (issue 29).

- ``sandbox_snapshots.owner``: the process taking the snapshot (``host/pid/start``), written with the row as
  ``pending`` before the provider call. A ``pending`` row whose owner is gone is a snapshot whose command died
  mid-way: the next command's house keeping (and ``checkfu runner reconcile``) compensates its allocation (its
  image, if one was made; its source, if left paused) and settles the row as ``failed``. NULL for rows written
  before this revision, which were only ever written ``present``.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("sandbox_snapshots", sa.Column("owner", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandbox_snapshots") as batch:
        batch.drop_column("owner")
