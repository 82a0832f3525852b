"""The warm pool's journal rules (issue 18), on the memory provider and a real SQLite or PostgreSQL journal.

Adoption is one compare-and-set: of many Runs that reach for one pooled sandbox at the same moment,
exactly one gets it, and its allocation row moves to that Run and its lease. The Docker tier's own
tests are in tests/cli/test_pool_docker.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from checkfu.contract.vocabulary import Platform
from checkfu.core.pool import adopt, drain, fill, ready
from checkfu.core.reconcile import reconcile

AMD64 = Platform(os="linux", architecture="amd64")
RigFactory = Any  # conftest's make_rig

THREADS = 8


def test_many_runs_reaching_for_one_pooled_sandbox_at_once_exactly_one_gets_it(
    make_rig: RigFactory, journal_url: str
) -> None:
    rig = make_rig(url=journal_url)
    [pooled] = asyncio.run(fill(rig.runner, rig.memory.target, rig.profile, AMD64, [], n=1, ttl=600))
    assert pooled.allocation_key in rig.held_keys()
    sessions = [rig.start() for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    got: list[Any] = [None] * THREADS

    def reach(i: int) -> None:
        barrier.wait()
        got[i] = adopt(sessions[i], rig.profile, [])

    threads = [threading.Thread(target=reach, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, inst in enumerate(got) if inst is not None]
    assert len(winners) == 1, got
    [w] = winners
    session, inst = sessions[w], got[w]
    assert inst.allocation_key == pooled.allocation_key and inst.state == "provisioning"
    row = rig.journal.allocation(pooled.allocation_key)
    assert row is not None
    assert (row.run_id, row.lease_id, row.state) == (session.run_id, session.lease.lease_id, "live")
    pool_run = rig.journal.run(pooled.run_id)
    assert pool_run is not None and pool_run.status == "adopted"
    assert ready(rig.journal, rig.runner.runner_tag, now=rig.clock.now()) == []

    async def use() -> None:
        await session.activate(inst)
        assert (await session.exec(inst, ["true"])).exit_code == 0
        await session.release(inst)

    asyncio.run(use())
    assert rig.held_keys() == set()
    for a in rig.attempts:
        rig.runner.finish(a, status="succeeded")


def test_an_expired_pooled_sandbox_is_not_adopted_and_reconcile_reclaims_it(
    make_rig: RigFactory, journal_url: str
) -> None:
    rig = make_rig(url=journal_url)
    [pooled] = asyncio.run(fill(rig.runner, rig.memory.target, rig.profile, AMD64, [], n=1, ttl=60))
    rig.clock.advance(61)
    session = rig.start()
    assert adopt(session, rig.profile, []) is None
    report = asyncio.run(reconcile(rig.journal, rig.registry, rig.clock, runner_tag=rig.runner.runner_tag))
    assert report.compensated == [pooled.allocation_key]
    assert rig.held_keys() == set()
    rig.runner.finish(rig.attempts[-1], status="succeeded")


def test_fill_tops_up_and_drain_releases_every_ready_one(make_rig: RigFactory, journal_url: str) -> None:
    rig = make_rig(url=journal_url)
    first = asyncio.run(fill(rig.runner, rig.memory.target, rig.profile, AMD64, ["/data"], n=2))
    again = asyncio.run(fill(rig.runner, rig.memory.target, rig.profile, AMD64, ["/data"], n=2))
    assert len(first) == 2 and again == []  # already full: nothing more is made
    session = rig.start(mount_count=1)
    assert adopt(session, rig.profile, []) is None  # another shape (no mounts) never adopts these
    drained = asyncio.run(drain(rig.journal, rig.registry, rig.runner.runner_tag, rig.runner))
    assert sorted(d.allocation_key for d in drained) == sorted(e.allocation_key for e in first)
    assert all(d.error is None for d in drained)
    assert rig.held_keys() == set()
    assert rig.journal.open_allocations(runner_tag=rig.runner.runner_tag) == []
    rig.runner.finish(rig.attempts[-1], status="succeeded")
