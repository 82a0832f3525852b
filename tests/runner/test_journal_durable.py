"""An allocation's record is on disk before its provider is asked for it, on a SQLite file's journal too.

The journal writes ahead to SQLite's log with ``synchronous=NORMAL``: a commit survives its process dying, not
the machine losing power. An allocation's record is the one a provider acts on next (a created container outlives
a loss of power), so ``journal_allocation`` commits with the log synced (``synchronous=FULL``). Observed both ways:
the setting on the connection while the record is written, and the sync calls SQLite makes, seen by ``strace``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checkfu.core.journal import Journal, sqlite_url
from checkfu.testing import memory_envelope

TARGET = memory_envelope().target
COMMON: dict[str, Any] = {"run_id": "run-1", "target": TARGET, "runner_tag": "tag", "lease_id": "lease-1"}
SYNCHRONOUS = {1: "NORMAL", 2: "FULL"}


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    try:
        yield j
    finally:
        j.close()


def test_an_allocations_record_is_committed_synced_and_nothing_else_is(journal: Journal) -> None:
    seen: list[tuple[str, str]] = []

    @sa.event.listens_for(journal.engine, "before_cursor_execute")
    def _setting(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO"):
            table = statement.split()[2]
            (value,) = conn.connection.driver_connection.execute("PRAGMA synchronous").fetchone()
            seen.append((table, SYNCHRONOUS.get(value, str(value))))

    journal.record_event("run-1", "provision", started_at=1.0, duration_ms=1.0, outcome="ok")
    journal.journal_allocation("ak-1", kind="instance", now=1.0, **COMMON)
    journal.record_event("run-1", "provision", started_at=2.0, duration_ms=1.0, outcome="ok")
    assert seen == [("events", "NORMAL"), ("allocations", "FULL"), ("events", "NORMAL")]
    with journal.engine.connect() as conn:  # the connection went back to the pool as it came
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1


def test_a_failed_allocation_record_leaves_the_connection_as_it_was(journal: Journal) -> None:
    journal.journal_allocation("ak-1", kind="instance", now=1.0, **COMMON)
    with pytest.raises(Exception, match="UNIQUE"):
        journal.journal_allocation("ak-1", kind="instance", now=2.0, **COMMON)
    with journal.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1


SCRIPT = """
import os, sys
from checkfu.core.journal import Journal, sqlite_url
from checkfu.testing import memory_envelope
journal = Journal(sqlite_url(sys.argv[1]))
common = dict(run_id="run-1", target=memory_envelope().target, runner_tag="tag", lease_id="lease-1")
os.write(1, b"<event>")
journal.record_event("run-1", "provision", started_at=1.0, duration_ms=1.0, outcome="ok")
os.write(1, b"<allocation>")
journal.journal_allocation("ak-1", kind="instance", now=1.0, **common)
os.write(1, b"<done>")
os._exit(0)  # no close: its checkpoint would sync as well
"""


def _strace_refused() -> str | None:
    """Why ``strace`` cannot watch a process here, or None when it can."""
    if shutil.which("strace") is None:
        return "strace is not installed (scripts/setup installs it)"
    done = subprocess.run(["strace", "-o", "/dev/null", "true"], capture_output=True, timeout=60, check=False)
    return None if done.returncode == 0 else f"strace cannot trace here: {done.stderr.decode()[-200:]}"


def test_sqlite_syncs_its_log_for_an_allocation_and_not_for_an_event(tmp_path: Path) -> None:
    refused = _strace_refused()
    if refused is not None:
        pytest.skip(refused)
    trace = tmp_path / "trace"
    watched = "trace=fsync,fdatasync,write"
    done = subprocess.run(
        [
            "strace",
            "-f",
            "-o",
            str(trace),
            "-e",
            watched,
            sys.executable,
            "-c",
            SCRIPT,
            str(tmp_path / "journal.sqlite"),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    calls = trace.read_text()
    during = {
        what: re.findall(r"\b(fsync|fdatasync)\(", part)
        for what, part in zip(("event", "allocation"), re.split(r'write\(1, "<[a-z]+>"', calls)[1:3], strict=True)
    }
    assert during["event"] == [], "an event is written to the log without waiting for the disk"
    assert during["allocation"], "an allocation's record is synced to disk before it returns"
