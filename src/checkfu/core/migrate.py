"""Bringing a journal's schema to the current revision, in place, safely under concurrency.

Every ``Journal`` calls ``upgrade`` when it opens. The common case costs one read: the
journal is already at ``HEAD``. Otherwise exactly one opener migrates while the others
wait for it, then find nothing left to do:

- SQLite: the migration runs inside ``BEGIN IMMEDIATE``, the database's one write lock
  (others wait on the busy timeout); SQLite's DDL is transactional, so a crash
  mid-migration leaves the previous revision whole.
- PostgreSQL: inside one transaction holding ``pg_advisory_xact_lock(LOCK_KEY)``;
  PostgreSQL's DDL is transactional too.

The revisions are Alembic's (``checkfu/core/migrations/versions``). A journal written
before versioned migrations has tables and no ``alembic_version``: revision ``0001``
creates only what is missing, so it is upgraded from where it stands. A journal whose
revision this code does not know (written by a newer checkfu) is refused, never touched.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

HEAD = "0009"
"""The revision this code writes and reads; ``tests/runner/test_runner_migrations.py`` pins it to the scripts."""

LOCK_KEY = 0x636B6675_6A726E6C
"""PostgreSQL advisory lock key held while migrating ("ckfu" "jrnl")."""

MIGRATIONS = Path(__file__).parent / "migrations"


class JournalTooNew(Exception):
    """The journal was migrated by a newer checkfu to a revision this one does not know."""


def current_revision(conn: Connection) -> str | None:
    """The journal's revision, or ``None`` when it has none (empty, or from before versioned migrations)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
    return None if row is None else str(row[0])


def _at_head(conn: Connection) -> bool:
    """Whether the journal is surely at ``HEAD``, in one read (no look at the catalogue first). Any error, a
    journal without ``alembic_version`` included, answers ``False``: the locked path then looks carefully, and
    raises what it meets."""
    try:
        row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
    except sa.exc.DBAPIError:
        return False
    return row is not None and str(row[0]) == HEAD


def upgrade(engine: Engine) -> None:
    """Bring the journal behind ``engine`` to ``HEAD``; a no-op when it is there already.

    Raises:
        JournalTooNew: the journal is at a revision this code does not know.
        sqlalchemy.exc.SQLAlchemyError: the database refused (locked past the busy timeout, say).
    """
    with engine.connect() as conn:
        if _at_head(conn):
            return
    with engine.connect() as conn:
        _lock(conn)
        _migrate(conn)
        conn.commit()


def _lock(conn: Connection) -> None:
    """Begin the migrating transaction, holding the lock that makes every other migrator wait."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    elif conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})


def _migrate(conn: Connection) -> None:
    # Alembic is imported here only: a journal at HEAD (every open but the first) never loads it.
    from alembic.config import Config  # noqa: PLC0415
    from alembic.runtime.environment import EnvironmentContext  # noqa: PLC0415
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    script = ScriptDirectory.from_config(config)
    found = current_revision(conn)
    if found == HEAD:
        return  # another opener migrated while this one waited for the lock
    known = {s.revision for s in script.walk_revisions()}
    if found is not None and found not in known:
        raise JournalTooNew(
            f"the journal is at schema revision {found!r}, which this checkfu does not know (it knows up to {HEAD}): "
            "a newer checkfu migrated it; use that one"
        )

    def steps(rev: object, _context: object) -> list[object]:
        return list(script._upgrade_revs(HEAD, rev))  # type: ignore[arg-type]

    with EnvironmentContext(config, script, fn=steps, destination_rev=HEAD) as env:
        env.configure(connection=conn)  # the connection is already in the locked transaction: alembic joins it
        env.run_migrations()
