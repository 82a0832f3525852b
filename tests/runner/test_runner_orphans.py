"""Orphans reaped without asking, and output kept (issue 11): the runner's side, on the memory provider.

A Run started in place records its owner (``host/pid/start``, and the boot id); ``orphans`` finds the Runs
whose owner is gone with one query, ``reap_orphans`` reclaims what they hold through reconciliation's
takeover and compensation and settles them as ``orphaned``.
"""

from __future__ import annotations

import json
import socket
import subprocess
from typing import Any

import anyio
import pytest
import sqlalchemy as sa

from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.journal import ORPHANED, Journal, leases, runs
from checkfu.core.leases import _proc_start, boot_id, current_owner, owner_gone
from checkfu.core.output import MASK_MIN, Masker, OutputKeeper
from checkfu.core.reconcile import orphans, reap_orphans, reconcile, run_status
from checkfu.core.registry import Registry
from checkfu.testing import memory_profile

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()


def dead_owner() -> str:
    proc = subprocess.Popen(["sleep", "30"])
    start = _proc_start(proc.pid)
    proc.kill()
    proc.wait()
    return f"{socket.gethostname()}/{proc.pid}/{start}"


def test_an_owner_is_gone_only_when_that_very_process_is_gone() -> None:
    me = current_owner()
    assert owner_gone(me, boot_id()) is False
    assert owner_gone(dead_owner(), boot_id()) is True
    host, pid, start = me.rsplit("/", 2)
    assert owner_gone(f"{host}/{pid}/{int(start) + 1}", boot_id()) is True  # the pid reused by another process
    assert owner_gone(me, "another-boot") is True  # the machine booted since: every owner of before is gone
    assert owner_gone(f"elsewhere.example/{pid}/{start}", boot_id()) is False  # cannot be seen from here
    assert owner_gone("not an owner", None) is False


async def orphaned_run(rig: Any, owner: str) -> tuple[Any, list[str]]:
    """A Run started in place by ``owner`` that allocated, then lost its owner without releasing anything."""
    session = rig.start(owner=owner)
    with rig.journal.tx() as c:  # the owner took the lease, as a `checkfu run` process does
        c.execute(leases.update().where(leases.c.lease_id == session.lease.lease_id).values(owner=owner))
    image = (await session.materialize(PROFILE, AMD64)).image
    inst = await session.provision(PROFILE, AMD64, image)
    await session.activate(inst)
    return session, [inst.allocation_key]


