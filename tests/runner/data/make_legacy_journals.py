"""Write the journals of ``journal-1129d89.*.sql``: as checkfu wrote them before versioned migrations.

Run from the repository root: ``.venv/bin/python tests/runner/data/make_legacy_journals.py``. It loads
``src/checkfu/core/journal.py`` *as it was at commit 1129d89* (``git show``), writes one journal
with that code on SQLite and one on a throwaway PostgreSQL 15 cluster, fills both through that
code's own methods (a finished Run, a Run left running with an open allocation under a live lease,
its events, an enrollment), and dumps them as SQL (``sqlite3`` ``iterdump``; ``pg_dump --inserts``).
``tests/runner/test_runner_migrations.py`` loads the dumps and upgrades them in place.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

from checkfu.contract.target import ExecutionTarget

COMMIT = "1129d89"
HERE = Path(__file__).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def legacy_journal_module() -> types.ModuleType:
    source = subprocess.run(
        ["git", "show", f"{COMMIT}:src/checkfu/core/journal.py"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("legacy_journal")
    module.__dict__["__name__"] = "legacy_journal"
    sys.modules["legacy_journal"] = module
    exec(compile(source, f"journal.py@{COMMIT}", "exec"), module.__dict__)
    return module


def fill(legacy: types.ModuleType, j: Any) -> None:
    """A finished Run with its event; a Run left running with a live allocation under a live lease; an enrollment."""
    target = ExecutionTarget(
        provider="memory", provider_revision="memory 1", materialization_revision="memory-images 1", placement="test"
    )
    j.start_run(
        "run-legacy-done",
        runner_tag="runner-legacy",
        target=target,
        now=1000.0,
        profile_digest="sha256:" + "a" * 64,
        command=["echo", "[/] done"],
    )
    j.record_event(
        "run-legacy-done",
        "provision",
        started_at=1000.5,
        duration_ms=1.5,
        outcome="ok",
        allocation_key="alloc-legacy-1",
    )
    j.finish_run("run-legacy-done", status="succeeded", now=1001.0, exit_code=0, summary={"phases": {"process": 0.5}})
    j.start_run("run-legacy-open", runner_tag="runner-legacy", target=target, now=2000.0, command=["sleep", "60"])
    with j.tx() as c:
        c.execute(
            legacy.leases.insert().values(
                lease_id="lease-legacy-open",
                run_id="run-legacy-open",
                owner="elsewhere/1/1",
                epoch=1,
                expires_at=2600.0,
                ended=False,
            )
        )
    j.journal_allocation(
        "alloc-legacy-2",
        run_id="run-legacy-open",
        kind="instance",
        target=target,
        runner_tag="runner-legacy",
        lease_id="lease-legacy-open",
        now=2000.5,
    )
    j.set_allocation("alloc-legacy-2", "live", now=2001.0, object_id="mem-1")
    j.record_enrollment(
        target,
        source="entry point memory",
        kind="in_tree",
        envelope_digest="sha256:" + "b" * 64,
        envelope="{}",
        ceiling="{}",
        now=500.0,
    )


def sqlite_dump(legacy: types.ModuleType) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite"
        journal = legacy.Journal(legacy.sqlite_url(path))
        fill(legacy, journal)
        journal.close()
        with sqlite3.connect(path) as conn:
            return "\n".join(conn.iterdump()) + "\n"


def postgres_dump(legacy: types.ModuleType) -> str:
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="checkfu-legacy-pg-"))
    if os.geteuid() == 0:
        subprocess.run(["chown", "postgres:postgres", str(root)], check=True)
    data, sock = root / "data", root / "sock"
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    subprocess.run(
        [*as_pg, str(PG_BIN / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*as_pg, "mkdir", str(sock)], check=True)
    port = "54399"
    subprocess.run(
        [
            *as_pg,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-w",
            "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        journal = legacy.Journal(f"postgresql+psycopg://{user}@127.0.0.1:{port}/postgres")
        fill(legacy, journal)
        journal.close()
        dump = subprocess.run(
            [
                str(PG_BIN / "pg_dump"),
                "-h",
                "127.0.0.1",
                "-p",
                port,
                "-U",
                user,
                "--no-owner",
                "--no-privileges",
                "--inserts",
                "postgres",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        # pg_dump's psql meta-commands (\\restrict) are not SQL: the test loads the dump through psycopg.
        return "".join(line for line in dump.splitlines(keepends=True) if not line.startswith("\\"))
    finally:
        subprocess.run(
            [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    legacy = legacy_journal_module()
    (HERE / f"journal-{COMMIT}.sqlite.sql").write_text(sqlite_dump(legacy))
    (HERE / f"journal-{COMMIT}.postgresql.sql").write_text(postgres_dump(legacy))


if __name__ == "__main__":
    main()
