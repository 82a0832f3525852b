"""When the engine is down or the journal locked, nothing claims what did not happen.

- Ctrl-C with the engine stopped used to print "released and compensated; nothing is left behind" while the
  sandbox remained, and ``checkfu runner reconcile`` exited 0 with every allocation "skipped". Now both say
  what is left and how to finish, and exit non-zero; once the engine is back, one reconcile finishes it.
- A Run killed while the engine then stops and starts again is finished by a reconcile after the restart.
- A journal held ``BEGIN EXCLUSIVE`` makes ``checkfu run`` wait within its deadline, and past it end with a
  typed error and the sandbox released; a reconcile while it is locked ends typed too, and settles once free.

The engine stopped here is a private ``dockerd`` this module starts on its own socket and data root
(``private_engine.py``): the shared engine is never stopped.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .private_engine import PrivateEngine, private_engine
from .test_crash_at_every_step import SLEEP, kill_at, settled, start_at
from .test_run_cli import PROFILES, Cli, isolated_cli
from .test_run_docker import connect, leftovers, reclaim

pytestmark = pytest.mark.docker

BUSYBOX = str(PROFILES / "busybox-none.toml")


@pytest.fixture(scope="module")
def shared() -> Iterator[Any]:
    client = connect()
    yield client
    client.close()


@pytest.fixture(scope="module")
def engine(shared: Any) -> Iterator[PrivateEngine]:
    yield from private_engine(shared)


@pytest.fixture
def pcli(tmp_path: Path, engine: PrivateEngine) -> Iterator[Cli]:
    """A CLI on the private engine; on the way out the engine runs and holds nothing of its tag."""
    with isolated_cli(tmp_path) as cli:
        yield cli
        cli.stop_all()
        engine.start() if engine.proc is None or engine.proc.poll() is not None else None
        client = engine.client()
        try:
            left = leftovers(client, cli.tag)
            if left:
                reclaim(client, cli.tag)
        finally:
            client.close()
    assert not left, f"left behind on the private engine: {left}"


@pytest.fixture
def scli(tmp_path: Path, shared: Any) -> Iterator[Cli]:
    """A CLI on the shared engine."""
    with isolated_cli(tmp_path) as cli:
        yield cli
        cli.stop_all()
        left = leftovers(shared, cli.tag)
        if left:
            reclaim(shared, cli.tag)
    assert not left, f"left behind: {left}"


def held(engine: PrivateEngine, tag: str) -> list[str]:
    client = engine.client()
    try:
        return leftovers(client, tag)
    finally:
        client.close()


def test_ctrl_c_with_the_engine_down_says_what_is_left_and_reconcile_finishes_it(
    pcli: Cli, engine: PrivateEngine
) -> None:
    on = {"DOCKER_HOST": engine.host}
    running = pcli.start("run", "--profile", BUSYBOX, "--", "true", pause_before="process", **on)
    running.wait_for("paused before process", timeout=90)
    assert held(engine, pcli.tag)
    engine.stop()
    running.send(signal.SIGINT)
    done = running.finish(timeout=120)
    assert done.code == 130, str(done)
    assert "nothing is left behind" not in done.said, str(done)
    assert "interrupted by SIGINT: 1 allocation(s) of run-" in done.said, str(done)
    assert "could not be released and are left behind" in done.said
    assert "to finish: once docker@" in done.said and "run `checkfu runner reconcile`" in done.said

    down = pcli("runner", "reconcile", **on)
    assert down.code == 1, str(down)
    assert "not finished: 1 allocation(s) are still held" in down.said, str(down)
    assert "its provider docker is unavailable" in down.said and "compensated 0" in down.said

    engine.start()
    assert held(engine, pcli.tag)  # the engine kept it: a restart is not a cleanup
    done = pcli("runner", "reconcile", "--json", **on)
    assert done.code == 0, str(done)
    assert len(json.loads(done.out)["compensated"]) == 1
    assert held(engine, pcli.tag) == []
    again = json.loads(pcli("runner", "reconcile", "--json", **on).out)
    assert again["compensated"] == again["enumerated"] == again["settled_runs"] == []


def test_a_run_killed_then_the_engine_stopped_and_started_is_finished_after_the_restart(
    pcli: Cli, engine: PrivateEngine
) -> None:
    on = {"DOCKER_HOST": engine.host}
    args = ["run", "--profile", BUSYBOX, "--", "sleep", SLEEP]
    kill_at(pcli, "answered:openProcess#1", "cli", args, **on)
    engine.stop()
    down = pcli("runner", "reconcile", "--json", **on)
    assert down.code == 1, str(down)
    report = json.loads(down.out)
    assert len(report["skipped"]) == 1 and report["settled_runs"] == [] and len(report["unsettled_runs"]) == 1
    # Not claimed settled, and never shown running: its owner is gone. This `runs list` does not reap it (it
    # reaches another engine than the Run's), so the reconciliation below finds it as it was.
    listed = pcli("runs", "list", "--json")
    assert [r["status"] for r in json.loads(listed.out)] == ["orphaned"], str(listed)
    assert "its sandbox is on another Docker engine" in listed.said
    assert settled(pcli)[0] != []  # still recorded running: nothing of it was released

    engine.start()
    up = pcli("runner", "reconcile", "--json", **on)
    assert up.code == 0, str(up)
    report = json.loads(up.out)
    assert len(report["compensated"]) == 1 and len(report["settled_runs"]) == 1
    assert held(engine, pcli.tag) == []
    assert settled(pcli) == ([], [])
    assert [r["status"] for r in pcli.json("runs", "list")] == ["orphaned"]  # settled as reaped with its owner
    again = json.loads(pcli("runner", "reconcile", "--json", **on).out)
    assert again["compensated"] == again["enumerated"] == again["settled_runs"] == []


# The journal locked --------------------------------------------------------------------------------


class Lock:
    """``BEGIN EXCLUSIVE`` on a journal file, as another process holding it would."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN EXCLUSIVE")
        self.held = True

    def release(self) -> None:
        if self.held:
            self.conn.execute("COMMIT")
            self.held = False
        self.conn.close()


