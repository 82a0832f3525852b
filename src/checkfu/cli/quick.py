"""``checkfu ps`` on a journal that holds nothing to show or to do, answered from the standard library alone.

Scripts and CI call ``checkfu ps`` in a process of its own, with no start-up server, and most often there is
nothing live. Loading the command tree, SQLAlchemy and the contract's models to find that out costs about half a
second; reading the journal with ``sqlite3`` costs a few milliseconds. So when ``checkfu ps`` (with ``--json``
and ``--db`` at most) names an SQLite journal at the current schema that has no sandbox provisioning or live, no
Run running, no snapshot kept or being taken (one cut short is undone by the full command's house keeping) and no
snapshot past its expiry, it prints what the full command would print for that journal (an empty listing) and exits.
In every other case (another option, another database, a journal that needs migrating or cannot be read, a state
directory the full command would refuse or repair, anything at all to show or reclaim) it answers ``None`` and the
full command runs as ever. It never writes.
"""

from __future__ import annotations

import os
import stat
import sys
import time

HEAD = "0009"
"""The journal schema this code writes (``checkfu.core.migrate.HEAD``; a test keeps the two equal)."""

EMPTY_JSON = '{"ok": true, "sandboxes": [], "runs": [], "snapshots": []}'
EMPTY_TABLE = "ID  KIND  STATE  OWNER  AGE  TIME LEFT  PROVIDER  PORTS"
"""What ``checkfu ps`` prints for a journal with nothing to list (a test holds both equal to the full command's)."""

_NOTHING_TO_SHOW = (
    "SELECT EXISTS(SELECT 1 FROM sandboxes WHERE state IN ('provisioning', 'live')),"
    " EXISTS(SELECT 1 FROM runs WHERE status = 'running'),"
    " EXISTS(SELECT 1 FROM sandbox_snapshots WHERE state IN ('present', 'pending')),"
    " EXISTS(SELECT 1 FROM allocations WHERE kind = 'snapshot' AND state = 'live' AND expires_at <= ?),"
    " (SELECT version_num FROM alembic_version)"
)


def ps(argv: list[str]) -> bool:
    """Answer ``checkfu ps`` from ``argv`` (the arguments after the program name) when the journal is empty of all
    it would list or reclaim; ``False`` (nothing printed) when the full command must run."""
    parsed = _parse(argv)
    if parsed is None:
        return False
    as_json, path = parsed
    if path is None or not _nothing_in(path):
        return False
    print(EMPTY_JSON if as_json else EMPTY_TABLE)
    return True


def _parse(argv: list[str]) -> tuple[bool, str | None] | None:
    """``(--json given, the journal's file)`` for ``ps [--json] [--db URL]``; ``None`` for anything else."""
    if not argv or argv[0] != "ps":
        return None
    as_json, db, rest = False, None, argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg == "--json" and not as_json:
            as_json = True
        elif arg == "--db" and db is None and rest:
            db = rest.pop(0)
        elif arg.startswith("--db=") and db is None:
            db = arg.removeprefix("--db=")
        else:
            return None
    return as_json, _journal_file(db)


def _journal_file(db: str | None) -> str | None:
    """The SQLite file of ``--db`` (``sqlite:///PATH`` or ``sqlite+pysqlite:///PATH``), or of the default journal
    in a state directory the full command would take as it is; ``None`` when only the full command can tell."""
    if db is not None:
        for scheme in ("sqlite:///", "sqlite+pysqlite:///"):
            if db.startswith(scheme):
                path = db.removeprefix(scheme)
                return path if path and "?" not in path and path != ":memory:" else None
        return None
    raw = os.environ.get("CHECKFU_JOURNAL_DEADLINE")
    if raw is not None:  # the full command checks it and refuses one that is not a number
        return None
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    state = os.path.join(base, "checkfu")
    try:
        st = os.lstat(state)
    except OSError:
        return None  # the full command makes it (or says why it cannot)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None  # the full command refuses it, or closes it to other users first
    return os.path.join(state, "journal.sqlite")


def _nothing_in(path: str) -> bool:
    """Whether the SQLite journal at ``path`` exists at the current schema with nothing ``ps`` lists or reclaims."""
    if not os.path.isfile(path):
        return False  # the full command makes it
    import sqlite3  # noqa: PLC0415 - only on this path

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute(_NOTHING_TO_SHOW, (time.time(),)).fetchone()
    except sqlite3.Error:  # locked, or an older schema without these tables: the full command deals with it
        return False
    finally:
        conn.close()
    return row is not None and row[4] == HEAD and not any(row[:4])


def main(argv: list[str]) -> None:
    """Exit after answering, if this path can answer."""
    if ps(argv):
        sys.stdout.flush()
        sys.exit(0)
