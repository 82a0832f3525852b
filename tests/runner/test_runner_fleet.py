"""A fleet: three ``checkfu runner serve`` processes on one PostgreSQL, a memory provider served over the wire.

The provider is one shared process (``checkfu provider serve memory``); the runners, the
submitters and the waiters are processes of their own or this test, and share nothing but
the database and the provider's URL. One runner is killed (SIGKILL) in the middle of its
Runs; another is paused (SIGSTOP) past its lease, then resumed. Every Run must reach exactly
one terminal state, the paused runner must be fenced and change nothing, and nothing may be
left on the provider or open in the journal.

``CHECKFU_SLOW=1`` adds a longer run: more Runs, and a kill and a pause in every round.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import checkfu
from checkfu.contract.members import ListAllocationsRequest
from checkfu.contract.target import Lease
from checkfu.core.journal import events, runs
from checkfu.testing import memory_profile
from checkfu.wire.client import RemoteProvider
from fleet_rig import (
    FleetRig,
    check_every_run_settled_once,
    check_the_paused_runner_changed_nothing,
    fleet_round,
    runner_id,
    takeover_seconds,
    wait_for,
)

TTL = 2.0
RUNNER_OPTIONS = ("--lease-ttl", str(TTL), "--heartbeat", "0.4", "--poll", "0.05", "--reconcile-every", "2")


@pytest.fixture
def rig(pg_cluster: Any, tmp_path: Path) -> Any:
    db = pg_cluster.url(pg_cluster.create_database())
    fleet = FleetRig.make(db, tmp_path)
    credential = tmp_path / "credential"
    credential.write_text(secrets.token_urlsafe(32))
    credential.chmod(0o600)
    fleet.url = fleet.serve_provider("memory", credential)  # type: ignore[attr-defined]
    fleet.env["CHECKFU_PROVIDER_CREDENTIAL"] = credential.read_text()
    fleet.secret = credential.read_text()  # type: ignore[attr-defined]
    profile = tmp_path / "memory.json"
    profile.write_text(memory_profile().model_dump_json())
    fleet.profile = profile  # type: ignore[attr-defined]
    try:
        yield fleet
    finally:
        fleet.stop()


def submit_many(rig: Any, commands: list[list[str]]) -> list[str]:
    """The first two through the command line, the rest through the SDK: the same queue either way."""
    ids = []
    for i, argv in enumerate(commands):
        if i < 2:
            done = rig.checkfu(
                "submit", "--db", rig.db, "--provider", rig.url, "--profile", str(rig.profile), "--", *argv
            )
            assert done.returncode == 0, done.stderr.decode()
            ids.append(done.stdout.decode().strip())
        else:
            ids.append(checkfu.submit(argv, db=rig.db, provider=rig.url, profile=rig.profile))
    return ids


def provider_holds(rig: Any) -> list[str]:
    """Every allocation key the provider still holds for the fleet's tag, asked over the wire."""

    async def ask() -> list[str]:
        remote = RemoteProvider(rig.url, rig.secret)
        try:
            target = (await remote.describe()).envelope.target
            listing = await remote.list_allocations(
                ListAllocationsRequest(
                    target=target, lease=Lease(lease_id="lease-test", lease_epoch=1), runner_tag=rig.tag
                )
            )
        finally:
            await remote.aclose()
        return sorted({a.allocation_key for a in listing.allocations})

    return asyncio.run(ask())


def check_nothing_left(rig: Any) -> None:
    assert rig.open_allocations() == []
    assert provider_holds(rig) == []


