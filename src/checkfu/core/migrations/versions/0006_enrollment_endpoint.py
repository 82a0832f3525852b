"""An enrollment is keyed by its target and its endpoint (issue 30).

Two providers may advertise the same target: ``checkfu provider serve docker`` and the in-tree
Docker tier it serves, say. Keyed by the target alone, enrolling one replaced the other. Now:

- ``enrollments.endpoint``: the provider service's URL in its one spelling
  (``checkfu.core.registry.endpoint``), or ``''`` for a provider loaded in the runner's own
  process; the primary key is ``(target, endpoint)``.

A row enrolled from a URL before this revision gets that URL's endpoint; every other row gets
``''``. The table is made anew and the rows copied (one way for SQLite and PostgreSQL alike).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_COLUMNS = (
    "target",
    "provider",
    "source",
    "kind",
    "envelope_digest",
    "envelope",
    "ceiling",
    "evidence",
    "credential_path",
    "credential_fingerprint",
    "enrolled_at",
)


def _create(name: str, *, keyed_by_endpoint: bool) -> None:
    key = ["target", "endpoint"] if keyed_by_endpoint else ["target"]
    columns = [
        sa.Column("target", sa.Text, nullable=False),
        *([sa.Column("endpoint", sa.String(256), nullable=False, server_default="")] if keyed_by_endpoint else []),
        sa.Column("provider", sa.String(256), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("envelope_digest", sa.String(80), nullable=False),
        sa.Column("envelope", sa.Text, nullable=False),
        sa.Column("ceiling", sa.Text, nullable=False),
        sa.Column("evidence", sa.Text, nullable=True),
        sa.Column("credential_path", sa.Text, nullable=True),
        sa.Column("credential_fingerprint", sa.String(80), nullable=True),
        sa.Column("enrolled_at", sa.Float, nullable=False),
    ]
    # The key's name is the table's final one (PostgreSQL keeps a constraint's name through a rename).
    pk = "pk_enrollments" if keyed_by_endpoint else "enrollments_pkey"
    op.create_table(name, *columns, sa.PrimaryKeyConstraint(*key, name=pk))


def _endpoint_of(source: str) -> str:
    from checkfu.contract.errors import SandboxError  # noqa: PLC0415
    from checkfu.core.registry import endpoint, is_endpoint  # noqa: PLC0415

    if not is_endpoint(source):
        return ""
    try:
        return endpoint(source)
    except SandboxError:
        return source[:256]


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text(f"SELECT {', '.join(_COLUMNS)} FROM enrollments")).mappings().all()
    _create("enrollments_next", keyed_by_endpoint=True)
    table = sa.table("enrollments_next", *(sa.column(c) for c in (*_COLUMNS, "endpoint")))
    for row in rows:
        bind.execute(table.insert().values(**dict(row), endpoint=_endpoint_of(row["source"])))
    op.drop_index("ix_enrollments_provider", table_name="enrollments")
    op.drop_table("enrollments")
    op.rename_table("enrollments_next", "enrollments")
    op.create_index("ix_enrollments_provider", "enrollments", ["provider"])


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text(f"SELECT {', '.join(_COLUMNS)} FROM enrollments ORDER BY endpoint")).mappings().all()
    _create("enrollments_prev", keyed_by_endpoint=False)
    table = sa.table("enrollments_prev", *(sa.column(c) for c in _COLUMNS))
    seen: set[str] = set()
    for row in rows:  # the in-process enrollment ('' sorts first) wins where a target was enrolled twice
        if row["target"] not in seen:
            seen.add(row["target"])
            bind.execute(table.insert().values(**dict(row)))
    op.drop_index("ix_enrollments_provider", table_name="enrollments")
    op.drop_table("enrollments")
    op.rename_table("enrollments_prev", "enrollments")
    op.create_index("ix_enrollments_provider", "enrollments", ["provider"])
