"""``runs.status`` holds every status the runner writes.

``refused:<code>`` is up to 36 characters (``refused:SandboxCapabilityUnavailable``), and the column was
``VARCHAR(32)``. SQLite does not enforce a length, so only PostgreSQL refused the write: a fleet on PostgreSQL could
not settle a Run refused as ``SandboxAdapterUnavailable`` or ``SandboxCapabilityUnavailable`` and left it
``running``. The column becomes ``VARCHAR(64)``; on SQLite, whose columns take any length, nothing is rewritten.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # the declared length is not enforced there, and a table rebuild would buy nothing
    op.alter_column("runs", "status", type_=sa.String(64), existing_type=sa.String(32), existing_nullable=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column("runs", "status", type_=sa.String(32), existing_type=sa.String(64), existing_nullable=False)
