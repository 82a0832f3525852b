"""Orphan reconciliation: every unsettled allocation nobody is coming back for is compensated, once.

Also ``checkfu runner reconcile``, through the installed console script and in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from checkfu.cli import app
from checkfu.contract.codec import decode_value
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxLeaseFenced
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal, leases, sqlite_url
from checkfu.core.leases import LeaseStore, _proc_start, current_owner
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Registry
from checkfu.testing import Misbehaving, Requests, crash, memory_envelope, memory_profile, stale_epoch, wrong_lease_id

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()
CHECKFU = Path(sys.executable).parent / "checkfu"


async def crashed_run(rig: Any, *, instances: int = 1, owner: str | None = None) -> tuple[Any, list[Any]]:
    """A Run that allocated and then vanished without releasing anything."""
    session = rig.start()
    if owner is not None:
        with rig.journal.tx() as c:
            c.execute(leases.update().where(leases.c.lease_id == session.lease.lease_id).values(owner=owner))
    image = (await session.materialize(PROFILE, AMD64)).image
    made = []
    for _ in range(instances):
        inst = await session.provision(PROFILE, AMD64, image)
        await session.activate(inst)
        made.append(inst)
    return session, made


def dead_owner() -> str:
    proc = subprocess.Popen(["sleep", "30"])
    start = _proc_start(proc.pid)
    proc.kill()
    proc.wait()
    return f"{socket.gethostname()}/{proc.pid}/{start}"


async def test_an_expired_lease_is_reclaimed_and_a_second_pass_finds_nothing(rig: Any) -> None:
    session, made = await crashed_run(rig, instances=2)
    # Not yet: the lease is current and its owner (this process) is alive.
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.nothing_to_do
    assert len(rig.memory.live_objects()) == 2

    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert sorted(report.compensated) == sorted(i.allocation_key for i in made)
    assert (report.failed, report.skipped, report.enumerated) == ({}, {}, [])
    assert rig.memory.live_objects() == ()
    assert {r.state for r in rig.journal.allocations_for_run(session.run_id)} == {"compensated"}
    # The lease was taken over (the straggler is fenced) and then ended.
    rec = LeaseStore(rig.journal, rig.clock).record(session.lease.lease_id)
    assert rec.epoch == session.lease.lease_epoch + 1 and rec.ended

    again = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert again.nothing_to_do and again.skipped == {}


async def test_a_straggler_is_fenced_after_reconciliation(rig: Any) -> None:
    session, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    before = list(rig.memory.calls)
    with pytest.raises(SandboxLeaseFenced):
        await session.exec(inst, ["true"], timeout=5)
    assert rig.memory.calls == before


@pytest.mark.parametrize("owner", ["dead pid", "bogus start time"])
async def test_a_gone_owner_is_reclaimed_before_expiry(rig: Any, owner: str) -> None:
    host, pid, _ = current_owner().rsplit("/", 2)
    name = dead_owner() if owner == "dead pid" else f"{host}/{pid}/0"
    _, (inst,) = await crashed_run(rig, owner=name)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == [inst.allocation_key]
    assert rig.memory.live_objects() == ()
    assert (await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)).nothing_to_do


async def test_an_owner_on_another_host_waits_for_expiry(rig: Any) -> None:
    _, (inst,) = await crashed_run(rig, owner="elsewhere.invalid/1/1")
    assert (await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)).nothing_to_do
    assert inst.allocation_key in rig.held_keys()
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == [inst.allocation_key]


async def test_enumeration_takes_only_what_this_journal_accounts_for(rig: Any) -> None:
    tag = rig.runner.runner_tag
    requests = Requests(rig.memory.target, runner_tag=tag)
    image = (await rig.memory.materialize(requests.materialize())).image
    for key in ("ak-stray-1", "ak-stray-2"):
        await rig.memory.provision(requests.provision(key, image))  # behind this journal's back: another's
    foreign = Requests(rig.memory.target, runner_tag="another-runner")
    await rig.memory.provision(foreign.provision("ak-theirs", image))
    _, (kept,) = await crashed_run(rig)
    rig.journal.set_allocation(kept.allocation_key, "released", now=rig.clock.now())  # released, yet still held
    _, (mine,) = await crashed_run(rig)  # a live Run of this runner: its lease is current

    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=tag)
    assert report.enumerated == [kept.allocation_key]  # the journal says released: the provider kept it
    assert sorted(report.unaccounted) == ["ak-stray-1", "ak-stray-2"]  # never recorded here: not ours to take
    assert report.compensated == [] and report.failed == {}
    assert rig.held_keys() == {"ak-stray-1", "ak-stray-2", "ak-theirs", mine.allocation_key}
    again = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=tag)
    assert again.nothing_to_do and sorted(again.unaccounted) == ["ak-stray-1", "ak-stray-2"]


async def test_a_settled_snapshot_outlives_the_run(rig: Any) -> None:
    rig.profile = memory_profile("durable")
    session = rig.start()
    image = (await session.materialize(rig.profile, AMD64)).image
    inst = await session.provision(rig.profile, AMD64, image)
    await session.activate(inst)
    snap = await session.snapshot(inst)
    await session.release(inst)  # durable: the snapshot stays
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert (report.compensated, report.enumerated, report.left) == ([], [], {})
    assert report.settled_runs == [session.run_id]  # its runner is gone, and it holds nothing but the checkpoint
    assert [h.allocation_key for h in rig.memory.live_objects()] == [snap.allocation_key]
    row = rig.journal.allocation(snap.allocation_key)
    assert row is not None and row.state == "live"


async def test_a_pending_allocation_whose_provider_never_answered(rig: Any) -> None:
    # Journaled, then the runner died before the provider was asked: compensate finds nothing, and settles it.
    session = rig.start()
    rig.journal.journal_allocation(
        "ak-never-asked",
        run_id=session.run_id,
        kind="instance",
        target=rig.memory.target,
        runner_tag=rig.runner.runner_tag,
        lease_id=session.lease.lease_id,
        now=rig.clock.now(),
    )
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == ["ak-never-asked"]
    row = rig.journal.allocation("ak-never-asked")
    assert row is not None and row.state == "compensated"


async def test_without_its_adapter_a_row_is_skipped_not_settled(rig: Any) -> None:
    _, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, Registry(), rig.clock, runner_tag=rig.runner.runner_tag)
    assert list(report.skipped) == [inst.allocation_key] and not report.compensated
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"


async def test_a_failing_compensation_is_reported_and_left_open(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    _, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    rig.provider.set("compensate", crash)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert list(report.failed) == [inst.allocation_key]
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"
    rig.provider.set("compensate", None)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == [inst.allocation_key]
    assert rig.memory.live_objects() == ()


@pytest.mark.parametrize("fault", [wrong_lease_id, stale_epoch], ids=lambda f: f.name)
async def test_a_compensation_echoing_another_lease_is_reported_not_taken_for_a_live_owner(
    make_rig: Any, fault: Any
) -> None:
    """A compensation answering for another lease is SandboxLeaseFenced, as any wrong lease echo is; it is the
    provider's fault, not the owner renewing, so it is reported as failed (and the Run left unsettled), never
    skipped as if a live Run held it."""
    rig = make_rig(wrap=Misbehaving)
    session, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    rig.provider.set("compensate", fault)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert list(report.failed) == [inst.allocation_key]
    assert report.failed[inst.allocation_key].startswith("SandboxLeaseFenced:")
    assert report.unsettled_runs == [session.run_id]
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"
    rig.provider.set("compensate", None)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.compensated == [inst.allocation_key] and report.settled_runs == [session.run_id]


async def test_another_runner_tag_is_left_alone(make_rig: Any) -> None:
    rig = make_rig(runner_tag="runner-a")
    _, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag="runner-b")
    assert report.nothing_to_do
    assert inst.allocation_key in rig.held_keys()


# The command line ---------------------------------------------------------------------------------


def cli_env(tmp_path: Path, tag: str) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "CHECKFU_RUNNER_TAG": tag}


def test_the_cli_on_a_fresh_journal(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "fresh.sqlite")
    done = subprocess.run(
        [str(CHECKFU), "runner", "reconcile", "--db", url, "--provider", "memory", "--json"],
        capture_output=True,
        env=cli_env(tmp_path, "runner-cli"),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "compensated": [],
        "enumerated": [],
        "failed": {},
        "skipped": {},
        "unaccounted": [],
        "settled_runs": [],
        "unsettled_runs": [],
        "other_tags": {},
    }
    assert b"Traceback" not in done.stderr


def test_the_cli_settles_an_unsettled_row(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "journal.sqlite")
    journal = Journal(url)
    try:
        target = memory_envelope().target
        lease = LeaseStore(journal, ManualClock(start=1_000.0), ttl=1.0).acquire("run-old")  # long expired
        journal.start_run("run-old", runner_tag="runner-cli", target=target, now=1_000.0)
        for key, tag in (("ak-orphan", "runner-cli"), ("ak-someone-else", "runner-other")):
            journal.journal_allocation(
                key, run_id="run-old", kind="instance", target=target, runner_tag=tag, lease_id=lease.lease_id, now=1.0
            )
        journal.journal_allocation(
            "ak-no-adapter",
            run_id="run-old",
            kind="instance",
            target=decode_value(
                SandboxProviderCapabilities,
                {**json.loads(memory_envelope().model_dump_json()), "provider": "not-loaded"},
            ).target,
            runner_tag="runner-cli",
            lease_id=lease.lease_id,
            now=1.0,
        )
    finally:
        journal.close()
    result = CliRunner().invoke(
        app, ["runner", "reconcile", "--db", url, "--provider", "memory", "--json"], env=cli_env(tmp_path, "runner-cli")
    )
    assert result.exit_code == 1, result.output  # something is left: its provider is not loaded
    report = json.loads(result.stdout)
    assert report["compensated"] == ["ak-orphan"]
    assert list(report["skipped"]) == ["ak-no-adapter"]
    assert report["unsettled_runs"] == ["run-old"] and report["settled_runs"] == []
    assert report["failed"] == {} and report["enumerated"] == []
    journal = Journal(url)
    try:
        states = {r.allocation_key: r.state for r in journal.allocations_for_run("run-old")}
    finally:
        journal.close()
    assert states == {"ak-orphan": "compensated", "ak-someone-else": "pending", "ak-no-adapter": "pending"}
    second = CliRunner().invoke(
        app, ["runner", "reconcile", "--db", url, "--provider", "memory", "--json"], env=cli_env(tmp_path, "runner-cli")
    )
    assert second.exit_code == 1
    assert json.loads(second.stdout)["compensated"] == []
    said = CliRunner().invoke(
        app, ["runner", "reconcile", "--db", url, "--provider", "memory"], env=cli_env(tmp_path, "runner-cli")
    )
    text = " ".join(said.stderr.split())
    assert "left ak-no-adapter: no adapter for not-loaded@" in text
    assert f"run `checkfu runner reconcile --db {url}` again" in text


# One door: reconciliation's and describe's provider calls are journaled like a Run's own -------------


async def test_reconciliation_calls_are_part_of_the_story_of_the_run(rig: Any) -> None:
    session, made = await crashed_run(rig)
    rig.clock.advance(100_000)
    await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    events = rig.journal.events_for_run(session.run_id)
    assert [e.member for e in events] == ["select", "materialize", "provision", "activate", "compensate"]
    last = events[-1]
    assert (last.allocation_key, last.outcome) == (made[0].allocation_key, "ok")
    # The enumeration belongs to no Run: it is recorded under the empty run id.
    assert [e.member for e in rig.journal.events_for_run("")] == ["listAllocations"]


async def test_a_failed_reconciliation_call_is_journaled_with_its_code(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session, made = await crashed_run(rig)
    rig.provider.set("compensate", crash)
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.failed[made[0].allocation_key].startswith("SandboxProviderFailed:")
    (event,) = [e for e in rig.journal.events_for_run(session.run_id) if e.member == "compensate"]
    assert (event.outcome, event.error_code) == ("error", "SandboxProviderFailed")


async def test_describe_goes_through_the_door_and_is_journaled(tmp_path: Path) -> None:
    from checkfu.core.registry import load_registry  # noqa: PLC0415

    journal = Journal(sqlite_url(tmp_path / "j.sqlite"))
    try:
        registry = await load_registry(entry_point_names=["memory"], recorder=journal)
        assert len(registry.adapters) == 1
        (event,) = journal.events_for_run("")
        assert (event.member, event.outcome, event.allocation_key) == ("describe", "ok", None)
    finally:
        journal.close()


# Runs are settled, not only their allocations -----------------------------------------------------


async def test_a_killed_run_is_settled_as_abandoned_and_a_second_pass_does_nothing(rig: Any) -> None:
    session, _ = await crashed_run(rig, instances=2)
    never = rig.start()  # killed before it allocated anything
    rig.clock.advance(100_000)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert sorted(report.settled_runs) == sorted([session.run_id, never.run_id])
    statuses = {r.run_id: r.status for r in rig.journal.list_runs()}
    assert statuses == {session.run_id: "abandoned", never.run_id: "abandoned"}
    run = rig.journal.run(session.run_id)
    assert run is not None and run.finished_at is not None and run.summary is not None
    assert set(run.summary["allocations"].values()) == {"compensated"}
    again = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert again.nothing_to_do and again.settled_runs == []


async def test_a_live_run_is_not_settled(rig: Any) -> None:
    session, _ = await crashed_run(rig)  # its lease is current and its owner (this process) alive
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.settled_runs == [] and report.unsettled_runs == []
    run = rig.journal.run(session.run_id)
    assert run is not None and run.status == "running"


async def test_a_run_that_still_holds_something_is_not_settled(make_rig: Any) -> None:
    rig = make_rig(wrap=Misbehaving)
    session, (inst,) = await crashed_run(rig)
    rig.clock.advance(100_000)
    rig.provider.set("compensate", crash)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert list(report.left) == [inst.allocation_key] and report.unsettled_runs == [session.run_id]
    run = rig.journal.run(session.run_id)
    assert run is not None and run.status == "running"  # not claimed settled while its sandbox is held
    rig.provider.set("compensate", None)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.settled_runs == [session.run_id]


async def test_a_run_journaled_an_instant_ago_without_a_lease_is_left_to_take_it(rig: Any) -> None:
    tag, now = rig.runner.runner_tag, rig.clock.now()
    rig.journal.start_run("run-starting", runner_tag=tag, target=rig.memory.target, now=now)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.settled_runs == []
    rig.clock.advance(3600)
    report = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.settled_runs == ["run-starting"]