def statements(journal: Journal) -> list[str]:
    seen: list[str] = []
    sa.event.listen(journal.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


async def test_finding_no_orphan_costs_one_query(rig: Any) -> None:
    alive = rig.start(owner=current_owner())  # a live Run of this process: not an orphan
    seen = statements(rig.journal)
    assert orphans(rig.journal) == []
    assert len(seen) == 1 and seen[0].lstrip().upper().startswith("SELECT"), seen
    row = rig.journal.run(alive.run_id)
    assert row is not None and run_status(row) == "running"


async def test_an_orphan_is_reaped_released_and_settled_once(rig: Any) -> None:
    gone = dead_owner()
    session, keys = await orphaned_run(rig, gone)
    fleet_like = rig.start()  # no owner recorded (a Run of the fleet, or from before owners): never an orphan
    elsewhere = rig.start(owner="elsewhere.example/1/1")
    assert rig.held_keys() == set(keys)
    row = rig.journal.run(session.run_id)
    assert row is not None and row.status == "running" and run_status(row) == "orphaned"

    found = orphans(rig.journal)
    assert [o.run_id for o in found] == [session.run_id]
    report = await reap_orphans(rig.journal, rig.registry, rig.clock, found, reaper="test")
    assert (report.reaped, report.released, report.left, report.pending) == ([session.run_id], keys, {}, [])
    assert rig.held_keys() == set()
    row = rig.journal.run(session.run_id)
    assert row is not None and row.status == ORPHANED and row.finished_at is not None
    assert row.summary is not None and row.summary["reaped_as_orphan"] is True
    assert row.summary["owner"] == gone and set(row.summary["allocations"].values()) == {"compensated"}
    assert rig.journal.events_for_run(session.run_id)[-1].member == "reap"
    for other in (fleet_like, elsewhere):
        other_row = rig.journal.run(other.run_id)
        assert other_row is not None and other_row.status == "running"

    assert orphans(rig.journal) == []
    again = await reap_orphans(rig.journal, rig.registry, rig.clock, found, reaper="test")  # a racing reaper
    assert again.reaped == [] and again.released == []


async def test_a_full_reconciliation_settles_an_orphan_as_orphaned_not_abandoned(rig: Any) -> None:
    session, keys = await orphaned_run(rig, dead_owner())
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == keys and report.settled_runs == [session.run_id]
    row = rig.journal.run(session.run_id)
    assert row is not None and row.status == ORPHANED


async def test_an_orphan_whose_provider_is_not_loaded_stays_orphaned_and_is_said(rig: Any) -> None:
    session, keys = await orphaned_run(rig, dead_owner())
    report = await reap_orphans(rig.journal, Registry(), rig.clock, orphans(rig.journal), reaper="test")
    assert report.reaped == [] and list(report.left) == keys and report.pending == [session.run_id]
    row = rig.journal.run(session.run_id)
    assert row is not None and row.status == "running" and run_status(row) == "orphaned"  # never shown running
    done = await reap_orphans(rig.journal, rig.registry, rig.clock, orphans(rig.journal), reaper="test")
    assert done.reaped == [session.run_id]


def test_output_is_kept_up_to_the_cap_in_order(journal: Journal) -> None:
    with journal.tx() as c:
        c.execute(runs.insert().values(run_id="run-x", runner_tag="t", status="running", created_at=0.0))
    keeper = OutputKeeper(journal, "run-x", ManualClock(), cap=10)
    keeper.feed("out", b"hello ")
    keeper.feed("err", b"oops\n")
    keeper.flush()
    keeper.feed("out", b"world\n")
    keeper.feed("out", b"more")
    keeper.stop()
    kept = journal.output_since("run-x")
    assert [(c.stream, c.data) for c in kept] == [
        ("out", b"hello "),
        ("err", b"oops"),
    ]
    assert keeper.summary() == {"output_kept_bytes": 10, "output_dropped_bytes": 11, "output_cap_bytes": 10}


def test_environment_values_never_reach_the_kept_output_even_split_across_chunks() -> None:
    masker = Masker(["hunter2-secret", "abc", "hunter2"])
    kept = [
        masker.feed("out", b"pw=hunt"),
        masker.feed("out", b"er2-sec"),
        masker.feed("err", b"hunter2 and "),
        masker.feed("out", b"ret; short abc; ends with hun"),
    ]
    kept += [data for _stream, data in masker.end()]
    joined = b"".join(kept)
    assert b"hunter2" not in joined and b"sec" not in joined and joined.count(b"***") == 2
    assert b"short abc" in joined  # under MASK_MIN bytes: ordinary output cannot be told from it
    assert kept[-1] == b"hun"  # held back as the start of a value, released when nothing followed
    assert Masker([]).feed("out", b"as is") == b"as is"
    overlapping = Masker(["abcd", "cdef"])  # a whole value across the point where a longer one might begin
    got = overlapping.feed("out", b"xabcde") + overlapping.feed("out", b"Z") + b"".join(d for _, d in overlapping.end())
    assert got == b"x***eZ"
    assert MASK_MIN == 4


async def test_an_orphan_is_reaped_only_by_its_own_runner_tag(rig: Any) -> None:
    """Another tag's Runs are that runner's to reap, as reconcile leaves them: a shared journal seen from another
    pid namespace under the same host name would otherwise misjudge their owners as gone."""
    session, _ = await orphaned_run(rig, dead_owner())
    assert [o.run_id for o in orphans(rig.journal, runner_tag=rig.runner.runner_tag)] == [session.run_id]
    assert orphans(rig.journal, runner_tag="another-runner") == []


async def test_kill_never_signals_a_process_that_did_not_start_the_run_in_place(
    make_rig: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`checkfu kill RUN` signals only the process that started that Run in place (`checkfu run`): a live holder
    that serves more than this Run (a fleet runner, a program embedding the runner; here this very test) is
    refused by name, and so is a Run of another runner tag."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from checkfu.cli.commands import app  # noqa: PLC0415
    from checkfu.core.journal import sqlite_url  # noqa: PLC0415

    url = sqlite_url(tmp_path / "kill.sqlite")
    rig = make_rig(url=url, runner_tag="tkill")
    session = rig.start()  # no owner recorded: not a Run started in place
    with rig.journal.tx() as c:  # ... yet held by a live process: this one
        c.execute(leases.update().where(leases.c.lease_id == session.lease.lease_id).values(owner=current_owner()))
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", "tkill")

    def kill() -> Any:  # the command runs its own event loop: off this one
        return CliRunner().invoke(app, ["kill", session.run_id, "--db", url, "--json"])

    held = await anyio.to_thread.run_sync(kill)
    assert held.exit_code == 125, held.output
    error = json.loads(held.stdout)["error"]
    assert (error["code"], error["field"]) == ("SandboxStateConflict", "run")
    assert "serves more than this Run" in error["message"]
    monkeypatch.setenv("CHECKFU_RUNNER_TAG", "someone-else")
    other = await anyio.to_thread.run_sync(kill)
    assert other.exit_code == 125 and "belongs to runner tag 'tkill'" in json.loads(other.stdout)["error"]["message"]
    assert rig.journal.run(session.run_id).status == "running"  # nothing was done to it