def test_a_run_killed_then_reconciled_while_the_journal_is_locked(scli: Cli, shared: Any) -> None:
    kill_at(scli, "answered:provision#1", "cli", ["run", "--profile", BUSYBOX, "--", "true"])
    lock = Lock(scli.journal_path)
    try:
        done = scli("runner", "reconcile", CHECKFU_JOURNAL_DEADLINE="1")
        assert done.code == 1, str(done)
        assert "journal unavailable" in done.said and "database is locked" in done.said, str(done)
        assert "internal error" not in done.said
        assert leftovers(shared, scli.tag)  # nothing was taken without its record
    finally:
        lock.release()
    code = scli("runner", "reconcile")
    assert code.code == 0, str(code)
    assert leftovers(shared, scli.tag) == []
    assert settled(scli) == ([], [])


@pytest.mark.parametrize("held_for", [1.0, None], ids=["within-the-deadline", "past-the-deadline"])
def test_a_journal_locked_during_the_run(scli: Cli, shared: Any, tmp_path: Path, held_for: float | None) -> None:
    """Held from just before the command starts: waited out within the deadline; past it, a typed error,
    the sandbox released all the same, and a reconcile settles the Run once the journal is free."""
    go = tmp_path / "go"
    deadline = "10" if held_for is not None else "1"
    running = start_at(
        scli, "answered:activate#1", "cli", "run", "--profile", BUSYBOX, "--", "echo", "hi",
        KILLPOINT_RESUME_FILE=str(go), CHECKFU_JOURNAL_DEADLINE=deadline,
    )  # fmt: skip
    running.wait_for("killpoint answered:activate#1", timeout=90)
    lock = Lock(scli.journal_path)
    try:
        if held_for is not None:
            threading.Timer(held_for, lock.release).start()
        go.write_text("go")
        done = running.finish(timeout=120)
        if held_for is not None:
            assert done.code == 0 and done.out == b"hi\n", str(done)
            assert [r["status"] for r in scli.json("runs", "list")] == ["succeeded"]
            return
        assert done.code == 125, str(done)  # checkfu's own failure around the command, as docker's 125
        assert "journal unavailable" in done.said and "database is locked" in done.said, str(done)
        assert "internal error" not in done.said and done.out == b""
        assert leftovers(shared, scli.tag) == []  # released though nothing could be recorded
    finally:
        if lock.held and held_for is None:
            lock.release()
    after = scli("runner", "reconcile", "--json")
    assert after.code == 0, str(after)
    assert len(json.loads(after.out)["settled_runs"]) == 1
    assert settled(scli) == ([], [])
