"""Reconciliation is safe: it never takes a healthy Run's allocations (one starting mid-sweep, one
streaming a long command, an owner renewing at the last moment), and a broken provider or plugin
is reported, never a crash or a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from checkfu.contract.errors import SandboxLeaseFenced
from checkfu.contract.vocabulary import Platform
from checkfu.core.clock import ManualClock
from checkfu.core.deadlines import DEFAULT_DEADLINES
from checkfu.core.job import run_job
from checkfu.core.journal import Journal, sqlite_url
from checkfu.core.leases import LeaseStore
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Adapter, Registry, load_registry
from checkfu.core.runner import Runner
from checkfu.testing import MemoryProvider, Misbehaving, crash, hang, memory_profile

pytestmark = pytest.mark.anyio

AMD64 = Platform(os="linux", architecture="amd64")
PROFILE = memory_profile()


def registry_of(provider: Any, envelope: Any) -> Registry:
    registry = Registry()
    registry.add(Adapter(envelope=envelope, provider=provider, source="test"))
    return registry


async def test_a_run_that_starts_during_the_sweep_is_not_taken_for_a_stray(tmp_path: Path) -> None:
    memory = MemoryProvider()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    healthy: dict[str, Any] = {}

    class ProvisionsWhileListing:
        """A concurrent, healthy Run allocates between reconcile's journal read and its listing."""

        def __getattr__(self, name: str) -> Any:
            return getattr(memory, name)

        async def list_allocations(self, request: Any) -> Any:
            session = runner.start(memory.target, PROFILE, platform=AMD64).session
            image = (await session.materialize(PROFILE, AMD64)).image
            healthy["session"], healthy["inst"] = session, await session.provision(PROFILE, AMD64, image)
            return await memory.list_allocations(request)

    registry = registry_of(ProvisionsWhileListing(), memory.envelope)
    runner = Runner(registry, journal, runner_tag="rt", clock=clock)
    report = await reconcile(journal, registry, clock, runner_tag="rt")
    inst = healthy["inst"]
    assert inst.allocation_key not in report.enumerated
    row = journal.allocation(inst.allocation_key)
    assert row is not None and row.state == "live"
    await healthy["session"].activate(inst)
    await healthy["session"].release(inst)
    assert memory.live_objects() == ()


async def test_a_long_streaming_command_keeps_its_lease(tmp_path: Path) -> None:
    memory = MemoryProvider()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    registry = registry_of(memory, memory.envelope)
    runner = Runner(registry, journal, runner_tag="rt", clock=clock)
    job = asyncio.ensure_future(run_job(runner, memory.target, PROFILE, ["sleep", "1"], timeout=3600))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if any(e.member == "openProcess" for r in journal.list_runs() for e in journal.events_for_run(r.run_id)):
            break
    clock.advance(700)  # past the default lease, well within the command's own timeout
    report = await reconcile(journal, registry, clock, runner_tag="rt")
    assert report.compensated == []
    memory_clock_done = await asyncio.wait_for(job, timeout=30)
    assert memory_clock_done.exit_code == 0


@pytest.mark.parametrize("member", ["listAllocations", "compensate"])
async def test_a_crashing_provider_is_reported_not_raised(tmp_path: Path, member: str) -> None:
    memory = MemoryProvider()
    clock = ManualClock()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    session = (
        Runner(registry_of(memory, memory.envelope), journal, runner_tag="rt", clock=clock)
        .start(memory.target, PROFILE, platform=AMD64)
        .session
    )
    await session.provision(PROFILE, AMD64, (await session.materialize(PROFILE, AMD64)).image)
    clock.advance(100_000)  # its runner is gone: the allocation is an orphan to compensate
    registry = registry_of(Misbehaving(memory, {member: crash}), memory.envelope)
    report = await reconcile(journal, registry, clock, runner_tag="rt")
    assert report.failed, "the failure is reported, not raised"
    assert all("SandboxProviderFailed" in why for why in report.failed.values())


async def test_a_plugin_that_cannot_be_imported_is_unavailable_not_fatal(tmp_path: Path) -> None:
    config = tmp_path / "adapters.toml"
    config.write_text(
        '[[adapters]]\nfactory = "checkfu_no_such_module:create"\n\n'
        '[[adapters]]\nfactory = "checkfu.testing.memory:create"\n'
    )
    registry = await load_registry(entry_point_names=[], config=config)
    assert [a.envelope.provider for a in registry.adapters] == ["memory"]
    assert any("checkfu_no_such_module" in why for why in registry.unavailable.values())


def test_an_owner_that_renews_after_the_check_is_not_taken_over(tmp_path: Path) -> None:
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    store = LeaseStore(journal, clock, ttl=60)
    lease = store.acquire("run-1")
    clock.advance(120)
    assert store.reclaimable(lease.lease_id)  # reconciliation looks: expired ...
    store.renew(lease)  # ... and the owner, only slow, renews before the takeover lands
    with pytest.raises(SandboxLeaseFenced):
        store.takeover(lease.lease_id, only_if_reclaimable=True)
    store.renew(lease)  # the owner still holds its lease
    assert store.takeover(lease.lease_id).lease_epoch == lease.lease_epoch + 1  # a deliberate takeover still works


@pytest.mark.parametrize("member", ["listAllocations", "compensate"])
async def test_a_hanging_provider_cannot_hang_reconciliation(
    tmp_path: Path, member: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(DEFAULT_DEADLINES, member, 0.2)
    memory = MemoryProvider()
    clock = ManualClock()
    journal = Journal(sqlite_url(tmp_path / "journal.sqlite"))
    session = (
        Runner(registry_of(memory, memory.envelope), journal, runner_tag="rt", clock=clock)
        .start(memory.target, PROFILE, platform=AMD64)
        .session
    )
    await session.provision(PROFILE, AMD64, (await session.materialize(PROFILE, AMD64)).image)
    clock.advance(100_000)  # its runner is gone: the allocation is an orphan to compensate
    registry = registry_of(Misbehaving(memory, {member: hang}), memory.envelope)
    report = await asyncio.wait_for(reconcile(journal, registry, clock, runner_tag="rt"), timeout=10)
    assert any("SandboxProviderTimeout" in why for why in report.failed.values())
