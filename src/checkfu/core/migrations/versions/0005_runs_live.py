"""A Run started in place knows its owner and its story (issue 11).

- ``runs.owner``: the process that started the Run, as a lease owner is written
  (``host/pid/start``: the pid's start time, so a reused pid is never taken for the owner);
  NULL for a Run of the fleet (its lease and heartbeat say who holds it) and for Runs
  journaled before this revision.
- ``runs.owner_boot``: the kernel's boot id when the owner started (a reboot ends every owner).
- ``runs.story``: what ``checkfu runs show --html`` tells besides the events: the adapter and its
  grade, the nine axes and who enforces each, every staged file with its digest (JSON).

Finding orphans reads ``runs`` by ``status`` through ``ix_runs_status_created_at``: no new index.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("owner", sa.String(256), nullable=True))
    op.add_column("runs", sa.Column("owner_boot", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("story", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for column in ("story", "owner_boot", "owner"):
            batch.drop_column(column)
