"""Events and kept output carry a write key (issue 31).

A retried journal write after a dropped connection could repeat an insert that did commit (its
acknowledgement was lost with the connection). Rows keyed by their primary key (Runs, allocations,
leases, sandboxes) find their own row on a retry; events and output rows have no key of their own:

- ``events.write_key``, ``run_output.write_key``: chosen once per write before its first attempt
  (NULL for rows written before this revision, and for a few written inside a compare-and-set, which
  a retry never repeats). Not indexed: only a retry looks for one, through ``run_id``'s index.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("events", sa.Column("write_key", sa.String(40), nullable=True))
    op.add_column("run_output", sa.Column("write_key", sa.String(48), nullable=True))


def downgrade() -> None:
    for table in ("run_output", "events"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("write_key")
