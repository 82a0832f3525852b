"""Lease fencing: each Run attempt holds ``(lease_id, lease_epoch)`` in the journal's database.

Every test runs against an SQLite file and a PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from typing import Any

import pytest

from checkfu.contract.errors import SandboxLeaseFenced, SandboxNotFound
from checkfu.contract.target import Lease
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.journal import Journal
from checkfu.core.leases import LeaseStore, _proc_start, current_owner, owner_alive
from checkfu.testing import Misbehaving, memory_profile, stale_epoch

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(journal: Journal, clock: ManualClock) -> LeaseStore:
    return LeaseStore(journal, clock, ttl=60.0)


def dead_owner() -> str:
    """An owner string naming a process of this host that has exited and been reaped."""
    proc = subprocess.Popen(["sleep", "30"])
    start = _proc_start(proc.pid)
    assert start is not None
    proc.kill()
    proc.wait()
    return f"{socket.gethostname()}/{proc.pid}/{start}"


def test_owner_liveness() -> None:
    me = current_owner()
    host, pid, start = me.rsplit("/", 2)
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert owner_alive(me) is True
    assert owner_alive(dead_owner()) is False
    assert owner_alive(f"{host}/{pid}/{int(start) + 1}") is False  # same pid, another start: recycled
    assert owner_alive("elsewhere.invalid/1/1") is None  # another host cannot be seen
    assert owner_alive("garbage") is None


def test_acquire_and_renew(store: LeaseStore, clock: ManualClock) -> None:
    lease = store.acquire("run-1")
    rec = store.record(lease.lease_id)
    assert (lease.lease_epoch, rec.epoch, rec.run_id, rec.owner, rec.ended) == (1, 1, "run-1", current_owner(), False)
    assert rec.expires_at == clock.now() + 60.0
    clock.advance(30)
    store.renew(lease)
    assert store.record(lease.lease_id).expires_at == clock.now() + 60.0
    store.renew(lease, ttl=500)
    assert store.record(lease.lease_id).expires_at == clock.now() + 500


def test_takeover_bumps_the_epoch_and_fences_the_old_holder(store: LeaseStore) -> None:
    old = store.acquire("run-1")
    new = store.takeover(old.lease_id, owner="elsewhere.invalid/7/7")
    assert (new.lease_id, new.lease_epoch) == (old.lease_id, 2)
    assert store.record(old.lease_id).owner == "elsewhere.invalid/7/7"
    with pytest.raises(SandboxLeaseFenced) as caught:
        store.renew(old)
    assert caught.value.field == "lease.lease_epoch"
    assert "epoch 2 is current" in caught.value.message
    store.renew(new)
    # Ending a fenced lease does nothing to the current holder.
    store.end(old)
    assert store.record(old.lease_id).ended is False
    store.renew(new)
    third = store.takeover(old.lease_id)
    assert third.lease_epoch == 3
    with pytest.raises(SandboxLeaseFenced):
        store.renew(new)


def test_an_ended_lease_is_fenced(store: LeaseStore) -> None:
    lease = store.acquire("run-1")
    store.end(lease)
    with pytest.raises(SandboxLeaseFenced) as caught:
        store.renew(lease)
    assert caught.value.field == "lease.lease_id"
    assert "ended" in caught.value.message


def test_unknown_leases(store: LeaseStore) -> None:
    with pytest.raises(SandboxNotFound):
        store.takeover("lease-none")
    with pytest.raises(SandboxLeaseFenced) as caught:
        store.renew(Lease(lease_id="lease-none", lease_epoch=1))
    assert "unknown" in caught.value.message
    assert store.reclaimable("lease-none") is True


def test_only_one_takeover_wins_a_race(journal: Journal, clock: ManualClock) -> None:
    store_a = LeaseStore(journal, clock)
    store_b = LeaseStore(journal, clock)
    lease = store_a.acquire("run-1")
    stale = store_b.record(lease.lease_id)  # B reads epoch 1 ...
    won = store_a.takeover(lease.lease_id)  # ... A moves it to 2 first ...
    store_b.record = lambda _id: stale  # type: ignore[method-assign]
    with pytest.raises(SandboxLeaseFenced):  # ... so B's compare-and-set finds nothing to swap.
        store_b.takeover(lease.lease_id)
    assert LeaseStore(journal, clock).record(lease.lease_id).epoch == won.lease_epoch == 2


def test_reclaimable(store: LeaseStore, clock: ManualClock) -> None:
    live = store.acquire("run-1")
    assert store.reclaimable(live.lease_id) is False
    clock.advance(61)
    assert store.reclaimable(live.lease_id) is True  # expired

    ended = store.acquire("run-2")
    store.end(ended)
    assert store.reclaimable(ended.lease_id) is True

    gone = store.acquire("run-3", owner=dead_owner())
    assert store.reclaimable(gone.lease_id) is True  # not expired, but its owner is dead

    host, pid, _ = current_owner().rsplit("/", 2)
    bogus = store.acquire("run-4", owner=f"{host}/{pid}/1")
    assert store.reclaimable(bogus.lease_id) is True  # this pid, but not this process

    far = store.acquire("run-5", owner="elsewhere.invalid/1/1")
    assert store.reclaimable(far.lease_id) is False  # cannot be seen, and not expired
    clock.advance(61)
    assert store.reclaimable(far.lease_id) is True


# Fencing through the driver ------------------------------------------------------------------


async def test_a_runner_whose_lease_was_taken_over_stops_before_the_provider(make_rig: Any, journal_url: str) -> None:
    rig = make_rig(url=journal_url)
    session = rig.start()
    profile = memory_profile()
    image = (await session.materialize(profile, AMD64)).image
    inst = await session.provision(profile, AMD64, image)
    await session.activate(inst)
    LeaseStore(rig.journal, rig.clock).takeover(session.lease.lease_id, owner="elsewhere.invalid/9/9")
    calls = list(rig.memory.calls)
    for attempt in (
        lambda: session.exec(inst, ["true"], timeout=5),
        lambda: session.inspect(inst),
        lambda: session.release(inst),
        lambda: session.provision(profile, AMD64, image),
        lambda: session.materialize(profile, AMD64),
    ):
        with pytest.raises(SandboxLeaseFenced) as caught:
            await attempt()
        assert caught.value.field == "lease.lease_epoch"
    assert rig.memory.calls == calls  # zero provider calls
    events = rig.journal.events_for_run(session.run_id)
    after = events[[e.member for e in events].index("activate") + 1 :]
    # The fenced provision is refused before its row is journaled (the write is fenced too), so it leaves
    # nothing to compensate.
    assert [(e.member, e.error_code) for e in after] == [
        ("exec", "SandboxLeaseFenced"),
        ("inspect", "SandboxLeaseFenced"),
        ("release", "SandboxLeaseFenced"),
        ("provision", "SandboxLeaseFenced"),
        ("materialize", "SandboxLeaseFenced"),
    ]
    assert len(rig.journal.allocations_for_run(session.run_id)) == 1  # only the instance journaled before
    # The fenced runner reclaims nothing: the allocation belongs to the new holder now.
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"
    assert inst.allocation_key in rig.held_keys()


async def test_a_result_echoing_an_older_epoch_is_fenced_and_compensated(make_rig: Any, journal_url: str) -> None:
    rig = make_rig(url=journal_url, wrap=Misbehaving)
    session = rig.start()
    profile = memory_profile()
    # The same runner took its own lease over (epoch 2): a provider echoing epoch 1 is stale.
    session.lease = LeaseStore(rig.journal, rig.clock).takeover(session.lease.lease_id)
    assert session.lease.lease_epoch == 2
    image = (await session.materialize(profile, AMD64)).image
    inst = await session.provision(profile, AMD64, image)
    await session.activate(inst)
    rig.provider.set("exec", stale_epoch)
    with pytest.raises(SandboxLeaseFenced) as caught:  # a wrong echo: fenced, as the contract says
        await session.exec(inst, ["true"], timeout=5)
    assert caught.value.field == "lease.lease_epoch"
    assert LeaseStore(rig.journal, rig.clock).record(session.lease.lease_id).epoch == 2  # no takeover happened
    assert rig.memory.calls[-1] == "compensate"
    row = rig.journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "compensated"
    assert rig.memory.live_objects() == ()
    assert inst.state == "released"


async def test_a_fleet_run_whose_provider_echoes_another_lease_is_settled_not_left_claimed(journal: Journal) -> None:
    """A wrong lease echo is SandboxLeaseFenced, as a takeover is; but the runner still holds its lease, so the
    Run is settled (refused, naming the code) rather than abandoned as if another runner had taken it."""
    from checkfu.core.fleet import FleetConfig, FleetRunner  # noqa: PLC0415
    from checkfu.core.queue import RunQueue, RunRequest, is_terminal  # noqa: PLC0415
    from checkfu.core.registry import Adapter, Registry  # noqa: PLC0415
    from checkfu.fleet import submit_request  # noqa: PLC0415
    from checkfu.testing import MemoryProvider, wrong_lease_id  # noqa: PLC0415

    memory = MemoryProvider()
    double = Misbehaving(memory, {"activate": wrong_lease_id})
    registry = Registry()
    registry.add(Adapter(envelope=memory.envelope, provider=double, source="misbehaving memory"))

    async def load(spec: str) -> Registry:
        return registry

    profile = memory_profile()
    request = RunRequest(provider="memory", command=("true",), profile=profile.model_dump(mode="json"))
    run_id = submit_request(journal, request, runner_tag="fleet-echo")
    events: list[dict[str, Any]] = []
    config = FleetConfig(concurrency=1, lease_ttl=30.0, poll=0.02, reconcile_every=3600.0)
    fleet = FleetRunner(journal, load, runner_tag="fleet-echo", config=config, emit=events.append)

    async def stop_when_settled() -> None:
        for _ in range(1000):
            if any(e.get("event") in ("settled", "fenced") for e in events):
                break
            await asyncio.sleep(0.01)
        fleet.stop()

    await asyncio.gather(fleet.serve(), stop_when_settled())
    assert not [e for e in events if e.get("event") == "fenced"], events
    run = journal.run(run_id)
    assert run is not None and is_terminal(run.status), run
    # the provider was at work when its answer was fenced: the Run failed (issue 29), it was not refused
    assert run.status == "failed"
    assert run.summary is not None and run.summary["error"]["field"] == "lease.lease_id"
    assert run.summary["error"]["code"] == "SandboxLeaseFenced"
    assert memory.live_objects() == ()
    assert journal.open_allocations(run_id=run_id) == []
    assert RunQueue(journal, ManualClock()).counts().get("running", 0) == 0
