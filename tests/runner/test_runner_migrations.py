"""The journal's schema is versioned: opening upgrades it in place, once, whoever opens it first.

Every test taking ``journal_url`` runs on an SQLite file and on a database in the throwaway
PostgreSQL cluster. The legacy journals (``data/journal-1129d89.*.sql``) were written by the
journal code of commit 1129d89, the last before versioned migrations
(``data/make_legacy_journals.py`` made them).
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.core import migrate
from checkfu.core.journal import Journal, metadata
from checkfu.core.migrate import HEAD, JournalTooNew, current_revision

DATA = Path(__file__).parent / "data"
LEGACY = "1129d89"


def _schema(engine: sa.Engine) -> dict[str, Any]:
    """Tables, their columns (name, nullability, type family) and their indexes, as the database reports them."""
    inspector = sa.inspect(engine)
    out: dict[str, Any] = {}
    for name in sorted(inspector.get_table_names()):
        if name == "alembic_version":
            continue
        columns = {c["name"]: (c["nullable"], c["type"]._type_affinity.__name__) for c in inspector.get_columns(name)}
        indexes = sorted((i["name"], tuple(i["column_names"])) for i in inspector.get_indexes(name))
        pk = tuple(inspector.get_pk_constraint(name)["constrained_columns"])
        out[name] = {"columns": columns, "indexes": indexes, "pk": pk}
    return out


def _expected() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, table in sorted(metadata.tables.items()):
        columns = {c.name: (c.nullable, c.type._type_affinity.__name__) for c in table.columns}  # type: ignore[union-attr]
        indexes = sorted((i.name, tuple(c.name for c in i.columns)) for i in table.indexes)
        out[name] = {"columns": columns, "indexes": indexes, "pk": tuple(c.name for c in table.primary_key.columns)}
    return out


def _load_legacy(url: str, tmp_path: Path) -> None:
    """Write the legacy journal (schema and rows as commit 1129d89 left them) at ``url``."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.split("///", 1)[1]) as conn:
            conn.executescript((DATA / f"journal-{LEGACY}.sqlite.sql").read_text())
        return
    engine = sa.create_engine(url)
    try:
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute((DATA / f"journal-{LEGACY}.postgresql.sql").read_text())
            raw.commit()
        finally:
            raw.close()
    finally:
        engine.dispose()


def _revision(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return current_revision(conn)
    finally:
        engine.dispose()


def test_a_fresh_journal_is_created_at_head_with_the_tables_of_the_code(journal_url: str) -> None:
    Journal(journal_url).close()
    assert _revision(journal_url) == HEAD
    engine = sa.create_engine(journal_url)
    try:
        assert _schema(engine) == _expected()
    finally:
        engine.dispose()


def test_head_is_the_newest_revision_script() -> None:
    config = Config()
    config.set_main_option("script_location", str(migrate.MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD]


def test_a_journal_written_before_versioned_migrations_is_upgraded_in_place(journal_url: str, tmp_path: Path) -> None:
    _load_legacy(journal_url, tmp_path)
    assert _revision(journal_url) is None
    journal = Journal(journal_url)
    try:
        assert _revision(journal_url) == HEAD
        done = journal.run("run-legacy-done")
        assert done is not None
        assert (done.status, done.exit_code, done.command) == ("succeeded", 0, ["echo", "[/] done"])
        assert done.summary == {"phases": {"process": 0.5}}
        (open_row,) = journal.open_allocations(run_id="run-legacy-open")
        assert (open_row.allocation_key, open_row.state, open_row.lease_id) == (
            "alloc-legacy-2",
            "live",
            "lease-legacy-open",
        )
        assert [e.member for e in journal.events_for_run("run-legacy-done")] == ["provision"]
        assert len(journal.enrollments()) == 1
        with journal.tx() as c:
            attempt = c.execute(sa.text("SELECT attempt FROM runs WHERE run_id = 'run-legacy-open'")).scalar_one()
        assert attempt == 0  # the new column's default reached the old rows
        # and the upgraded journal takes new writes like any other
        journal.start_run("run-new", runner_tag="t", target=done.target, now=3000.0)
        journal.finish_run("run-new", status="succeeded", now=3001.0, exit_code=0)
        new_id = journal.events_for_run("run-legacy-done")  # the old event ids are kept
        assert len(new_id) == 1
        journal.record_event("run-new", "provision", started_at=3000.5, duration_ms=1.0, outcome="ok")
    finally:
        journal.close()
    engine = sa.create_engine(journal_url)
    try:
        assert _schema(engine) == _expected()
    finally:
        engine.dispose()
    Journal(journal_url).close()  # a second open finds nothing to do
    assert _revision(journal_url) == HEAD


def test_a_journal_cut_short_while_being_created_is_completed(tmp_path: Path) -> None:
    """Before versioned migrations, SQLite created the tables one statement at a time: a crash could leave some."""
    path = tmp_path / "journal.sqlite"
    full = (DATA / f"journal-{LEGACY}.sqlite.sql").read_text()
    runs_only = full.split("CREATE TABLE runs", 1)[1].split(");", 1)[0]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs" + runs_only + ")")
    journal = Journal(f"sqlite+pysqlite:///{path}")
    journal.close()
    engine = sa.create_engine(f"sqlite+pysqlite:///{path}")
    try:
        assert _schema(engine) == _expected()
    finally:
        engine.dispose()


def test_a_journal_from_a_newer_checkfu_is_refused_and_left_alone(journal_url: str, tmp_path: Path) -> None:
    Journal(journal_url).close()
    engine = sa.create_engine(journal_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
        with pytest.raises(JournalTooNew, match="9999"):
            Journal(journal_url)
        result = CliRunner().invoke(app, ["runs", "list", "--db", journal_url])
        assert result.exit_code == 2
        assert "--db" in result.output and "9999" in result.output
        with engine.connect() as conn:
            assert current_revision(conn) == "9999"
    finally:
        engine.dispose()


# Issue 16, defect 8: 40 simultaneous first opens of a fresh journal ----------------------------

OPENERS = 40


def _open_at_once(url: str, barrier: Any, failures: Any, index: int) -> None:
    try:
        barrier.wait(timeout=60)
        journal = Journal(url)
        try:
            journal.record_event(f"run-{index}", "describe", started_at=0.0, duration_ms=0.0, outcome="ok")
        finally:
            journal.close()
    except BaseException:
        failures.put(f"opener {index}: {traceback.format_exc(limit=3)}")
        raise SystemExit(1) from None


def test_forty_simultaneous_first_opens_of_a_fresh_journal_all_succeed(journal_url: str) -> None:
    """Each of 40 processes opens the same fresh journal at once; before versioned migrations 3 to 5 of them
    failed with ``table runs already exists``."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(OPENERS)
    failures = ctx.Queue()
    procs = [ctx.Process(target=_open_at_once, args=(journal_url, barrier, failures, i)) for i in range(OPENERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    seen = []
    while not failures.empty():
        seen.append(failures.get())
    assert seen == [], "\n".join(seen)
    assert [p.exitcode for p in procs] == [0] * OPENERS
    assert _revision(journal_url) == HEAD
    journal = Journal(journal_url)
    try:
        with journal.tx() as c:
            assert c.execute(sa.text("SELECT count(*) FROM events")).scalar_one() == OPENERS
    finally:
        journal.close()