def test_three_runners_through_a_sigkill_and_a_sigstop(rig: Any) -> None:
    long = [["sleep", "6"]] * 4
    short = [["echo", f"fleet-{i}"] if i % 3 == 0 else ["sleep", "1"] for i in range(20)]
    ids = submit_many(rig, long + short)
    a = rig.start_runner("a", *RUNNER_OPTIONS, "--concurrency", "2")
    wait_for("runner a to hold two Runs", lambda: len(a.in_flight()) == 2, 30)
    b = rig.start_runner("b", *RUNNER_OPTIONS, "--concurrency", "2")
    wait_for("runner b to hold two Runs", lambda: len(b.in_flight()) == 2, 30)
    c = rig.start_runner("c", *RUNNER_OPTIONS, "--concurrency", "4")
    seen = fleet_round(rig, ids, (a, b))
    statuses = rig.wait_terminal(ids, timeout=90)
    assert set(statuses.values()) == {"succeeded"}
    check_every_run_settled_once(rig, ids)
    for run_id in seen["killed_runs"]:
        lease = rig.lease_of(run_id)
        assert lease.epoch >= 2  # taken over with the epoch bumped
        assert takeover_seconds(rig, run_id, seen["t_kill"]) <= TTL + 3
    check_the_paused_runner_changed_nothing(rig, seen, b)

    # `checkfu runs wait` streams a finished Run's output and exits with its status
    echo_id = ids[4]
    done = rig.checkfu("runs", "wait", echo_id, "--db", rig.db)
    assert (done.returncode, done.stdout) == (0, b"fleet-0\n")
    done = rig.checkfu("runs", "wait", seen["killed_runs"][0], "--db", rig.db, "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["status"] == "succeeded" and answer["attempts"] >= 2
    listed = json.loads(rig.checkfu("runner", "list", "--db", rig.db, "--json").stdout)
    assert {r["runner_id"] for r in listed["runners"]} >= {runner_id(c)}
    assert seen["killed_id"] not in {r["runner_id"] for r in listed["runners"]}  # no heartbeat: not live

    rig.stop_runners()
    assert a.proc.returncode == -signal.SIGKILL
    assert (b.proc.returncode, c.proc.returncode) == (0, 0)
    everyone = json.loads(rig.checkfu("runner", "list", "--db", rig.db, "--json", "--all").stdout)["runners"]
    assert sorted(r["state"] for r in everyone) == ["stale", "stopped", "stopped"]
    check_nothing_left(rig)


def test_sigterm_gives_a_run_back_and_another_runner_finishes_it(rig: Any) -> None:
    (run_id,) = submit_many(rig, [["sleep", "3"]])
    first = rig.start_runner("first", *RUNNER_OPTIONS, "--concurrency", "1")
    wait_for("the Run to be claimed", lambda: first.in_flight() == [run_id], 30)
    time.sleep(0.5)
    rig.signal(first, signal.SIGTERM)
    assert first.proc.wait(timeout=30) == 0
    row = rig.query(sa.select(runs).where(runs.c.run_id == run_id))[0]
    assert (row.status, row.runner_id) == ("queued", None)
    assert rig.lease_of(run_id).ended  # given up: nobody need wait for it to expire
    assert [
        e.member for e in rig.query(sa.select(events).where(events.c.run_id == run_id, events.c.member == "requeue"))
    ]
    check_nothing_left(rig)  # its sandbox was released on the way out
    assert [e["event"] for e in first.events()][-3:] == ["stopping", "given_back", "stopped"]
    second = rig.start_runner("second", *RUNNER_OPTIONS)
    assert rig.wait_terminal([run_id], timeout=30) == {run_id: "succeeded"}
    assert [e["attempt"] for e in second.events() if e["event"] == "settled"] == [2]
    check_every_run_settled_once(rig, [run_id])
    rig.stop_runners()
    check_nothing_left(rig)


@pytest.mark.slow
def test_a_long_fleet_run_through_repeated_kills_and_pauses(rig: Any) -> None:
    """Three rounds: each kills one runner and pauses another, while 150 Runs stream through; replacements join."""
    commands = [["sleep", "4"]] * 6 + [["echo", f"n{i}"] if i % 2 else ["sleep", "0.3"] for i in range(144)]
    ids = submit_many(rig, commands)
    live = [rig.start_runner(f"r{i}", *RUNNER_OPTIONS, "--concurrency", "2") for i in range(3)]
    for round_ in range(3):
        seen = fleet_round(rig, ids, (live[0], live[1]))
        check_the_paused_runner_changed_nothing(rig, seen, live[1])
        live = [live[1], live[2], rig.start_runner(f"n{round_}", *RUNNER_OPTIONS, "--concurrency", "2")]
    assert set(rig.wait_terminal(ids, timeout=600).values()) == {"succeeded"}
    check_every_run_settled_once(rig, ids)
    rig.stop_runners()
    check_nothing_left(rig)
