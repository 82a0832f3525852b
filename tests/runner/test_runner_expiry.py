"""Snapshots that expire, on the memory provider: the stated expiry is checked and journaled, and whoever holds
custody deletes the snapshot once it passes (the runner through ``deleteSnapshot``, or the provider itself)."""

from __future__ import annotations

from typing import Any

import pytest

from checkfu.contract.errors import SandboxNotFound, SandboxResultInvalid
from checkfu.contract.model import format_timestamp, parse_timestamp
from checkfu.contract.vocabulary import Platform
from checkfu.core.expiry import sweep_expired_snapshots
from checkfu.core.journal import AllocationRow
from checkfu.core.reconcile import reconcile
from checkfu.core.registry import Registry
from checkfu.testing import Misbehaving, expiry_past_the_asked, memory_envelope, memory_profile

AMD64 = Platform(os="linux", architecture="amd64")
Rig = Any
RigFactory = Any

pytestmark = pytest.mark.anyio


async def _snapshot(rig: Rig, keep_seconds: int | None) -> Any:
    rig.profile = memory_profile("durable")
    session = rig.start()
    image = (await session.materialize(rig.profile, AMD64)).image
    inst = await session.provision(rig.profile, AMD64, image)
    await session.activate(inst)
    snap = await session.snapshot(inst, keep_seconds=keep_seconds)
    await session.release(inst)  # durable: the snapshot outlives the instance
    return session, snap


def _snapshots_held(rig: Rig) -> list[str]:
    return [h.allocation_key for h in rig.memory.live_objects() if h.kind == "snapshot"]


async def test_runner_custody_the_runner_deletes_an_expired_snapshot_through_delete_snapshot(rig: Rig) -> None:
    assert rig.envelope.snapshot_custody == "runner"
    asked_at = rig.clock.now()
    session, snap = await _snapshot(rig, keep_seconds=60)
    assert snap.expires_at == int(asked_at + 60)
    row = rig.journal.allocation(snap.allocation_key)
    assert row is not None and (row.state, row.expires_at) == ("live", snap.expires_at)

    report = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.nothing_to_do and _snapshots_held(rig) == [snap.allocation_key]  # not yet

    rig.clock.advance(61)
    rig.memory.calls.clear()
    report = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert (report.deleted, report.settled, report.failed, report.skipped) == ([snap.allocation_key], [], {}, {})
    assert rig.memory.calls == ["deleteSnapshot"]
    assert _snapshots_held(rig) == []  # nothing left
    row = rig.journal.allocation(snap.allocation_key)
    assert row is not None and row.state == "released"
    events = [e for e in rig.journal.events_for_run(session.run_id) if e.member == "deleteSnapshot"]
    assert [(e.allocation_key, e.outcome) for e in events] == [(snap.allocation_key, "ok")]
    again = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert again.nothing_to_do


async def test_a_snapshot_asked_no_lifetime_is_kept_until_deleted(rig: Rig) -> None:
    _, snap = await _snapshot(rig, keep_seconds=None)
    assert snap.expires_at is None
    rig.clock.advance(10 * 365 * 86400)
    report = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.nothing_to_do
    assert _snapshots_held(rig) == [snap.allocation_key]


async def test_provider_custody_the_provider_deletes_and_the_runner_only_settles_its_row(
    make_rig: RigFactory,
) -> None:
    envelope = memory_envelope().model_copy(update={"snapshot_custody": "provider"})
    rig = make_rig(envelope=envelope)
    _, snap = await _snapshot(rig, keep_seconds=30)
    rig.clock.advance(31)
    assert rig.memory.sweep_expired() == [snap.snapshot_id]  # the provider's own sweep (any call would do it)
    rig.memory.calls.clear()
    report = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert (report.deleted, report.settled) == ([], [snap.allocation_key])
    assert rig.memory.calls == []  # the runner asked the provider nothing: the bytes are the provider's to delete
    row = rig.journal.allocation(snap.allocation_key)
    assert row is not None and row.state == "released"
    assert _snapshots_held(rig) == []


