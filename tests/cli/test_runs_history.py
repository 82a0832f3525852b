"""``checkfu runs list`` and ``checkfu runs show``: the history of Runs, from the journal, on SQLite and PostgreSQL.

The Docker cases run ``checkfu run`` on the engine first (skipped without one unless
``CHECKFU_REQUIRE_DOCKER=1``); the memory case needs nothing. The PostgreSQL case
starts a throwaway cluster of its own (``initdb`` into a fresh directory, a free
loopback port, ``pg_ctl stop -m immediate`` at the end).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkfu.core.journal import Journal
from checkfu.testing.memory import BASE_IMAGE as MEMORY_IMAGE

from .test_run_cli import Cli, isolated_cli, profile_file, run_id_of
from .test_run_docker import BUSYBOX, connect, docker_cli

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with isolated_cli(tmp_path) as c:
        yield c


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


@pytest.fixture
def dcli(tmp_path: Path, engine: Any) -> Iterator[Cli]:
    with docker_cli(tmp_path, engine) as c:
        yield c


def check_events(shown: dict[str, Any], members: list[str]) -> None:
    """Every member call is journaled in order, with a duration and an outcome, on the Run's one instance.

    Selection is ``ok``, or ``warning`` exactly when the adapter does not enforce every axis.
    """
    events = shown["events"]
    called = [e["member"] for e in events]
    positions = [called.index(m) for m in members]
    assert positions == sorted(positions), called
    for e in events:
        assert isinstance(e["duration_ms"], float) and e["duration_ms"] >= 0, e
        loud = e["member"] == "select" and bool(shown["summary"]["not_enforced"])
        assert e["outcome"] == ("warning" if loud else "ok"), e
        assert e["error_code"] is None, e
    [alloc] = shown["allocations"]
    assert alloc["kind"] == "instance" and alloc["state"] == "released", alloc
    on_instance = [e for e in events if e["member"] not in ("select", "materialize")]
    assert {e["allocation_key"] for e in on_instance} == {alloc["allocation_key"]}, events


@pytest.mark.docker
def test_history_shows_each_run_and_each_member_call(dcli: Cli, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "one").write_bytes(b"1")
    (data / "two").write_bytes(b"22")
    ok = dcli(
        "run", "--profile", BUSYBOX, "--mount", f"{data}:/data", "--capture", "/data",
        "--capture-dir", str(tmp_path / "captured"), "--", "cat", "/data/one",
    )  # fmt: skip
    assert ok.code == 0, str(ok)
    failed = dcli("run", "--profile", BUSYBOX, "--", "sh", "-c", "exit 3")
    assert failed.code == 3, str(failed)
    ok_id, failed_id = run_id_of(ok), run_id_of(failed)

    listed = dcli.json("runs", "list")
    assert [r["run_id"] for r in listed] == [failed_id, ok_id]  # newest first
    by_id = {r["run_id"]: r for r in listed}
    assert (by_id[ok_id]["status"], by_id[ok_id]["exit_code"]) == ("succeeded", 0)
    assert (by_id[failed_id]["status"], by_id[failed_id]["exit_code"]) == ("command_failed", 3)
    assert by_id[failed_id]["command"] == ["sh", "-c", "exit 3"]
    assert all(r["adapter"].startswith("docker@") and r["finished_at"] >= r["created_at"] for r in listed)

    shown = dcli.json("runs", "show", ok_id[:16])
    assert shown["run_id"] == ok_id and shown["status"] == "succeeded" and shown["exit_code"] == 0
    assert shown["profile_digest"].startswith("sha256:")
    members = ["select", "materialize", "provision", "writeFile", "activate", "openProcess", "listDir", "readFiles"]
    check_events(shown, [*members, "release"])
    assert [e["member"] for e in shown["events"]].count("writeFile") == 2  # one per staged file
    assert set(shown["summary"]["phases"]) >= {"materialize", "provision", "stage", "activate", "process", "release"}

    shown_failed = dcli.json("runs", "show", failed_id)
    assert (shown_failed["status"], shown_failed["exit_code"]) == ("command_failed", 3)
    check_events(shown_failed, ["select", "materialize", "provision", "activate", "openProcess", "release"])

    # The human forms: the id as `runs list` shows it (perhaps cut short) is enough for `runs show`.
    table = dcli("runs", "list")
    assert table.code == 0, str(table)
    rows = [ln for ln in table.out.decode().splitlines() if "run-" in ln]
    assert len(rows) == 2, table.out.decode()
    visible = rows[0].split("│")[1].strip().rstrip("…")
    assert failed_id.startswith(visible) and len(visible) >= 12, rows[0]
    human = dcli("runs", "show", visible)
    assert human.code == 0, str(human)
    text = human.out.decode()
    for word in (failed_id, "command_failed", "openProcess", "release", "instance released"):
        assert word in text, text


def test_history_of_a_memory_run(cli: Cli, tmp_path: Path) -> None:
    prof = profile_file(tmp_path, base_image=MEMORY_IMAGE)
    done = cli("run", "--profile", str(prof), "--provider", "memory", "--", "echo", "hi")
    assert done.code == 0, str(done)
    [listed] = cli.json("runs", "list")
    assert listed["status"] == "succeeded" and listed["adapter"].startswith("memory@")
    shown = cli.json("runs", "show", listed["run_id"])
    check_events(shown, ["select", "materialize", "provision", "activate", "openProcess", "release"])
    assert shown["summary"]["not_enforced"]  # the memory provider enforces nothing, and the journal keeps that


def test_an_unknown_or_ambiguous_run_is_a_clear_refusal(cli: Cli, tmp_path: Path) -> None:
    unknown = cli("runs", "show", "run-nope")
    assert unknown.code == 1, str(unknown)
    assert "SandboxNotFound" in unknown.said and "no runs match 'run-nope'" in unknown.said
    prof = profile_file(tmp_path, base_image=MEMORY_IMAGE)
    for _ in range(2):
        assert cli("run", "--profile", str(prof), "--provider", "memory", "--", "true").code == 0
    ambiguous = cli("runs", "show", "run-", "--json")
    assert ambiguous.code == 1, str(ambiguous)
    error = json.loads(ambiguous.out)["error"]  # under --json the refusal is JSON too, as every command's
    assert (error["code"], error["field"]) == ("SandboxNotFound", "run") and "2 runs match 'run-'" in error["message"]


def test_an_empty_history(cli: Cli) -> None:
    assert cli.json("runs", "list") == []
    assert cli("runs", "list").code == 0


# PostgreSQL ----------------------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_cluster: Any) -> str:
    """A fresh database in the session's throwaway PostgreSQL cluster (tests/conftest.py)."""
    return str(pg_cluster.url(pg_cluster.create_database()))


@pytest.mark.docker
def test_db_names_a_postgresql_journal(tmp_path: Path, engine: Any, pg_url: str) -> None:
    with docker_cli(tmp_path, engine) as cli:
        done = cli("run", "--db", pg_url, "--profile", BUSYBOX, "--", "echo", "into postgres")
        assert done.code == 0, str(done)
        assert done.out == b"into postgres\n"
        run_id = run_id_of(done)
        [listed] = cli.json("runs", "list", "--db", pg_url)
        assert (listed["run_id"], listed["status"], listed["exit_code"]) == (run_id, "succeeded", 0)
        shown = cli.json("runs", "show", "--db", pg_url, run_id)
        check_events(shown, ["select", "materialize", "provision", "activate", "openProcess", "release"])
        assert cli.open_allocations(pg_url) == []
        assert cli.json("runs", "list") == []  # the default SQLite journal saw nothing of it
        journal = Journal(pg_url)
        try:
            assert journal.run(run_id) is not None
        finally:
            journal.close()