async def test_provider_custody_the_provider_deletes_at_its_next_call(make_rig: RigFactory) -> None:
    rig = make_rig(envelope=memory_envelope().model_copy(update={"snapshot_custody": "provider"}))
    _, snap = await _snapshot(rig, keep_seconds=5)
    assert _snapshots_held(rig) == [snap.allocation_key]
    rig.clock.advance(6)
    await rig.memory.describe()
    assert _snapshots_held(rig) == []


async def test_a_provider_that_kept_an_expired_snapshot_in_its_custody_is_caught_by_reconciliation(
    make_rig: RigFactory,
) -> None:
    # The provider claims custody but never deletes: its row is settled by the sweep, then reconciliation's
    # enumeration finds the key still held and compensates it.
    rig = make_rig(envelope=memory_envelope().model_copy(update={"snapshot_custody": "provider"}))
    _, snap = await _snapshot(rig, keep_seconds=5)
    rig.clock.advance(6)
    # No provider call between: the memory provider never swept, as a forgetful provider would not.
    report = await sweep_expired_snapshots(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.settled == [snap.allocation_key]
    rig.clock.advance(100_000)
    done = await reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag)
    assert _snapshots_held(rig) == []
    assert done.left == {}


async def test_an_expired_snapshot_is_not_resumed(rig: Rig) -> None:
    rig.profile = memory_profile("durable")
    session = rig.start()
    image = (await session.materialize(rig.profile, AMD64)).image
    inst = await session.provision(rig.profile, AMD64, image)
    await session.activate(inst)
    snap = await session.snapshot(inst, keep_seconds=10)
    rig.clock.advance(11)
    rig.memory.calls.clear()
    with pytest.raises(SandboxNotFound) as caught:
        await session.resume(snap, rig.profile, AMD64, image)
    assert caught.value.field == "snapshot_id" and rig.memory.calls == []


async def test_an_expiry_later_than_asked_is_refused_and_the_snapshot_reclaimed(make_rig: RigFactory) -> None:
    rig = make_rig(wrap=lambda m: Misbehaving(m, {"snapshot": expiry_past_the_asked}))
    rig.profile = memory_profile("durable")
    session = rig.start()
    image = (await session.materialize(rig.profile, AMD64)).image
    inst = await session.provision(rig.profile, AMD64, image)
    await session.activate(inst)
    with pytest.raises(SandboxResultInvalid) as caught:
        await session.snapshot(inst, keep_seconds=60)
    assert caught.value.field == "expires_at"
    assert _snapshots_held(rig) == []  # compensated by its key
    rows = [r for r in rig.journal.allocations_for_run(session.run_id) if r.kind == "snapshot"]
    assert [r.state for r in rows] == ["compensated"]


async def test_a_sweep_that_finds_nothing_loads_no_adapter(rig: Rig) -> None:
    await _snapshot(rig, keep_seconds=60)

    async def load(rows: list[AllocationRow]) -> Registry:
        raise AssertionError("loaded adapters although nothing expired")

    report = await sweep_expired_snapshots(rig.journal, load, rig.clock, runner_tag=rig.runner.runner_tag)
    assert report.nothing_to_do


async def test_an_expired_snapshot_without_its_adapter_stays_until_one_is_loaded(rig: Rig) -> None:
    _, snap = await _snapshot(rig, keep_seconds=60)
    rig.clock.advance(61)
    report = await sweep_expired_snapshots(rig.journal, Registry(), rig.clock, runner_tag=rig.runner.runner_tag)
    assert list(report.skipped) == [snap.allocation_key]
    row = rig.journal.allocation(snap.allocation_key)
    assert row is not None and row.state == "live"


def test_timestamps_round_trip_to_the_whole_second() -> None:
    assert format_timestamp(1_796_767_542.9) == "2026-12-08T22:05:42Z"
    assert parse_timestamp("2026-12-08T22:05:42Z") == 1_796_767_542.0
    assert parse_timestamp("2026-12-08T22:05:42.25Z") == 1_796_767_542.25
    for bad in ("2027-02-29T00:00:00Z", "2026-12-08T22:05:42+00:00", "2026-12-08 22:05:42Z"):
        with pytest.raises(ValueError):
            parse_timestamp(bad)
